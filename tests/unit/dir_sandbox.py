"""A Sandbox on a host directory, for unit tests of the tools and SWEEnv without Docker.

It honours the protocol's contract where the tools depend on it: the work tree is `workdir`, the
shell's directory persists between `exec` calls, missing files raise FileNotFoundError, commands
time out, and `diff()` includes new files. It is not isolated: tests only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from environments.records import ExecResult
from environments.sandbox import SandboxDead


class DirSandbox:
    def __init__(self, root: Path, files: dict[str, str] | None = None):
        self.root = Path(root)
        self.workdir = str(self.root)
        self._cwd = self.workdir
        self._alive = True
        self.closed = False
        for name, text in (files or {}).items():
            p = self.root / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        git = ["git", "-C", self.workdir, "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run(["git", "init", "-q", self.workdir], check=True)
        subprocess.run(git + ["add", "-A"], check=True)
        subprocess.run(git + ["commit", "-q", "--allow-empty", "-m", "base"], check=True)

    @property
    def alive(self) -> bool:
        return self._alive

    def kill(self) -> None:
        self._alive = False

    def exec(self, cmd: str, timeout: float | None = None) -> ExecResult:
        if not self._alive:
            raise SandboxDead("sandbox is gone")
        cwd_file = self.root.parent / f".{self.root.name}.cwd"
        script = f"cd {self._cwd!r} 2>/dev/null\n{cmd}\n__rc=$?\npwd > {str(cwd_file)!r}\nexit $__rc\n"
        t0 = time.monotonic()
        proc = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return ExecResult(-1, out, timed_out=True, duration_s=time.monotonic() - t0)
        if cwd_file.exists():
            self._cwd = cwd_file.read_text().strip() or self._cwd
        return ExecResult(proc.returncode, out, duration_s=time.monotonic() - t0)

    def run(self, cmd: str, timeout: float | None = None) -> ExecResult:
        res = subprocess.run(["bash", "-c", cmd], cwd=self.workdir, capture_output=True, text=True, timeout=timeout)
        return ExecResult(res.returncode, res.stdout + res.stderr)

    def read_file(self, path: str) -> str:
        return Path(path).read_text()

    def write_file(self, path: str, content: str | bytes) -> None:
        if isinstance(content, bytes):
            Path(path).write_bytes(content)
        else:
            Path(path).write_text(content)

    def diff(self) -> str:
        subprocess.run(["git", "-C", self.workdir, "add", "-A"], check=True)
        return subprocess.run(["git", "-C", self.workdir, "diff", "--cached", "HEAD"], check=True,
                              capture_output=True, text=True).stdout

    def close(self) -> None:
        self.closed = True
        self._alive = False

    def __enter__(self) -> "DirSandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
