"""A real MLflow tracking server for tests, on a free loopback port, that can crash and come back.

    with mlflow_server() as srv:       # srv.url = http://127.0.0.1:PORT
        srv.stop()                      # the backend goes away (process group killed)
        srv.start()                     # same port, same SQLite file: the data is still there
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.s3server import free_ports


class MlflowServer:
    def __init__(self, root: Path, artifact_root: str | None = None) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        (self.port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self.backend_uri = f"sqlite:///{root / 'mlflow.db'}"
        self.artifact_root = artifact_root or f"file://{root / 'artifacts'}"
        self.log_path = root / "mlflow-server.log"
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        return [sys.executable, "-m", "mlflow", "server",
                "--backend-store-uri", self.backend_uri,
                "--default-artifact-root", self.artifact_root,
                "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 120.0) -> None:
        """Start and wait for /health (the first start also migrates the database: seconds)."""
        if self.running:
            return
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running:
                code = self.proc.returncode
                self.proc = None
                raise RuntimeError(f"mlflow server exited with {code}; log:\n{self.tail_log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise TimeoutError(f"mlflow server not healthy after {timeout:.0f}s; log:\n{self.tail_log()}")

    def stop(self) -> None:
        """Kill the whole process group (the CLI, uvicorn and the job runner), like a crash."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: pgid == pid
            self.proc.wait(timeout=30)
        self.proc = None

    def tail_log(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return "(no log)"


@contextmanager
def mlflow_server(root: str | Path | None = None, artifact_root: str | None = None) -> Iterator[MlflowServer]:
    own = root is None
    path = Path(tempfile.mkdtemp(prefix="swerl-mlflow-")) if own else Path(root)
    server = MlflowServer(path, artifact_root)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        if own:
            shutil.rmtree(path, ignore_errors=True)
