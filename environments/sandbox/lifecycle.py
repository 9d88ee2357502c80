"""Every open sandbox is tracked, so that any way out of the process closes it.

An exception, Ctrl-C, SIGTERM or a normal exit all run `close_all()`. Containers also carry this
process's session label and an owner label (`host:pid:start`), so whatever slips past (an
interrupt between "create" and "track") is swept by label at exit, and `cleanup_leaked()` finds
what a SIGKILLed process left behind.
"""

from __future__ import annotations

import _thread
import atexit
import os
import signal
import socket
import sys
import threading
import time
import uuid
from typing import Any, Callable

from environments.sandbox.interface import Sandbox

_SESSION = [uuid.uuid4().hex[:12]]
_LIVE: dict[int, Sandbox] = {}
_LIVE_LOCK = threading.Lock()
_EXIT_HOOKS: list[Callable[[], None]] = []
_handlers_installed = False
_sigterm_installed = False
_exiting = False  # atexit cleanup has begun


def session_id() -> str:
    """This process's label value `swerl.session` (a forked child gets its own)."""
    return _SESSION[0]


def proc_start_ticks(pid: int) -> str:
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
    return f"{socket.gethostname()}:{pid}:{proc_start_ticks(pid)}"


def owner_gone(owner: str) -> bool:
    """True when `owner` (see owner_label) names a process of this host that no longer runs."""
    host, _, rest = owner.partition(":")
    pid, _, ticks = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another machine's (or container's) sandbox: not ours to judge
    return proc_start_ticks(int(pid)) != ticks


def process_started_at(pid: int | None = None) -> float:
    """Wall-clock start time of a process (default: this one), from /proc."""
    ticks = int(proc_start_ticks(pid or os.getpid()) or 0)
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
    global _exiting
    _exiting = True
    if threading.current_thread() is threading.main_thread():
        # a second Ctrl-C or SIGTERM must not cut cleanup short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    close_all()


def _on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds `with` blocks, then atexit runs close_all()


def _signal_of(exc: BaseException | None) -> int | None:
    """The signal a handler's exception stands for: Ctrl-C, our SIGTERM exit, Prefect's bridge."""
    if isinstance(exc, KeyboardInterrupt):
        return signal.SIGINT
    if isinstance(exc, SystemExit) and exc.code == 128 + signal.SIGTERM:
        return signal.SIGTERM
    sig = getattr(exc, "signal", None)  # prefect.exceptions.TerminationSignal
    return sig if isinstance(sig, int) else None


def _redeliver_swallowed_signal(unraisable: Any) -> None:
    """A handler's exception raised while a finalizer (`__del__`, a weakref callback) runs is
    printed and dropped by Python, and the process would run on as if never signalled (seen: a
    SIGTERM during a sandbox-heavy load went unheard). Send the signal again a moment later from a
    bare thread, once this hook has returned (sent from here, its handler would run in here). Not
    once the process is exiting: atexit callbacks report through this hook too, and the signal
    would cut our own cleanup short. Inside a finalizer, so: no locks (threading.Thread takes
    one), and the note goes straight to fd 2 (the finalizer may have interrupted a stderr write)."""
    sig = _signal_of(unraisable.exc_value)
    exiting = _exiting or sys.is_finalizing() or "atexit" in (unraisable.err_msg or "")
    if sig is None or exiting or threading.current_thread() is not threading.main_thread():
        _previous_unraisablehook(unraisable)
        return
    _thread.start_new_thread(_send_later, (sig, 0.2))
    where = unraisable.err_msg or "Exception ignored in"
    os.write(2, f"swerl: signal {sig} dropped ({where} {unraisable.object!r:.80}); sending it again\n".encode())


def _send_later(sig: int, delay: float) -> None:
    time.sleep(delay)
    os.kill(os.getpid(), sig)


_previous_unraisablehook: Callable[[Any], None] = sys.__unraisablehook__


def install_exit_handlers() -> None:
    """atexit once; the SIGTERM handler from the main thread only (Python's rule), so a process
    whose sandboxes are all started by worker threads (the rollout engine) must call this from
    its main thread first, or SIGTERM kills it with every sandbox left running."""
    global _handlers_installed, _sigterm_installed, _previous_unraisablehook
    if not _handlers_installed:
        _handlers_installed = True
        atexit.register(_at_exit)
        _previous_unraisablehook, sys.unraisablehook = sys.unraisablehook, _redeliver_swallowed_signal
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
