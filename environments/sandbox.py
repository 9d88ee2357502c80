"""The sandbox interface: one isolated work tree (`/testbed`) in which commands run.

Backends: `docker` (the default; real containers, no network, non-root, limits) and `local`
(a process in a scratch copy, for machines without Docker). Both keep one shell session per
sandbox, so state such as the current directory persists between commands as in SWE-agent,
while the timeout and output cap still apply to each command.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from environments.records import ExecResult

WORKDIR = "/testbed"


class SandboxError(RuntimeError):
    """Infrastructure failure (not the agent's fault): retried or reported, never rewarded."""


class SandboxDead(SandboxError):
    """The sandbox (container or process) is gone; its episode ends with status error."""


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
