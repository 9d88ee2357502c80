"""Test-wide settings: nothing leaves the machine, and every test runs with the embedded defaults."""

import os
from pathlib import Path

import pytest

# Under pytest-xdist each worker gets its own Prefect home, so two ephemeral API servers never
# share one SQLite database (set before anything imports Prefect).
if worker := os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("PREFECT_HOME", str(Path.home() / ".prefect" / f"pytest-{worker}"))

from flows.cli import set_process_defaults  # noqa: E402

set_process_defaults()

# The test files that run whole pipelines load both cores. Two of them at once on the two xdist
# workers ran 2-3x slower each than one after the other, so `make test` sends them to one worker,
# first: the longest unit of work starts before the many short ones that fill the other worker.
CPU_PIPELINES = ("tests/integration/test_stack.py", "tests/e2e/test_pipeline_smoke.py",
                 "tests/e2e/test_dapo_resume.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The pipeline files first (a stable sort keeps every other file in collection order)."""
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in CPU_PIPELINES)


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadfile`, with the pipeline files as one unit and units in collection order."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class PipelinesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "cpu-pipelines" if scope in CPU_PIPELINES else scope

    config.option.loadscopereorder = False  # else units go by test count, the pipelines last
    return PipelinesTogether(config, log)


def pytest_unconfigure(config) -> None:
    """Prefect stops its ephemeral servers at interpreter exit and logs that to the stream its
    console handler captured, which pytest has closed by then: Python's logging would print a
    `--- Logging error ---` traceback for a line nobody can read. Only that is silenced."""
    import logging

    logging.raiseExceptions = False
