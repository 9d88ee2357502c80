"""A checkpoint upload survives a 60 s S3 outage, once through the store's own retry window and
once through Prefect's task retries (the store's window being too short to ride it out).

The SeaweedFS server is SIGKILLed while the weights are in flight, stays down OUTAGE_S, and comes
back on the same data directory and ports. Meanwhile a reader polls the store the way another
machine would: every sealed directory it finds must be the whole checkpoint, byte for byte.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from swerl.config import load_config
from swerl.store import COMPLETE, Store, StoreUnavailable, hash_dir
from tests.s3server import S3Endpoint, SeaweedFS, s3_server
from tests.store_contract import read_tree
from training import run as run_context

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OUTAGE_S = 60.0
NAME = "rft-0"
WEIGHTS = "model.safetensors"


@pytest.fixture(scope="module")
def s3() -> S3Endpoint:
    with s3_server() as endpoint:
        yield endpoint


@pytest.fixture
def args(s3: S3Endpoint) -> dict[str, Any]:
    """A fresh prefix per test; the server is up at the start and at the end of every test."""
    s3.server.start()
    yield {"uri": s3.uri(f"t-{uuid.uuid4().hex[:8]}"), "endpoint_url": s3.url,
           "key": s3.key, "secret": s3.secret}
    s3.server.start()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real trainer checkpoint of ~150 MB: the weights go up as a 3-part multipart upload,
    long enough for the server to die in the middle of it."""
    import torch

    from training.checkpoint import save_checkpoint
    from bench.synthetic import tiny_llama

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("ckpt") / NAME
    save_checkpoint(tiny_llama(vocab=32000, hidden=512, layers=2), None, out,
                    {"stage": "rft", "iteration": 0})
    assert (out / WEIGHTS).stat().st_size > 100 * 2**20
    return out


# ---------------------------------------------------------------- the outage and the reader
@dataclass
class Outage:
    """Kill the server when told, bring it back OUTAGE_S later from a thread of its own."""

    server: SeaweedFS
    down_s: float
    killed: threading.Event = field(default_factory=threading.Event)
    back: threading.Event = field(default_factory=threading.Event)
    killed_at: float = 0.0
    restart_at: float = 0.0
    back_at: float = 0.0
    error: BaseException | None = None

    def kill(self) -> None:
        self.server.stop()
        self.killed_at = time.monotonic()
        self.killed.set()

    def restore_later(self) -> threading.Thread:
        def run() -> None:
            try:
                self.killed.wait()
                time.sleep(max(0.0, self.killed_at + self.down_s - time.monotonic()))
                self.restart_at = time.monotonic()
                self.server.start()
                self.back_at = time.monotonic()
                self.back.set()
            except BaseException as e:  # noqa: BLE001 - reported by the test
                self.error = e

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread


@dataclass
class Reader:
    """Another machine watching `key`. It fires the outage while the weights are in flight
    (their multipart upload is open, the object not there yet), and downloads every sealed view
    in full."""

    store: Store
    key: str
    expected_hash: str
    scratch: Path
    outage: Outage
    views: list[tuple[str, list[str]]] = field(default_factory=list)  # ("down"|"partial"|"sealed", files)
    at_kill: list[str] | None = None
    bad: list[str] = field(default_factory=list)
    verified: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set() and not self.verified.is_set():
            try:
                files = [k[len(self.key) + 1:] for k in self.store.ls(self.key)]
            except (StoreUnavailable, PermissionError):  # down, or a gateway still starting
                self.views.append(("down", []))
                time.sleep(0.2)
                continue
            if COMPLETE in files:
                self.views.append(("sealed", files))
                self.check_sealed()
            else:
                self.views.append(("partial", files))
                if self.at_kill is None and WEIGHTS not in files and self.weights_in_flight():
                    self.at_kill = files
                    self.outage.kill()
            time.sleep(0.02)

    def weights_in_flight(self) -> bool:
        """The weights' multipart upload has begun: a kill now cuts a file in half."""
        try:
            return f"{self.key}/{WEIGHTS}" in self.store.uploads_in_progress(self.key)
        except (StoreUnavailable, PermissionError):
            return False

    def check_sealed(self) -> None:
        out = self.scratch / f"view-{len(self.views)}"
        try:
            self.store.get_dir(self.key, out)  # checks every file against the manifest's hash
        except (StoreUnavailable, PermissionError):
            return  # the server went away while we read: no verdict
        except Exception as e:  # noqa: BLE001 - a sealed directory that is not whole
            self.bad.append(f"{type(e).__name__}: {e}")
            return
        if hash_dir(out) != self.expected_hash:
            self.bad.append(f"sealed view {out} is not the checkpoint")
        self.verified.set()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, daemon=True)
        thread.start()
        return thread


