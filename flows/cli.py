"""The `swerl` command line. Each sub-command is a thin call into a library function.

Heavy imports (torch, prefect, mlflow) happen inside the commands, so `swerl config show`
answers instantly.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from swerl.config import ConfigError, SwerlConfig, dump_config, load_config

Handler = Callable[[argparse.Namespace], int]


def _config(args: argparse.Namespace) -> SwerlConfig:
    return load_config(args.preset, args.set)


def _add_config_args(p: argparse.ArgumentParser, default: str = "smoke") -> None:
    p.add_argument("--preset", default=default, help="preset name in configs/ or a YAML path")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set dapo.stages.0.eps_high=0.3")


# ---------------------------------------------------------------- commands
def cmd_config_show(args: argparse.Namespace) -> int:
    print(dump_config(_config(args)), end="")
    return 0


def cmd_setup(args: argparse.Namespace) -> int:
    """Everything a run needs that is not a Python package: base image, default model."""
    import time

    from environments.base_image import ensure_base_image
    from swerl.model_cache import ensure_default_model

    t0 = time.time()
    print(f"[setup] base image: {ensure_base_image()}")
    print(f"[setup] default model: {ensure_default_model()}")
    print(f"[setup] done in {time.time() - t0:.1f}s")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from flows.doctor import doctor

    return doctor(_config(args))


# ---------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="swerl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("config", help="inspect configuration")
    csub = p.add_subparsers(dest="config_command", required=True)
    show = csub.add_parser("show", help="print the resolved config of a preset")
    _add_config_args(show)
    show.set_defaults(func=cmd_config_show)

    p = sub.add_parser("setup", help="build the sandbox base image and cache the default model")
    p.set_defaults(func=cmd_setup)

    p = sub.add_parser("doctor", help="check docker, images, model, store, MLflow, Prefect, GPU, disk")
    _add_config_args(p)
    p.set_defaults(func=cmd_doctor)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"swerl: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("swerl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
