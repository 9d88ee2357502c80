"""Datasets as content-addressed artifacts: `{store}/datasets/{name}/{hash}/tasks.jsonl` + `manifest.json`.

The hash is over the canonical JSONL (tasks sorted by id, keys sorted), so the same tasks always
get the same address and an eval set named by its hash cannot drift: loading re-hashes the file
and refuses a mismatch. The manifest is written last and is what makes a dataset visible, so a
reader never sees half of one. MLflow logging is the caller's job (tasks/): `DatasetRef` carries
what it needs (name, hash, uri, counts).
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from environments.records import TaskInstance, TaskFormatError
from swerl.store import Store, content_hash

HASH_LEN = 16
LATEST = "LATEST.json"  # datasets/<name>/LATEST.json: the hash curation saved last
# Datasets shipped with the checkout (`swerl dataset ship`): data/datasets/<name>/<hash>.jsonl.gz and
# <hash>.manifest.json. A config that pins a hash takes its dataset from here when the store lacks it.
SHIPPED_DIR = Path(__file__).resolve().parents[2] / "data" / "datasets"


class DatasetError(RuntimeError):
    """A dataset that does not exist or does not match its hash."""


@dataclass
class DatasetRef:
    name: str
    hash: str
    uri: str  # the dataset's directory in the store
    counts: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def canonical_jsonl(tasks: list[TaskInstance]) -> bytes:
    lines = [json.dumps(t.to_dict(), sort_keys=True, ensure_ascii=False)
             for t in sorted(tasks, key=lambda t: t.instance_id)]
    return ("\n".join(lines) + "\n").encode() if lines else b""


def dataset_hash(tasks: list[TaskInstance]) -> str:
    return content_hash(canonical_jsonl(tasks))[:HASH_LEN]


def counts(tasks: list[TaskInstance]) -> dict[str, Any]:
    """What a manifest (and a tracking run) says about a set of tasks."""
    def by(fn) -> dict[str, int]:
        return dict(sorted(Counter(fn(t) for t in tasks).items()))

    return {
        "total": len(tasks),
        "by_source": by(lambda t: t.source or "unknown"),
        "by_project": by(lambda t: t.project),
        "by_modifier": by(lambda t: t.meta.get("modifier", "none")),
        "by_split": by(lambda t: t.split),
        "by_hint_level": by(lambda t: str(t.meta.get("hint_level", ""))),
    }


def _prefix(name: str, digest: str = "") -> str:
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"bad dataset name {name!r}")
    return f"datasets/{name}/{digest}" if digest else f"datasets/{name}"


def save_dataset(store: Store, name: str, tasks: list[TaskInstance], config: dict[str, Any]) -> DatasetRef:
    """Write tasks + manifest under their content hash; an existing identical dataset is reused."""
    data = canonical_jsonl(tasks)
    digest = content_hash(data)[:HASH_LEN]
    prefix = _prefix(name, digest)
    ref = DatasetRef(name, digest, store.url(prefix), counts(tasks))
    if not store.exists(f"{prefix}/manifest.json"):
        _write(store, prefix, name, digest, data, ref, config)
    # the newest is the one curation made last, also when it equals an older one: "newest
    # created" would pick a later, different build (e.g. one that lost a project)
    store.put_json(f"{_prefix(name)}/{LATEST}", {"hash": digest})
    return ref


def _write(store: Store, prefix: str, name: str, digest: str, data: bytes, ref: DatasetRef,
           config: dict[str, Any]) -> None:
    store.put_bytes(f"{prefix}/tasks.jsonl", data)
    store.put_json(f"{prefix}/manifest.json", {
        "name": name,
        "hash": digest,
        "sha256": content_hash(data),
        "created_at": datetime.now(timezone.utc).isoformat(timespec="microseconds"),
        "counts": ref.counts,
        "config": config,
        "files": ["tasks.jsonl"],
    })


def _manifest(store: Store, name: str, digest: str) -> dict[str, Any]:
    try:
        return store.get_json(f"{_prefix(name, digest)}/manifest.json")
    except FileNotFoundError:
        raise DatasetError(f"no dataset {name}@{digest} in {store.uri}") from None


def list_datasets(store: Store, name: str | None = None) -> list[DatasetRef]:
    """Every complete dataset (one with a manifest), oldest first."""
    refs = []
    for key in store.ls(_prefix(name) if name else "datasets"):
        parts = key.split("/")
        if len(parts) == 4 and parts[3] == "manifest.json":
            m = store.get_json(key)
            refs.append((m.get("created_at", ""), DatasetRef(parts[1], parts[2], store.url("/".join(parts[:3])),
                                                             m.get("counts", {}))))
    return [r for _, r in sorted(refs, key=lambda x: (x[0], x[1].name, x[1].hash))]


def latest_hash(store: Store, name: str) -> str:
    """The dataset `name` that curation saved last (the newest created, for stores without a
    pointer)."""
    try:
        digest = store.get_json(f"{_prefix(name)}/{LATEST}")["hash"]
        if store.exists(f"{_prefix(name, digest)}/manifest.json"):
            return digest
    except FileNotFoundError:
        pass
    refs = list_datasets(store, name)
    if not refs:
        raise DatasetError(f"no dataset named {name!r} in {store.uri}")
    return refs[-1].hash


def load_dataset(store: Store, name: str, hash: str | None = None) -> list[TaskInstance]:
    """The tasks of `name` at `hash` (the newest when None), checked against the hash."""
    digest = hash or latest_hash(store, name)
    return _parse(_stored_bytes(store, name, digest)[0], f"dataset {name}@{digest}")


def _stored_bytes(store: Store, name: str, digest: str) -> tuple[bytes, dict[str, Any]]:
    """The dataset's tasks.jsonl, checked against its hash, and its manifest."""
    manifest = _manifest(store, name, digest)
    data = store.get_bytes(f"{_prefix(name, digest)}/tasks.jsonl")
    sha = content_hash(data)
    if sha != manifest.get("sha256") or sha[:HASH_LEN] != digest:
        raise DatasetError(f"dataset {name}@{digest}: tasks.jsonl does not match its hash")
    return data, manifest


