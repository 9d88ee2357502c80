"""Local backend: a scratch copy of a host directory and a persistent bash, for machines
without Docker.

The "image" is a host directory holding the repo; it is copied, never touched. With bubblewrap
(`bwrap`) the shell sees the host read-only, a private /tmp, no network, its own pid namespace
(so `kill -9 -1` reaches only the sandbox) and no capabilities; only the scratch copy is
writable, and it is mounted at its host path, which is the sandbox's `workdir`. Without bwrap it
is a plain child process and a warning says so: fine for trusted commands, not for hostile ones.

Limits here are best effort (rlimits: file size, address space); CPU and process-count limits
need cgroups, i.e. the docker backend. The environment is minimal, so host secrets in
environment variables do not leak into the sandbox.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from functools import lru_cache
from pathlib import Path

import environments.sandbox.lifecycle as lifecycle
from environments.sandbox.interface import SandboxError, parse_size
from environments.sandbox.lifecycle import owner_gone
from environments.sandbox.shell_session import (
    Outcome,
    OutputCap,
    PipeTransport,
    ShellSandbox,
    ShellSession,
    read_to_eof,
    timeout_argv,
)
from swerl.config import EnvironmentConfig

SCRATCH_PREFIX = "swerl-local-"
MAX_FILE_BYTES = 2 << 30
HOST_GRACE_S = 15.0
@lru_cache(maxsize=1)
def bwrap_works() -> bool:
    """bwrap exists and may create namespaces here (it cannot inside many containers)."""
    if not shutil.which("bwrap"):
        return False
    probe = subprocess.run(
        ["bwrap", "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "true"],
        capture_output=True,
    )
    return probe.returncode == 0


def kill_ns_session(pidns: str, sid: int, *, leader: bool) -> None:
    """SIGKILL the processes of session `sid` (numbered inside pid namespace `pidns`), except
    the leader unless `leader`; from the host, via /proc (NSpid/NSsid give in-namespace ids)."""
    for _ in range(5):  # killed parents' children may still be forking
        found = False
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                if os.readlink(f"/proc/{entry.name}/ns/pid") != pidns:
                    continue
                with open(f"/proc/{entry.name}/status") as fh:
                    fields = dict(line.split(":", 1) for line in fh if ":" in line)
                nspid, nssid = int(fields["NSpid"].split()[-1]), int(fields["NSsid"].split()[-1])
                if nssid == sid and (leader or nspid != sid):
                    os.kill(int(entry.name), signal.SIGKILL)
                    found = True
            except (OSError, KeyError, ValueError):
                continue
        if not found:
            return


class LocalSandbox(ShellSandbox):
    """A scratch copy of directory `image` with a persistent shell (see the module docstring)."""

    def __init__(self, image: str, cfg: EnvironmentConfig, *, isolate: bool | None = None,
                 snapshot_git: bool = True) -> None:
        source = Path(image)
        if not source.is_dir():
            raise SandboxError(f"local sandbox: {image} is not a directory")
        self.isolated = bwrap_works() if isolate is None else isolate
        if self.isolated and not bwrap_works():
            raise SandboxError("local sandbox: isolation requested but bwrap cannot run here")
        if not self.isolated:
            warnings.warn("local sandbox without bwrap: commands run unisolated on the host",
                          RuntimeWarning, stacklevel=2)
        owner = lifecycle.owner_label().replace(":", "_")  # read back by remove_leaked_scratch
        self.scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{owner}-"))
        self.workdir = str(self.scratch / "testbed")
        self.command_timeout_s = cfg.command_timeout_s
        self.test_timeout_s = cfg.test_timeout_s
        self.output_cap_bytes = cfg.output_cap_bytes
        self.limits = f"ulimit -f {MAX_FILE_BYTES // 1024} -v {parse_size(cfg.memory) // 1024}"
        super().__init__()
        lifecycle.track(self)
        try:
            shutil.copytree(source, self.workdir, symlinks=True)
            if snapshot_git and (source / ".git").is_dir():  # diff() reads it; bwrap mounts it read-only
                shutil.copytree(source / ".git", self.scratch / "git", symlinks=True)
                self.pristine_git = str(self.scratch / "git")
            (self.scratch / "home").mkdir()
            self._start_session()
        except BaseException as e:
            self.close()
            if isinstance(e, OSError):
                raise SandboxError(f"cannot start a local sandbox of {image}: {e}") from e
            raise

    # ---------------------------------------------------------------------------- processes
    def _env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.scratch / "home"),
                "LANG": "C.UTF-8", "TERM": "dumb"}

    def _argv(self, cmd: list[str], info_fd: int | None = None) -> list[str]:
        if not self.isolated:
            return cmd
        s = str(self.scratch)
        argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
                "--bind", s, s, *(["--ro-bind", self.pristine_git, self.pristine_git] if self.pristine_git else []),
                "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                "--cap-drop", "ALL", "--die-with-parent", "--chdir", self.workdir]
        if info_fd is not None:
            argv += ["--info-fd", str(info_fd)]
        return argv + ["setsid"] + cmd  # setsid: the shell leads its own session (see interrupt)

    def _spawn(self, cmd: list[str], *, stdin: bool) -> tuple[subprocess.Popen, str]:
        """Start `cmd` in the sandbox; returns the process and its pid namespace (for kills)."""
        read_fd, write_fd = os.pipe() if self.isolated else (-1, -1)
        try:
            proc = subprocess.Popen(
                self._argv(cmd, write_fd if self.isolated else None), cwd=self.workdir, env=self._env(),
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True,
                pass_fds=(write_fd,) if self.isolated else (),
            )
        finally:
            if self.isolated:
                os.close(write_fd)
        if not self.isolated:
            return proc, os.readlink("/proc/self/ns/pid")
        with os.fdopen(read_fd) as info:  # bwrap writes it once the namespaces exist
            text = info.read()
        try:
            child = json.loads(text)["child-pid"]
            return proc, os.readlink(f"/proc/{child}/ns/pid")
        except (ValueError, KeyError, OSError) as e:
            proc.kill()
            proc.wait()
            raise SandboxError(f"bwrap did not start: {text!r} {e}") from e

    # ---------------------------------------------------------------------------- hooks
    def _open_session(self, cwd: str) -> ShellSession:
        proc, pidns = self._spawn(["bash", "--noprofile", "--norc"], stdin=True)
        assert proc.stdin is not None and proc.stdout is not None
        transport = PipeTransport(os.dup(proc.stdin.fileno()), os.dup(proc.stdout.fileno()))
        proc.stdin.close()
        proc.stdout.close()
        session = ShellSession(transport, lambda pid: self._kill_members(session, leader=False))
        session.handle = (proc, pidns)
        try:
            session.start(cwd, setup=self.limits)
        except BaseException:
            self._kill_session(session)
            transport.close()
            raise
        return session

    def _kill_members(self, session: ShellSession, *, leader: bool) -> None:
        """Kill the shell's session (pids may be reused once our processes are gone: guard)."""
        proc, pidns = session.handle
        running = proc.poll() is None
        if session.pid <= 0 or (self.isolated and not running):
            return  # with bwrap, a finished process means its whole pid namespace is gone
        # unisolated: a dead shell's pid is only still ours while members hold it as their sid
        kill_ns_session(pidns, session.pid, leader=leader and running)

    def _kill_session(self, session: ShellSession) -> None:
        self._kill_members(session, leader=True)
        _kill_group(session.handle[0])

    def _reset(self) -> str | None:
        """Nothing outlives its session here: with bwrap the pid namespace dies with it."""

    def _run(self, cmd: str, timeout: float, cap_bytes: int) -> Outcome:
        t0 = time.monotonic()
        proc, _ = self._spawn(timeout_argv(f"{self.limits}\n{cmd}", timeout), stdin=False)
        assert proc.stdout is not None
        transport = PipeTransport(None, os.dup(proc.stdout.fileno()))
        proc.stdout.close()
        cap = OutputCap(cap_bytes)
        try:
            finished = read_to_eof(transport, cap, t0 + timeout + HOST_GRACE_S)
        finally:
            transport.close()
            if not finished:
                _kill_group(proc)
        return ShellSession.one_shot(cap, finished, proc.wait(), t0, timeout)

    @property
    def alive(self) -> bool:
        return not self._closed and Path(self.workdir).is_dir()

    def _destroy(self, session: ShellSession | None) -> None:
        lifecycle.untrack(self)
        if session is not None:
            self._kill_session(session)
        shutil.rmtree(self.scratch, ignore_errors=True)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def remove_leaked_scratch() -> list[str]:
    """Scratch copies whose owning process is gone (e.g. it was SIGKILLed)."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*"):
        owner = path.name[len(SCRATCH_PREFIX):].rpartition("-")[0]
        parts = owner.rsplit("_", 2)
        if len(parts) == 3 and owner_gone(":".join(parts)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed
