"""Importers for SWE-bench (full, Lite, Verified), SWE-rebench and SWE-Gym.

Records come from a JSONL, JSON or Parquet file, or from a Hugging Face dataset name through
`datasets` (optional: imported only on that path). Every good record becomes a TaskInstance with
an environment recipe in `meta["env_spec"]` (what `environments.images` builds, see `recipe`);
bad records are reported by line/record and field while the rest load. The repository comes
from GitHub, or from a local mirror directory of bare repositories named `owner__name.git`
(`repo_mirror`), for machines that cannot reach GitHub.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any, Iterator

from environments.records import LoadReport, TaskFormatError, TaskInstance, load_tasks
from environments.swebench_specs import recipe

SOURCES = ("swe-bench", "swe-bench-lite", "swe-bench-verified", "swe-rebench", "swe-gym")
HF_NAMES = {
    "swe-bench": "princeton-nlp/SWE-bench",
    "swe-bench-lite": "princeton-nlp/SWE-bench_Lite",
    "swe-bench-verified": "princeton-nlp/SWE-bench_Verified",
    "swe-rebench": "nebius/SWE-rebench",
    "swe-gym": "SWE-Gym/SWE-Gym",
}
DEFAULT_SPLIT = {"swe-bench": "eval", "swe-bench-lite": "eval", "swe-bench-verified": "eval",
                 "swe-rebench": "train", "swe-gym": "train"}


class ImportSourceError(ValueError):
    """An input that cannot be read at all (missing file, unknown format, no `datasets`)."""


# ---------------------------------------------------------------------------- reading records


def _records_from_file(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, record) for JSON and Parquet files; JSONL goes through records.load_tasks."""
    suffix = path.suffix.lower()
    if suffix == ".json":
        data = json.loads(path.read_text())
        items = data if isinstance(data, list) else list(data.values()) if isinstance(data, dict) else None
        if items is None:
            raise ImportSourceError(f"{path}: expected a JSON list or object of records")
        for i, rec in enumerate(items, 1):
            yield f"{path}:record {i}", rec
    elif suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ImportSourceError("reading Parquet needs pyarrow (pip install pyarrow)") from None
        for i, rec in enumerate(pq.read_table(path).to_pylist(), 1):
            yield f"{path}:row {i}", rec
    else:
        raise ImportSourceError(f"{path}: unknown format (use .jsonl, .json or .parquet)")


def _records_from_hub(name: str, split: str, data_files: str | list[str] | None = None) -> Iterator[tuple[str, Any]]:
    """Records of a Hugging Face dataset (or of local files through a `datasets` builder such
    as "json", which is how this path is tested without a network)."""
    try:
        import datasets
    except ImportError:
        raise ImportSourceError(f"loading {name!r} from the Hugging Face hub needs `datasets` "
                           "(pip install datasets); or pass a .jsonl/.json/.parquet file") from None
    ds = datasets.load_dataset(name, data_files=data_files, split="train" if data_files else split)
    for i, rec in enumerate(ds, 1):
        yield f"{name}[{split}]:row {i}", dict(rec)


def _to_tasks(records: Iterator[tuple[str, Any]]) -> LoadReport:
    tasks, errors = [], []
    for where, rec in records:
        try:
            tasks.append(TaskInstance.from_dict(rec))
        except (TaskFormatError, TypeError) as e:
            errors.append(f"{where}: {e}")
    return LoadReport(tasks, errors)


def read_tasks(path_or_name: str, hf_split: str = "test", data_files: str | list[str] | None = None) -> LoadReport:
    """Raw TaskInstances (no recipe yet) from a file, a hub dataset name (a SOURCES short name
    or "owner/name"), or a `datasets` builder with `data_files` (e.g. "json")."""
    if data_files is not None:
        return _to_tasks(_records_from_hub(path_or_name, hf_split, data_files))
    path = Path(path_or_name)
    if path.exists():
        if path.suffix.lower() == ".jsonl":
            return load_tasks(path)
        return _to_tasks(_records_from_file(path))
    if path.suffix.lower() in (".jsonl", ".json", ".parquet"):
        raise ImportSourceError(f"{path}: no such file")
    name = HF_NAMES.get(path_or_name, path_or_name)
    return _to_tasks(_records_from_hub(name, hf_split))


def unpack_mirror(archives: str | Path, root: str | Path) -> Path:
    """Every `owner__name.git.tar.gz` under `archives` (shallow bare repositories, as
    tests/data/swebench_real/make_fixture.py packs them) unpacked under `root`: a directory
    `--repo-mirror` takes."""
    found = sorted(Path(archives).glob("*.git.tar.gz"))
    if not found:
        raise ImportSourceError(f"{archives}: no owner__name.git.tar.gz repository archives")
    for archive in found:
        with tarfile.open(archive) as tf:
            tf.extractall(root, filter="data")
    return Path(root)


def import_tasks(path_or_name: str, source: str, repo_mirror: str | None = None,
                 split: str | None = None, hf_split: str = "test",
                 data_files: str | list[str] | None = None) -> LoadReport:
    """Load SWE-bench-style tasks and attach an environment recipe to each.

    `source` names the collection (one of SOURCES); `split` defaults to eval for the SWE-bench
    test sets and train for SWE-Gym / SWE-rebench. A task whose recipe cannot be made is
    reported, the others load.
    """
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r} (known: {', '.join(SOURCES)})")
    if repo_mirror and not Path(repo_mirror).is_dir():
        raise ImportSourceError(f"repo mirror {repo_mirror} is not a directory")
    raw = read_tasks(path_or_name, hf_split, data_files)
    tasks, errors = [], list(raw.errors)
    for t in raw.tasks:
        try:
            spec, notes, test_cmd, parser = recipe(t, repo_mirror)
        except (ValueError, TypeError, KeyError) as e:
            errors.append(f"{t.instance_id}: no environment recipe ({type(e).__name__}: {e})")
            continue
        if repo_mirror and not (Path(repo_mirror) / f"{t.repo.replace('/', '__')}.git").is_dir():
            errors.append(f"{t.instance_id}: repo {t.repo} is not in the mirror {repo_mirror}")
            continue
        t.source = source
        t.split = split or DEFAULT_SPLIT[source]
        t.test_cmd, t.log_parser = test_cmd, parser
        t.meta = {**t.meta, "project": t.repo, "env_spec": spec.to_dict(), "env_recipe": notes}
        if "python_substitution" in notes:  # kept only if validation passes on the nearer Python
            t.meta["python_substitution"] = notes["python_substitution"]
        tasks.append(t)
    return LoadReport(tasks, errors)