def watch(args: dict[str, Any], s3: S3Endpoint, key: str, src: Path, scratch: Path) -> tuple[Outage, Reader]:
    outage = Outage(s3.server, OUTAGE_S)
    reader = Reader(Store(**args, retry_s=1), key, hash_dir(src), scratch, outage)
    return outage, reader


def check_outcome(store: Store, key: str, src: Path, outage: Outage, reader: Reader, tmp: Path) -> None:
    """Killed mid-upload, down for the whole outage, and afterwards exactly the checkpoint, sealed once."""
    assert outage.error is None, outage.error
    assert reader.at_kill is not None, "the server was never killed"
    local = sorted(read_tree(src))
    assert reader.at_kill and COMPLETE not in reader.at_kill and set(reader.at_kill) < set(local), \
        f"not mid-upload when killed: {reader.at_kill}"
    assert outage.back.is_set() and outage.restart_at - outage.killed_at >= OUTAGE_S
    assert any(kind == "down" for kind, _ in reader.views), "the reader never saw the outage"

    assert reader.verified.wait(60), "the reader never saw the sealed checkpoint"
    assert reader.bad == [], reader.bad
    run_prefix = key.rsplit("/checkpoints/", 1)[0]
    keys = store.ls(run_prefix)
    assert keys == sorted(f"{key}/{rel}" for rel in local + [COMPLETE]), keys
    assert [k for k in keys if k.endswith(f"/{COMPLETE}")] == [f"{key}/{COMPLETE}"]
    assert store.uploads_in_progress(run_prefix) == [], "the cut-off upload's parts were left behind"
    assert store.dir_manifest(key)["hash"] == hash_dir(src)
    assert read_tree(store.get_dir(key, tmp / "download")) == read_tree(src), "not byte-identical"


def describe(outage: Outage, reader: Reader) -> str:
    return (f"killed with {reader.at_kill} uploaded; down {outage.restart_at - outage.killed_at:.1f}s "
            f"+ {outage.back_at - outage.restart_at:.1f}s restart")


def run_ctx(store: Store, run_id: str | None = None) -> run_context.RunContext:
    return run_context.RunContext(cfg=load_config("smoke"), store=store,
                             run_id=run_id or f"outage-{uuid.uuid4().hex[:8]}", progress=False)


