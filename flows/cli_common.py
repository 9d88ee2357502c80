"""What the `swerl` commands share: the config and run arguments, and small helpers that more
than one command group uses."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from typing import Any

from swerl.config import SwerlConfig, load_config

Handler = Callable[[argparse.Namespace], int]
SubParsers = Any  # what ArgumentParser.add_subparsers returns (argparse keeps its class private)


def load_cli_config(args: argparse.Namespace) -> SwerlConfig:
    """The config that `--preset` and `--set` name."""
    return load_config(args.preset, args.set)


def add_config_args(p: argparse.ArgumentParser, default: str = "smoke") -> None:
    p.add_argument("--preset", default=default, help="preset name in configs/ or a YAML path")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set dapo.stages.0.eps_high=0.3")


def add_run_args(p: argparse.ArgumentParser, default_preset: str = "smoke") -> None:
    add_config_args(p, default_preset)
    p.add_argument("--run-id", help="the run to resume (default: derived from the resolved config)")
    p.add_argument("--fresh", action="store_true", help="start a new run instead of resuming")


def flow_kwargs(args: argparse.Namespace) -> dict:
    """The preset, overrides and run id a flow takes; `--fresh` names a new run."""
    run_id = args.run_id
    if getattr(args, "fresh", False) and not run_id:
        import time

        from training.run import default_run_id

        run_id = f"{default_run_id(load_cli_config(args))}-{time.strftime('%Y%m%d-%H%M%S')}"
    return {"preset": args.preset, "overrides": list(args.set), "run_id": run_id}


def where(store: Any, key: str) -> str:
    """A store object as people reach it: a local path for a file:// store, else its URL."""
    local = store.local_path(key)
    return str(local) if local is not None else store.url(key)


def tasks_with_images(path: str) -> list:
    """Load a tasks file (reporting bad lines) and give every task its image; a task that can
    get none keeps `image` empty and the reason in its meta (`TaskInstance.no_image_reason`)."""
    from environments.images import build_images
    from environments.records import IMAGE_ERROR, load_tasks

    report = load_tasks(path)
    for err in report.errors:
        print(f"swerl: skipping malformed task: {err}", file=sys.stderr)
    got = build_images(report.tasks)
    for t in report.tasks:
        t.image = got.images.get(t.instance_id, "")
        if t.instance_id in got.errors:
            t.meta[IMAGE_ERROR] = got.errors[t.instance_id]
            print(f"swerl: {t.instance_id}: {got.errors[t.instance_id]}", file=sys.stderr)
    return report.tasks


def expected_errors() -> tuple[type[BaseException], ...]:
    """What bad input or an unavailable machine raises: a message for the user, not a bug."""
    from environments.base_image import ImageBuildError
    from environments.curation.curate import CurationError
    from environments.sandbox import SandboxError
    from swerl.model_cache import ModelResolutionError
    from swerl.store import StoreUnavailable

    return (OSError, ValueError, ImageBuildError, SandboxError, StoreUnavailable, CurationError,
            ModelResolutionError)


def one_line(e: BaseException) -> str:
    """An exception as one line: its first non-empty line of text, or its type."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def one_line_errors(handler: Handler) -> Handler:
    """Run a command so that an expected error prints `swerl: <one line>` and exits 2, with no
    traceback (ConfigError is a ValueError: the same)."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except expected_errors() as e:
            print(f"swerl: {one_line(e)}", file=sys.stderr)
            return 2

    return run
