"""Behaviours every Store backend must show, as plain functions over Store(**args).

tests/unit/test_store.py runs them on file://, tests/integration/test_store_s3.py on a real
SeaweedFS, so "the same behaviour on both backends" is one piece of code, not two copies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from swerl.store import COMPLETE, TMP_PREFIX, Store, content_hash, hash_dir

REPO = Path(__file__).resolve().parents[1]


def make_tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def check_roundtrip(args: dict[str, Any]) -> None:
    store = Store(**args)
    blob = os.urandom(3000) + b"\0\xff"
    store.put_bytes("a/blob.bin", blob)
    store.put_text("a/t.txt", "héllo\n")
    store.put_json("a/b/m.json", {"n": 3, "xs": [1.5, None, "é"]})
    assert store.get_bytes("a/blob.bin") == blob
    assert store.get_text("a/t.txt") == "héllo\n"
    assert store.get_json("a/b/m.json") == {"n": 3, "xs": [1.5, None, "é"]}
    store.put_bytes("a/blob.bin", b"v2")  # overwrite replaces, never appends
    assert store.get_bytes("a/blob.bin") == b"v2"
    assert store.url("a/t.txt") == store.uri + "/a/t.txt"


def check_ls_and_exists(args: dict[str, Any]) -> None:
    store = Store(**args)
    for key in ["runs/r1/x.json", "runs/r1/sub/y.json", "runs/r10/z.json", "datasets/d/tasks.jsonl"]:
        store.put_bytes(key, key.encode())
    assert store.ls() == sorted(["datasets/d/tasks.jsonl", "runs/r1/sub/y.json",
                                 "runs/r1/x.json", "runs/r10/z.json"])
    # a prefix is a directory, not a string prefix: runs/r1 must not pick up runs/r10
    assert store.ls("runs/r1") == ["runs/r1/sub/y.json", "runs/r1/x.json"]
    assert store.ls("runs/r1/") == store.ls("runs/r1")
    assert store.ls("runs/r1/x.json") == ["runs/r1/x.json"]
    assert store.ls("nothing/here") == []
    assert store.exists("runs/r1/x.json")
    assert not store.exists("runs/r1")  # a directory prefix is not an object
    assert not store.exists("runs/r1/missing.json")


def check_missing_key_fails_fast(args: dict[str, Any]) -> None:
    store = Store(**{**args, "retry_s": 60})
    t0 = time.monotonic()
    with pytest.raises(FileNotFoundError):
        store.get_bytes("no/such/key")
    with pytest.raises(FileNotFoundError):
        store.get_json("no/such/key.json")
    assert time.monotonic() - t0 < 5, "a missing key must not be retried like an outage"


def check_delete(args: dict[str, Any]) -> None:
    store = Store(**args)
    for key in ["d/1", "d/2/3", "d2/4"]:
        store.put_bytes(key, b"x")
    assert store.delete("d") == 2
    assert store.ls() == ["d2/4"]
    assert store.delete("d") == 0  # deleting what is gone is fine (restarts do it)
    assert store.delete("d2/4") == 1
    assert store.ls() == []
    with pytest.raises(ValueError):
        store.delete("")


def check_dirs(args: dict[str, Any], tmp_path: Path) -> None:
    store = Store(**args)
    files = {"model.safetensors": os.urandom(200_000), "config.json": b"{}", "tok/vocab.txt": b"a\nb\n"}
    src = make_tree(tmp_path / "ck", files)
    digest = store.put_dir(src, "runs/r/checkpoints/rft-0")
    assert digest == hash_dir(src)
    assert store.dir_complete("runs/r/checkpoints/rft-0")
    assert store.dir_manifest("runs/r/checkpoints/rft-0")["files"] == sorted(files)
    out = store.get_dir("runs/r/checkpoints/rft-0", tmp_path / "out")
    assert read_tree(out) == files
    with pytest.raises(FileExistsError):  # never mixes into a non-empty directory
        store.get_dir("runs/r/checkpoints/rft-0", tmp_path / "out")

    # a new version replaces the old one completely: a file that disappeared is gone remotely
    (src / "tok/vocab.txt").unlink()
    (src / "config.json").write_bytes(b'{"v": 2}')
    digest2 = store.put_dir(src, "runs/r/checkpoints/rft-0")
    assert digest2 != digest
    assert "runs/r/checkpoints/rft-0/tok/vocab.txt" not in store.ls("runs/r/checkpoints/rft-0")
    assert read_tree(store.get_dir("runs/r/checkpoints/rft-0", tmp_path / "out2")) == read_tree(src)


def check_interrupted_put_dir(args: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(**args)
    src = make_tree(tmp_path / "ck", {"a.bin": b"A" * 1000, "b.bin": b"B" * 1000, "c/d.bin": b"D"})
    store.put_dir(src, "ck/1")
    (src / "b.bin").write_bytes(b"changed")

    real_put_file = Store.put_file
    done: list[str] = []

    def dies_on_second_file(self: Store, local_path: Path, key: str) -> None:
        if done:
            raise RuntimeError("worker died mid-upload")
        done.append(key)
        real_put_file(self, local_path, key)

    monkeypatch.setattr(Store, "put_file", dies_on_second_file)
    with pytest.raises(RuntimeError, match="mid-upload"):
        store.put_dir(src, "ck/1")
    monkeypatch.setattr(Store, "put_file", real_put_file)

    # The old sealed version was unsealed before anything was replaced, and the new one never
    # got sealed: nobody may trust ck/1 now.
    assert done, "the interruption must happen after some files were written"
    assert not store.dir_complete("ck/1")
    assert not any(k.endswith(COMPLETE) for k in store.ls("ck/1"))
    with pytest.raises(FileNotFoundError):
        store.get_dir("ck/1", tmp_path / "out")
    assert not (tmp_path / "out").exists()

    store.put_dir(src, "ck/1")  # a retry finishes the job
    assert read_tree(store.get_dir("ck/1", tmp_path / "out")) == read_tree(src)


def check_killed_writer(args: dict[str, Any], tmp_path: Path) -> None:
    """A writer process SIGKILLed in the middle of put_file leaves nothing readable behind.

    The source is a FIFO we feed by hand, so the child is provably inside the write (it has
    consumed our first megabyte and waits for more) when it is killed.
    """
    store = Store(**args)
    store.put_bytes("w/other.bin", b"untouched")
    fifo = tmp_path / "src.fifo"
    os.mkfifo(fifo)
    code = ("import json, sys\nfrom swerl.store import Store\n"
            "Store(**json.loads(sys.argv[1])).put_file(sys.argv[2], 'w/killed.bin')\n")
    child = subprocess.Popen([sys.executable, "-c", code, json.dumps(args), str(fifo)], cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    partial: list[Path] = []
    try:
        with open(fifo, "wb") as w:  # blocks until the child opens its end
            w.write(b"x" * (1 << 20))  # returns once the child has drained all but <64 KiB
            w.flush()
            if store.local:  # wait until the partial object really is on disk
                deadline = time.monotonic() + 20
                while not partial and time.monotonic() < deadline:
                    partial = [p for p in store.local_path("w").iterdir()
                               if p.name.startswith(TMP_PREFIX) and p.stat().st_size > 0]
                    time.sleep(0.01)
                assert partial, "the child never started writing"
            child.kill()
            child.wait(timeout=30)
    except BrokenPipeError:
        pass
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
    assert child.returncode == -9

    assert not store.exists("w/killed.bin")
    assert store.ls() == ["w/other.bin"]
    with pytest.raises(FileNotFoundError):
        store.get_bytes("w/killed.bin")
    if store.local:  # the bytes are on disk, yet invisible: that is the point
        assert all(p.exists() for p in partial)

    src = tmp_path / "real.bin"
    src.write_bytes(os.urandom(100_000))
    store.put_file(src, "w/killed.bin")
    assert content_hash(store.get_bytes("w/killed.bin")) == content_hash(src.read_bytes())
    assert store.ls() == ["w/killed.bin", "w/other.bin"]
