"""Store on a real S3 endpoint (SeaweedFS on loopback): the file:// behaviours, plus outages."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from swerl.config import StorageConfig
from swerl.store import Store, StoreUnavailable, open_store
from tests import store_contract as contract
from tests.s3server import S3Endpoint, s3_server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def s3():
    with s3_server() as endpoint:
        yield endpoint


@pytest.fixture
def args(s3: S3Endpoint) -> dict:
    """A fresh prefix per test, so tests share one server without seeing each other's keys."""
    if not s3.server.running:  # a previous test's outage must not leak into this one
        s3.server.start()
    return {"uri": s3.uri(f"t-{uuid.uuid4().hex[:8]}"), "endpoint_url": s3.url,
            "key": s3.key, "secret": s3.secret}


def test_roundtrip(args):
    contract.check_roundtrip(args)


def test_ls_and_exists(args):
    contract.check_ls_and_exists(args)


def test_missing_key_fails_fast(args):
    contract.check_missing_key_fails_fast(args)


def test_delete(args):
    contract.check_delete(args)


def test_dirs(args, tmp_path):
    contract.check_dirs(args, tmp_path)


def test_interrupted_put_dir(args, tmp_path, monkeypatch):
    contract.check_interrupted_put_dir(args, tmp_path, monkeypatch)


def test_killed_writer_leaves_no_visible_object(args, tmp_path):
    contract.check_killed_writer(args, tmp_path)


def test_open_store_creates_missing_bucket_and_reads_env_credentials(s3, monkeypatch):
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    bucket = f"fresh-{uuid.uuid4().hex[:8]}"
    store = open_store(StorageConfig(uri=f"s3://{bucket}/pre"))  # endpoint and keys from env
    assert store.ls() == []  # a missing bucket lists as empty instead of failing
    store.put_json("m.json", {"ok": True})
    assert store.get_json("m.json") == {"ok": True}
    assert store.url("m.json") == f"s3://{bucket}/pre/m.json"
    assert store.local_path("m.json") is None


def test_wrong_credentials_fail_at_once(s3):
    store = Store(s3.uri("x"), endpoint_url=s3.url, key=s3.key, secret="wrong", retry_s=60)
    t0 = time.monotonic()
    with pytest.raises(PermissionError):
        store.put_bytes("a", b"x")
    assert time.monotonic() - t0 < 10, "an auth error is not an outage and must not be retried"


def test_write_during_outage_lands_once_server_is_back(args, s3):
    store = Store(**args, retry_s=120)
    store.put_bytes("before", b"1")
    s3.server.stop()
    down_for = 10.0
    restarted = threading.Event()

    def come_back() -> None:
        time.sleep(down_for)
        s3.server.start()
        restarted.set()

    thread = threading.Thread(target=come_back, daemon=True)
    t0 = time.monotonic()
    thread.start()
    store.put_bytes("during", b"2")  # blocks, retrying, until the server is back
    waited = time.monotonic() - t0
    thread.join(timeout=120)
    assert restarted.is_set()
    assert waited >= down_for, f"put_bytes returned after {waited:.1f}s, while the server was down"
    assert store.get_bytes("during") == b"2"
    assert store.get_bytes("before") == b"1"  # data written before the crash survived it
    assert store.ls() == ["before", "during"]


def test_outage_longer_than_retry_window_raises(args, s3):
    store = Store(**args, retry_s=3)
    store.put_bytes("k", b"v")
    s3.server.stop()
    try:
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailable, match="unreachable"):
            store.get_bytes("k")
        assert 3 <= time.monotonic() - t0 < 30
        with pytest.raises(StoreUnavailable):
            store.exists("k")  # an outage never reads as "not there"
    finally:
        s3.server.start()
    assert store.get_bytes("k") == b"v"
