"""Test-wide settings: nothing leaves the machine, and every test runs with the embedded defaults."""

import os
from pathlib import Path

# Under pytest-xdist each worker gets its own Prefect home, so two ephemeral API servers never
# share one SQLite database (set before anything imports Prefect).
if worker := os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("PREFECT_HOME", str(Path.home() / ".prefect" / f"pytest-{worker}"))

from flows.cli import set_process_defaults  # noqa: E402

set_process_defaults()


def pytest_unconfigure(config) -> None:
    """Prefect stops its ephemeral servers at interpreter exit and logs that to the stream its
    console handler captured, which pytest has closed by then: Python's logging would print a
    `--- Logging error ---` traceback for a line nobody can read. Only that is silenced."""
    import logging

    logging.raiseExceptions = False
