"""Store on file:// (plus the retry policy, which does not need a server to be exercised)."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

from swerl.config import StorageConfig
from swerl.store import (
    TMP_PREFIX,
    Store,
    StoreUnavailable,
    content_hash,
    hash_dir,
    is_transient,
    open_store,
    retry_call,
    short_hash,
)
from tests import store_contract as contract
from tests.s3server import free_ports

pytestmark = pytest.mark.unit


@pytest.fixture
def args(tmp_path: Path) -> dict:
    return {"uri": f"file://{tmp_path / 'store'}"}


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


def test_relative_file_uri_resolves_against_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = open_store(StorageConfig())  # default: file://.swerl/store
    store.put_text("k.txt", "v")
    monkeypatch.chdir("/")  # resolved once, at construction: a later chdir changes nothing
    assert store.get_text("k.txt") == "v"
    assert store.local_path("k.txt") == tmp_path / ".swerl" / "store" / "k.txt"
    assert store.uri == f"file://{tmp_path}/.swerl/store"
    assert (tmp_path / ".swerl" / "store" / "k.txt").read_text() == "v"


def test_absolute_and_bare_paths(tmp_path):
    assert Store(f"file://{tmp_path}/s").uri == Store(str(tmp_path / "s")).uri == f"file://{tmp_path}/s"
    with pytest.raises(ValueError):
        Store("gs://bucket/x")


@pytest.mark.parametrize("bad", ["/abs", "../up", "a/../b", "a//b", "./a", f"a/{TMP_PREFIX}x", ""])
def test_bad_keys_rejected(args, bad):
    store = Store(**args)
    with pytest.raises(ValueError):
        store.put_bytes(bad, b"x")


def test_failed_write_keeps_old_version_and_leaves_no_temp(args, monkeypatch):
    store = Store(**args)
    store.put_bytes("a/obj", b"old")

    def disk_error(fd):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fsync", disk_error)
    with pytest.raises(OSError, match="I/O error"):
        store.put_bytes("a/obj", b"new" * 1000)
    with pytest.raises(OSError):
        store.put_bytes("a/fresh", b"x")
    monkeypatch.undo()
    assert store.get_bytes("a/obj") == b"old"
    assert not store.exists("a/fresh")
    assert store.ls() == ["a/obj"]
    assert sorted(p.name for p in store.local_path("a").iterdir()) == ["obj"]


def test_get_dir_rejects_tampered_directory(args, tmp_path):
    store = Store(**args)
    src = contract.make_tree(tmp_path / "ck", {"w.bin": b"weights", "c.json": b"{}"})
    store.put_dir(src, "ck")
    store.local_path("ck/w.bin").write_bytes(b"bit rot")
    with pytest.raises(OSError, match="hash mismatch"):
        store.get_dir("ck", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_put_dir_skips_identical_sealed_directory(args, tmp_path, monkeypatch):
    store = Store(**args)
    src = contract.make_tree(tmp_path / "ck", {"w.bin": b"weights"})
    first = store.put_dir(src, "ck")
    uploads = []
    monkeypatch.setattr(Store, "put_file", lambda self, p, k: uploads.append(k))
    assert store.put_dir(src, "ck") == first
    assert uploads == []


def test_hashes(tmp_path):
    assert content_hash(b"abc") == content_hash([b"a", b"", b"bc"]) == content_hash(iter([b"ab", b"c"]))
    assert len(content_hash(b"")) == 64 and short_hash(content_hash(b"abc")) == content_hash(b"abc")[:12]

    a = contract.make_tree(tmp_path / "a", {"x.txt": b"1", "d/y.txt": b"2"})
    b = contract.make_tree(tmp_path / "b", {"d/y.txt": b"2", "x.txt": b"1"})  # other creation order
    assert hash_dir(a) == hash_dir(b)
    (b / "x.txt").write_bytes(b"changed")
    assert hash_dir(a) != hash_dir(b)
    c = contract.make_tree(tmp_path / "c", {"x2.txt": b"1", "d/y.txt": b"2"})  # renamed file
    assert hash_dir(a) != hash_dir(c)
    # names and contents are framed: moving bytes between the name and the content changes it
    d = contract.make_tree(tmp_path / "d", {"ab": b"c"})
    e = contract.make_tree(tmp_path / "e", {"a": b"bc"})
    assert hash_dir(d) != hash_dir(e)


# ---- the retry policy ---------------------------------------------------------------------


def _s3_style_error(status: int, code: str) -> OSError:
    """What s3fs raises for an HTTP error: a translated OSError caused by a botocore ClientError."""
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    err = ClientError({"Error": {"Code": code, "Message": code},
                       "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")
    return translate_boto_error(err)


def test_transient_classification():
    from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

    assert is_transient(ConnectionRefusedError())
    assert is_transient(ConnectionResetError())
    assert is_transient(TimeoutError())
    assert is_transient(EndpointConnectionError(endpoint_url="http://127.0.0.1:1"))
    assert is_transient(ReadTimeoutError(endpoint_url="http://127.0.0.1:1"))
    assert is_transient(_s3_style_error(503, "ServiceUnavailable"))
    assert is_transient(_s3_style_error(500, "InternalError"))
    assert not is_transient(_s3_style_error(404, "NoSuchKey"))
    assert not is_transient(_s3_style_error(403, "AccessDenied"))
    assert not is_transient(FileNotFoundError("k"))
    assert not is_transient(PermissionError("denied"))
    assert not is_transient(ValueError("bad key"))
    assert not is_transient(OSError(errno.EIO, "local disk error"))


def test_retry_call_waits_out_transient_errors():
    calls = []

    def flaky():
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise ConnectionRefusedError("down")
        return "ok"

    assert retry_call(flaky, "flaky", retry_s=30) == "ok"
    assert len(calls) == 3
    assert calls[2] - calls[0] >= 0.5 + 1.0 - 0.05  # backoff happened: 0.5 s then 1 s


def test_retry_call_does_not_retry_permanent_errors():
    calls = []

    def missing():
        calls.append(1)
        raise FileNotFoundError("gone")

    with pytest.raises(FileNotFoundError):
        retry_call(missing, "missing", retry_s=30)
    assert calls == [1]


def test_unreachable_s3_raises_store_unavailable_after_retry_window():
    """A real S3 client against a loopback port nobody listens on: connection refused."""
    (port,) = free_ports(1)
    store = Store("s3://bucket-x/p", endpoint_url=f"http://127.0.0.1:{port}",
                  key="k", secret="s", retry_s=2.0)
    t0 = time.monotonic()
    with pytest.raises(StoreUnavailable, match="unreachable for 2s") as info:
        store.put_bytes("a", b"x")
    elapsed = time.monotonic() - t0
    assert 2.0 <= elapsed < 15, elapsed
    assert "127.0.0.1" in str(info.value) or "Could not connect" in str(info.value)
