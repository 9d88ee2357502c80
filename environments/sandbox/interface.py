"""What every sandbox is: the `Sandbox` protocol, its errors and the test-run environment.

A sandbox is one isolated work tree (`workdir`, `/testbed` in containers) in which commands run.
`SandboxError` means infrastructure, never a verdict on the agent; `DiffTooLarge` is the
agent's doing. Nothing here imports the backends: they build on this module.
"""

from __future__ import annotations

import re
from typing import Protocol, runtime_checkable

from environments.records import ExecResult

WORKDIR = "/testbed"
# Every test run (synthesis, validation, grading) hashes strings the same way: pytest names a
# parameter it cannot print by its position, and a parametrize list built from a set is ordered
# by string hash, so under a random seed the same case gets another id in every run.
# Nor do they read a user site-packages or write bytecode the next run would load.
TEST_ENV = {"PYTHONHASHSEED": "0", "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"}


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str) -> int:
    """Docker-style sizes: "512m", "1g", "1.5GB", "1024"."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?)b?", text.strip().lower())
    if not m:
        raise ValueError(f"bad size {text!r}")
    return int(float(m[1]) * _UNITS[m[2]])


def run_env_prefix() -> str:
    """`K=V ...` to put before a test command."""
    return " ".join(f"{k}={v}" for k, v in TEST_ENV.items())


class SandboxError(RuntimeError):
    """Infrastructure failure (not the agent's fault): retried or reported, never rewarded."""


class SandboxDead(SandboxError):
    """The sandbox (container or process) is gone; its episode ends with status error."""


class DiffTooLarge(ValueError):
    """The agent's changes produce a patch too large to keep: the agent's doing, not infra."""


class DiffFailed(ValueError):
    """The agent's work tree cannot be diffed (a full disk, unreadable files...): its doing."""


class FileRefused(OSError):
    """read_file / write_file failed in a live sandbox because of what the agent did there:
    a tool error shown to the agent, never an infrastructure error."""


class NotRegularFile(FileRefused):
    """A FIFO, device or socket: refused before it is opened (it could block or never end)."""


class UnreadableFile(FileRefused):
    """A regular file that cannot be read (e.g. /proc/self/mem) or is too large."""


class UnwritableFile(FileRefused):
    """A write that failed (a full disk, a broken tree)."""


@runtime_checkable
class Sandbox(Protocol):
    workdir: str

    @property
    def alive(self) -> bool: ...

    def exec(self, cmd: str, timeout: float | None = None) -> ExecResult:
        """Run `cmd` in the sandbox's persistent shell session (cwd and env persist)."""

    def run(self, cmd: str, timeout: float | None = None) -> ExecResult:
        """Run `cmd` in a fresh shell in `workdir` (no session state); used by grading."""

    def read_file(self, path: str) -> str: ...

    def write_file(self, path: str, content: str | bytes) -> None: ...

    def diff(self) -> str:
        """`git diff` of the work tree against the base commit, new files included."""

    def close(self) -> None:
        """Remove the container/process. Idempotent; never raises."""

    def __enter__(self) -> "Sandbox": ...

    def __exit__(self, *exc: object) -> None: ...
