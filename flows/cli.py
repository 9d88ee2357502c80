"""The `swerl` command line. Each sub-command is a thin call into a library function.

This module assembles the parser and runs a command; the commands live by job in
flows/cli_ops.py (machine and stack), flows/cli_runs.py (pipeline runs) and flows/cli_data.py
(tasks and datasets). Heavy imports (torch, prefect, mlflow) happen inside the commands, so
`swerl config show` answers instantly.
"""

from __future__ import annotations

import argparse
import os
import sys

from flows import cli_data, cli_ops, cli_runs
from flows.cli_common import expected_errors, one_line
from swerl.config import ConfigError

# in `swerl --help` order
COMMANDS = [
    cli_ops.add_config, cli_ops.add_setup, cli_ops.add_doctor,
    cli_runs.add_rollout, cli_runs.add_pipeline, cli_runs.add_rft, cli_runs.add_dapo, cli_runs.add_evaluate,
    cli_data.add_grade, cli_data.add_env, cli_ops.add_bench,
    cli_runs.add_promote, cli_runs.add_report, cli_ops.add_deploy,
    cli_data.add_curate, cli_data.add_dataset, cli_data.add_validate,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="swerl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for add_command in COMMANDS:
        add_command(sub)
    return parser


def set_process_defaults() -> None:
    """Environment defaults for every swerl process (the user's environment wins); the tests
    call it too, so they run as the CLI does."""
    import os

    # nothing leaves the machine: Prefect's ephemeral server would otherwise send telemetry
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # the ephemeral API's first start compiles its modules and migrates a new database: slow on
    # a small machine (docs/history/orchestration.md)
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


def main(argv: list[str] | None = None) -> int:
    set_process_defaults()
    args = build_parser().parse_args(argv)
    # ours before Prefect's, so that a SIGTERM Prefect re-sends still closes our sandboxes
    from environments.sandbox import install_exit_handlers

    install_exit_handlers()
    try:
        return int(args.func(args) or 0)
    except expected_errors() as e:  # bad input or an unavailable machine: one line, no traceback
        if os.environ.get("SWERL_DEBUG"):
            raise
        # a config error lists every bad key, one per line; anything else is one line
        print(f"swerl: {e if isinstance(e, ConfigError) else one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("swerl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