# ---------------------------------------------------------------- layer 1: the store's retry window
def test_store_retry_window_outlasts_the_outage(args, s3, checkpoint, tmp_path):
    store = Store(**args, retry_s=OUTAGE_S + 120)
    ctx = run_ctx(store)
    key = ctx.key("checkpoints", NAME)
    uploads: list[tuple[str, str]] = []
    real_put_file = store.fs.put_file

    def spied_put_file(lpath: str, rpath: str, **kw: Any) -> None:
        try:
            real_put_file(lpath, rpath, **kw)
        except Exception as e:
            uploads.append((rpath.rsplit("/", 1)[-1], type(e).__name__))
            raise
        uploads.append((rpath.rsplit("/", 1)[-1], "ok"))

    store.fs.put_file = spied_put_file
    outage, reader = watch(args, s3, key, checkpoint, tmp_path)
    restorer, watcher = outage.restore_later(), reader.start()
    try:
        t0 = time.monotonic()
        assert run_context.publish_checkpoint(ctx, checkpoint, NAME) == key
        done_at = time.monotonic()
    finally:
        outage.killed.set()  # never leave the restorer waiting
        restorer.join(OUTAGE_S + 120)
        reader.verified.wait(60)
        reader.stop.set()
        watcher.join(60)

    print(f"{describe(outage, reader)}; publish took {done_at - t0:.1f}s; "
          f"weights upload attempts {[r for f, r in uploads if f == WEIGHTS]}")
    # restart_at, not back_at: the server serves a little before start() sees it ready.
    assert done_at >= outage.restart_at, "publish returned while the server was down"
    weights = [result for name, result in uploads if name == WEIGHTS]
    assert weights[0] != "ok" and weights[-1] == "ok", f"the weights upload was not cut: {weights}"
    check_outcome(store, key, checkpoint, outage, reader, tmp_path)


# ---------------------------------------------------------------- layer 2: Prefect's task retries
SHORT_RETRY_S = 20.0  # < OUTAGE_S: every attempt during the outage ends in StoreUnavailable
ATTEMPTS: list[str] = []


def publish_attempt(store_args: dict[str, Any], local_dir: str, run_id: str) -> str:
    """What a worker does: a fresh store client from its settings, then the stage's publish."""
    ctx = run_ctx(Store(**store_args, retry_s=SHORT_RETRY_S), run_id)
    try:
        key = run_context.publish_checkpoint(ctx, local_dir, NAME)
    except Exception as e:
        ATTEMPTS.append(type(e).__name__)
        raise
    ATTEMPTS.append("ok")
    return key


def test_prefect_task_retries_outlast_a_short_store_window(args, s3, checkpoint, tmp_path):
    from prefect import flow, task
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_HOME, temporary_settings

    from tasks.retry import RETRYABLE_TASK  # the pipeline's own retry policy

    publish = task(name="publish-checkpoint", **RETRYABLE_TASK)(publish_attempt)

    @flow(name="publish-under-outage")
    def publish_flow(store_args: dict[str, Any], local_dir: str, run_id: str) -> tuple[str, str]:
        state = publish(store_args, local_dir, run_id, return_state=True)
        return str(state.state_details.task_run_id), state.result()

    run_id = f"outage-{uuid.uuid4().hex[:8]}"
    key = f"runs/{run_id}/checkpoints/{NAME}"
    store = Store(**args)
    outage, reader = watch(args, s3, key, checkpoint, tmp_path)
    ATTEMPTS.clear()
    with temporary_settings({PREFECT_HOME: str(tmp_path / "prefect")}):
        restorer, watcher = outage.restore_later(), reader.start()
        try:
            task_run_id, got = publish_flow(args, str(checkpoint), run_id)
        finally:
            outage.killed.set()
            restorer.join(OUTAGE_S + 120)
            reader.verified.wait(60)
            reader.stop.set()
            watcher.join(60)
        with get_client(sync_client=True) as client:
            task_run = client.read_task_run(task_run_id)
            history = [s.name for s in client.read_task_run_states(task_run_id)]

    print(f"{describe(outage, reader)}; attempts {ATTEMPTS}; task run {task_run_id} "
          f"run_count={task_run.run_count} states {history}")
    assert got == key
    assert ATTEMPTS[0] == "StoreUnavailable" and ATTEMPTS[-1] == "ok", ATTEMPTS
    assert task_run.run_count == len(ATTEMPTS) >= 2
    assert "AwaitingRetry" in history and history[-1] == "Completed", history
    check_outcome(store, key, checkpoint, outage, reader, tmp_path)