def _parse(data: bytes, what: str) -> list[TaskInstance]:
    tasks = []
    for lineno, line in enumerate(data.decode().splitlines(), 1):
        if line.strip():
            try:
                tasks.append(TaskInstance.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TaskFormatError, TypeError) as e:
                raise DatasetError(f"{what}: line {lineno}: {e}") from e
    return tasks


def shipped_files(name: str, digest: str, root: Path = SHIPPED_DIR) -> tuple[Path, Path]:
    """(tasks, manifest) of a shipped dataset."""
    _prefix(name, digest)  # validates the name
    return root / name / f"{digest}.jsonl.gz", root / name / f"{digest}.manifest.json"


def ship_dataset(store: Store, name: str, digest: str, root: Path = SHIPPED_DIR) -> Path:
    """Copy a stored dataset into the checkout, so a config can pin it on any machine.

    gzip with a fixed mtime: shipping the same dataset twice writes the same bytes.
    """
    data, manifest = _stored_bytes(store, name, digest)
    tasks_path, manifest_path = shipped_files(name, digest, root)
    tasks_path.parent.mkdir(parents=True, exist_ok=True)
    tasks_path.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return tasks_path


def ensure_dataset(store: Store, name: str, digest: str, root: Path = SHIPPED_DIR) -> DatasetRef:
    """The dataset `name@digest` in the store; copied there from its shipped copy when missing."""
    prefix = _prefix(name, digest)
    if store.exists(f"{prefix}/manifest.json"):
        return DatasetRef(name, digest, store.url(prefix), _manifest(store, name, digest).get("counts", {}))
    tasks_path, manifest_path = shipped_files(name, digest, root)
    if not tasks_path.is_file():
        raise DatasetError(f"dataset {name}@{digest} is pinned, but it is neither in {store.uri} nor shipped "
                           f"at {tasks_path}: build it with `swerl curate synth` (pins unset) or drop the pin")
    try:
        data = gzip.decompress(tasks_path.read_bytes())
    except (OSError, EOFError) as e:
        raise DatasetError(f"{tasks_path}: not a readable gzip file ({e})") from e
    if content_hash(data)[:HASH_LEN] != digest:
        raise DatasetError(f"{tasks_path} does not match its hash {digest}: the file was changed or cut short")
    config = json.loads(manifest_path.read_text()).get("config", {}) if manifest_path.is_file() else {}
    ref = save_dataset(store, name, _parse(data, str(tasks_path)), {**config, "shipped_as": tasks_path.name})
    if ref.hash != digest:  # a task record that does not survive a load/save round trip
        raise DatasetError(f"{tasks_path}: its tasks hash to {ref.hash} once loaded, not {digest}")
    return ref


def dataset_manifest(store: Store, name: str, hash: str | None = None) -> dict[str, Any]:
    return _manifest(store, name, hash or latest_hash(store, name))
