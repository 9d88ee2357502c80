"""Imported datasets: an upstream SWE-bench / SWE-rebench / SWE-Gym collection through the
paper's filters into the store. `swerl curate import` and a preset's `data.*_import` both run
`import_and_filter`; the pipeline reuses a stored import while its spec is unchanged, since
filtering runs every task's gold and empty patch in containers (minutes per task)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from environments.curation.curate import CurationError
from environments.curation.dataset import DatasetRef, dataset_manifest, list_datasets, save_dataset
from environments.curation.filters import FilterReport, counts_line, filter_tasks
from environments.curation.importers import ImportSourceError, import_tasks
from environments.records import LoadReport
from swerl.config import EnvironmentConfig, ImportSpec, SwerlConfig
from swerl.store import Store

Progress = Callable[[str], None]


def wanted_ids(spec: ImportSpec) -> list[str] | None:
    """The subset the spec names (one instance id per line, `#` comments), or None for all."""
    if not spec.instance_ids_file:
        return None
    path = Path(spec.instance_ids_file)
    if not path.is_file():
        raise ImportSourceError(f"instance_ids_file {path}: no such file")
    ids = [ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines()]
    return [i for i in ids if i]


def import_and_filter(spec: ImportSpec, split: str | None, env_cfg: EnvironmentConfig, workers: int = 2,
                      progress: Progress = print) -> tuple[LoadReport, FilterReport]:
    """Rows -> tasks with environment recipes -> the paper's filters. An id the subset names that
    the rows lack is reported as unreadable, not silently dropped."""
    report = import_tasks(spec.path, spec.source, repo_mirror=spec.repo_mirror, split=split, hf_split=spec.hf_split)
    ids = wanted_ids(spec)
    if ids is not None:
        have, wanted = {t.instance_id for t in report.tasks}, set(ids)
        report.errors += [f"{i}: named in {spec.instance_ids_file} but not in {spec.path}" for i in ids if i not in have]
        report.tasks = [t for t in report.tasks if t.instance_id in wanted]
    filtered = filter_tasks(report.tasks, env_cfg, reruns=spec.reruns, workers=workers, progress=progress)
    return report, filtered


def _stored_import(store: Store, name: str, spec: dict[str, Any]) -> DatasetRef | None:
    """The newest stored dataset `name` made from this very spec."""
    for ref in reversed(list_datasets(store, name)):
        if dataset_manifest(store, name, ref.hash).get("config", {}).get("import") == spec:
            return ref
    return None


def import_split(store: Store, name: str, spec: ImportSpec, split: str, env_cfg: EnvironmentConfig,
                 progress: Progress = print) -> DatasetRef:
    wanted = spec.model_dump()
    if (ref := _stored_import(store, name, wanted)) is not None:
        progress(f"curation: {split} dataset {name}@{ref.hash} imported before from {spec.path} (reused)")
        return ref
    report, filtered = import_and_filter(spec, split, env_cfg, progress=progress)
    for err in report.errors:
        progress(f"curation: skipped: {err}")
    progress(f"curation: {split} import of {spec.path}: {counts_line(filtered)}")
    if not filtered.kept:
        raise CurationError(f"the {split} import of {spec.path} kept no task ({counts_line(filtered)})")
    return save_dataset(store, name, filtered.kept, {"import": wanted, "filters": filtered.summary()["dropped_by"],
                                                     "unreadable": len(report.errors)})


def curate_imported(cfg: SwerlConfig, store: Store, progress: Progress = print
                    ) -> tuple[DatasetRef, DatasetRef, dict[str, Any]] | None:
    """Both splits from `cfg.data.*_import`, or None when the config imports nothing."""
    d = cfg.data
    if d.train_import is None or d.eval_import is None:
        return None
    t0 = time.monotonic()
    train = import_split(store, d.train_dataset, d.train_import, "train", cfg.environment, progress)
    eval_ = import_split(store, d.eval_dataset, d.eval_import, "eval", cfg.environment, progress)
    return train, eval_, {"imported": True, "train": train.counts, "eval": eval_.counts,
                          "seconds": round(time.monotonic() - t0, 1)}
