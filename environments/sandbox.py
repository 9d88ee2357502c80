"""The sandbox interface: one isolated work tree (`workdir`, `/testbed` in containers) in which
commands run, plus the lifecycle every backend shares.

Backends: `docker` (the default; real containers, no network, non-root, limits) and `local`
(a process in a scratch copy, for machines without Docker). Both keep one shell session per
sandbox, so state such as the current directory persists between commands as in SWE-agent,
while the timeout and output cap still apply to each command (see shell_session.py).

Backends also offer `run(cmd, timeout, cap_bytes=None)` (a larger default cap, for test logs)
and `read_bytes(path)`; `SandboxError` means infrastructure, never a verdict on the agent.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

from environments.records import ExecResult

if TYPE_CHECKING:
    from swerl.config import EnvironmentConfig

WORKDIR = "/testbed"
# Every test run (synthesis, validation, grading) hashes strings the same way. pytest names a
# parameter it cannot print by its position (`expected17`), and a parametrize list built from a
# set is ordered by string hash: under a random seed the same case gets another id in every run,
# and a task's PASS_TO_PASS names ids that the grader never sees again (isodate 0.7.2: every
# task unresolvable, gold patch included).
TEST_ENV = {"PYTHONHASHSEED": "0"}


def run_env_prefix() -> str:
    """`K=V ...` to put before a test command."""
    return " ".join(f"{k}={v}" for k, v in TEST_ENV.items())


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


# ----------------------------------------------------------------------------- lifecycle
# Every open sandbox is tracked so that any way out of the process (exception, Ctrl-C, SIGTERM,
# normal exit) closes it. Containers also carry this process's session label, so whatever slips
# past (a KeyboardInterrupt between "create" and "track") is swept by label at exit, and
# `cleanup_leaked()` finds what a SIGKILLed process left behind.

_SESSION = [uuid.uuid4().hex[:12]]
_LIVE: dict[int, Sandbox] = {}
_LIVE_LOCK = threading.Lock()
_EXIT_HOOKS: list[Callable[[], None]] = []
_handlers_installed = False
_sigterm_installed = False


def session_id() -> str:
    """This process's label value `swerl.session` (a forked child gets its own)."""
    return _SESSION[0]


def _proc_start_ticks(pid: int) -> str:
    """A process's start time (clock ticks since boot): tells a reused pid from its owner."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def owner_label(pid: int | None = None) -> str:
    """`host:pid:start` of a process (default: this one), stamped on what a sandbox leaves on
    the machine."""
    pid = pid or os.getpid()
    return f"{socket.gethostname()}:{pid}:{_proc_start_ticks(pid)}"


def owner_gone(owner: str) -> bool:
    """True when `owner` (see owner_label) names a process of this host that no longer runs."""
    host, _, rest = owner.partition(":")
    pid, _, ticks = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another machine's (or container's) sandbox: not ours to judge
    return _proc_start_ticks(int(pid)) != ticks


def process_started_at(pid: int | None = None) -> float:
    """Wall-clock start time of a process (default: this one), from /proc."""
    ticks = int(_proc_start_ticks(pid or os.getpid()) or 0)
    with open("/proc/uptime") as fh:
        uptime = float(fh.read().split()[0])
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def track(sandbox: Sandbox) -> None:
    install_exit_handlers()
    with _LIVE_LOCK:
        _LIVE[id(sandbox)] = sandbox


def untrack(sandbox: Sandbox) -> None:
    with _LIVE_LOCK:
        _LIVE.pop(id(sandbox), None)


def on_exit(hook: Callable[[], None]) -> None:
    """Run `hook` at interpreter exit after open sandboxes are closed (e.g. a label sweep)."""
    if hook not in _EXIT_HOOKS:
        _EXIT_HOOKS.append(hook)


def close_all() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE.values())
    for sb in live:
        sb.close()
    for hook in _EXIT_HOOKS:
        try:
            hook()
        except Exception:
            pass


def _at_exit() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut cleanup short
    close_all()


def _on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds `with` blocks, then atexit runs close_all()


def install_exit_handlers() -> None:
    """atexit once; the SIGTERM handler from the main thread only (Python's rule), so a process
    whose sandboxes are all started by worker threads (the rollout engine) must call this from
    its main thread first, or SIGTERM kills it with every sandbox left running."""
    global _handlers_installed, _sigterm_installed
    if not _handlers_installed:
        _handlers_installed = True
        atexit.register(_at_exit)
    # only take SIGTERM over when nobody else did (Prefect, a server): their handler wins
    if (not _sigterm_installed and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):
        signal.signal(signal.SIGTERM, _on_sigterm)
        _sigterm_installed = True


def _forget_parent_sandboxes() -> None:
    """A forked child must neither close its parent's sandboxes nor sweep its session label."""
    _SESSION[0] = uuid.uuid4().hex[:12]
    _LIVE.clear()
    _EXIT_HOOKS.clear()


os.register_at_fork(after_in_child=_forget_parent_sandboxes)


# ----------------------------------------------------------------------------- entry points


def open_sandbox(image: str, cfg: "EnvironmentConfig", **kw: Any) -> Sandbox:
    """Start a sandbox of `image` with the backend `cfg.sandbox` names.

    For `docker`, `image` is an image ref; for `local`, a host directory holding the repo (it is
    copied, never modified). Keyword arguments go to the backend (e.g. `user=`, `workdir=`).
    """
    if cfg.sandbox == "docker":
        from environments.docker_sandbox import DockerSandbox

        return DockerSandbox(image, cfg, **kw)
    if cfg.sandbox == "local":
        from environments.local_sandbox import LocalSandbox

        return LocalSandbox(image, cfg, **kw)
    raise ValueError(f"unknown sandbox backend {cfg.sandbox!r}")


def cleanup_leaked(session: str | None = None, older_than_process: bool = False) -> list[str]:
    """Remove leftovers of sandboxes whose owner is gone; returns what was removed.

    By default: containers labelled `swerl` whose owning process (same host) no longer runs, and
    the scratch directories of dead local sandboxes. `session=` removes that session's containers
    whatever their owner's state. `older_than_process=True` also removes every swerl container
    created before this process started: only safe when nobody else runs swerl on this Docker.
    """
    from environments.docker_sandbox import remove_leaked_containers
    from environments.local_sandbox import remove_leaked_scratch

    return remove_leaked_containers(session, older_than_process) + remove_leaked_scratch()
