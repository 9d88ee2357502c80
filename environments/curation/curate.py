"""`curate_synth`: the whole synthesis stage, cached per project, ending in two datasets.

Work is keyed by content hashes: a project's tasks are stored under
`curation/synth/{name}-{version}/{cache_key}.json` (project spec + curation options + pipeline
version), and a dataset's validation report under `curation/validation/{dataset hash}.json`. Re-running
the same config therefore rebuilds nothing: it reads the per-project results, re-derives the
same datasets (same content, same hash) and finds them already saved. Statements are written
again from each task's stored evidence on every read, so a better statement writer changes the
datasets without any test run; a result of an older pipeline version that `restate` knows is
upgraded (one test run per task) instead of searched again.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Literal

from environments.curation.dataset import DatasetRef, counts, dataset_hash, ensure_dataset, save_dataset
from environments.curation.projects import Project, check_disjoint, default_split, resolve
from environments.curation.restate import UPGRADABLE, restate_project
from environments.curation.splits import make_splits
from environments.curation.synth import (
    SYNTH_VERSION, Interrupted, ProjectResult, SynthOptions, cache_key, describe, synth_project,
)
from environments.curation.validate import validate_tasks
from environments.images import base_for, build_env_image
from environments.records import TaskInstance
from swerl.config import SwerlConfig
from swerl.store import Store

Progress = Callable[[str], None]
Validate = Literal["none", "sample", "all"]


class CurationError(RuntimeError):
    """A project could not be curated at all (image build, its suite, the sandbox)."""


def project_cache_key(project: Project, opts: SynthOptions, version: str = SYNTH_VERSION) -> str:
    return f"curation/synth/{project.name}-{project.version}/{cache_key(project, opts, version)}.json"


def load_result(store: Store, key: str) -> ProjectResult:
    """A stored project result, its statements written again from the evidence it carries."""
    saved = store.get_json(key)
    evidence, sources = saved.get("evidence", {}), saved.get("test_sources", {})
    tasks = [TaskInstance.from_dict(t) for t in saved["tasks"]]
    tasks = [describe(t, evidence[t.instance_id], sources) if t.instance_id in evidence else t for t in tasks]
    return ProjectResult(saved["project"], tasks, saved["stats"], evidence, sources)


def save_result(store: Store, key: str, result: ProjectResult) -> None:
    store.put_json(key, {"project": result.project, "stats": result.stats,
                         "tasks": [t.to_dict() for t in result.tasks],
                         "evidence": result.evidence, "test_sources": result.test_sources})


def curate_project(project: Project, opts: SynthOptions, cfg: SwerlConfig, store: Store,
                   progress: Progress, stop: threading.Event | None = None) -> tuple[ProjectResult, bool]:
    """One project's tasks: from the store when this exact work was done before, upgraded
    when an older pipeline did it, else synthesised."""
    key = project_cache_key(project, opts)
    if store.exists(key):
        return load_result(store, key), True
    old = next((k for k in (project_cache_key(project, opts, v) for v in UPGRADABLE) if store.exists(k)), None)
    spec = project.env_spec()
    t0 = time.monotonic()
    tag = build_env_image(spec, base_for(spec, progress), progress=lambda line: None)
    progress(f"[{project.key}] environment image {tag} ({time.monotonic() - t0:.0f} s)")
    if old:
        result = restate_project(project, load_result(store, old), tag, cfg.environment, opts, progress, stop)
    else:
        result = synth_project(project, tag, cfg.environment, opts, progress, stop)
        result.stats["env_image_s"] = round(time.monotonic() - t0 - result.stats.get("seconds", 0), 1)
    save_result(store, key, result)
    return result, False


def projects_from(cfg: SwerlConfig) -> tuple[list[Project], list[Project]]:
    train = resolve(cfg.data.projects_train, "train") if cfg.data.projects_train else default_split("train")
    eval_ = resolve(cfg.data.projects_eval, "eval") if cfg.data.projects_eval else default_split("eval")
    check_disjoint(train, eval_)
    return train, eval_


def _sample(tasks: list[TaskInstance], per_project: int, seed: int) -> list[TaskInstance]:
    by_project: dict[str, list[TaskInstance]] = {}
    for t in tasks:
        by_project.setdefault(t.project, []).append(t)
    rng = random.Random(seed)
    out = []
    for name in sorted(by_project):
        group = sorted(by_project[name], key=lambda t: t.instance_id)
        out += rng.sample(group, min(per_project, len(group)))
    return out


def validated(tasks: list[TaskInstance], mode: Validate, cfg: SwerlConfig, store: Store, digest: str,
              workers: int, progress: Progress) -> tuple[list[TaskInstance], dict[str, Any]]:
    """Grade gold and empty patches on real instance images (all tasks, or a few per project);
    tasks that fail for a task reason are dropped, infra failures are reported and kept out of
    the count of valid tasks but never silently treated as invalid."""
    if mode == "none" or not tasks:
        return tasks, {"mode": mode}
    key = f"curation/validation/{digest}-{mode}.json"
    if store.exists(key):
        report = store.get_json(key)
    else:
        chosen = tasks if mode == "all" else _sample(tasks, 2, cfg.data.seed)
        rep = validate_tasks(chosen, cfg.environment, workers, progress)
        report = rep.to_dict()
        if report["summary"]["infra_errors"] == 0:  # only a clean verdict is worth caching
            store.put_json(key, report)
    bad = {c["instance_id"] for c in report["checks"] if not c["ok"] and not c["infra"]}
    infra = [c["instance_id"] for c in report["checks"] if c["infra"]]
    if infra:
        progress(f"[validate] {len(infra)} tasks could not be checked (infrastructure): {infra[:5]}")
    return [t for t in tasks if t.instance_id not in bad], {"mode": mode, **report["summary"]}


def curate_pinned(cfg: SwerlConfig, store: Store, progress: Progress = print
                  ) -> tuple[DatasetRef, DatasetRef, dict[str, Any]] | None:
    """The datasets `cfg.data` pins by hash (from the store or the checkout's shipped copies),
    or None when nothing is pinned. Nothing is synthesised: the same tasks on every machine."""
    d = cfg.data
    if not (d.train_hash and d.eval_hash):
        return None
    t0 = time.monotonic()
    train = ensure_dataset(store, d.train_dataset, d.train_hash)
    eval_ = ensure_dataset(store, d.eval_dataset, d.eval_hash)
    stats = {"pinned": True, "train": train.counts, "eval": eval_.counts, "seconds": round(time.monotonic() - t0, 1)}
    progress(f"curation: pinned datasets {train.name}@{train.hash} ({train.counts.get('total')} tasks), "
             f"{eval_.name}@{eval_.hash} ({eval_.counts.get('total')} tasks) in {stats['seconds']} s")
    return train, eval_, stats


def curate_synth(cfg: SwerlConfig, store: Store, progress: Progress = print, workers: int = 2,
                 validate: Validate = "sample", strict: bool = False, options: dict[str, Any] | None = None,
                 projects: tuple[list[Project], list[Project]] | None = None,
                 ) -> tuple[DatasetRef, DatasetRef, dict[str, Any]]:
    """Synthesise, split, validate and save the train and eval datasets of `cfg.data`.

    `workers` projects are synthesised at once (each in its own sandbox). A project that fails
    (its image does not build, its suite does not run) is reported in `stats["errors"]`, and
    with `strict` raised as CurationError after the others finished. `options` overrides
    SynthOptions fields (e.g. `{"time_budget_s": 600}`); `projects` replaces the config's
    (train, eval) project lists.
    """
    t0 = time.monotonic()
    train_projects, eval_projects = projects or projects_from(cfg)
    check_disjoint(train_projects, eval_projects)
    opts = SynthOptions.from_config(cfg.data, **(options or {}))
    results, errors, hits = _synthesise_all(train_projects + eval_projects, opts, cfg, store, progress, workers)
    if strict and errors:
        raise CurationError("projects failed: " + "; ".join(f"{k}: {v[:300]}" for k, v in errors.items()))

    def gather(projects: list[Project]) -> list[TaskInstance]:
        return [t for p in projects if p.key in results for t in results[p.key].tasks]

    splits = make_splits(gather(train_projects), gather(eval_projects))
    train, train_val = validated(splits.train, validate, cfg, store, dataset_hash(splits.train), workers, progress)
    eval_, eval_val = validated(splits.eval, validate, cfg, store, dataset_hash(splits.eval), workers, progress)
    for split, kept, assigned in (("train", train, train_projects), ("eval", eval_, eval_projects)):
        if assigned and not kept:
            raise CurationError(empty_split(split, assigned, results, errors))
    config = {"data": cfg.data.model_dump(mode="json"), "synth": opts.to_dict(),
              "projects": {"train": [p.key for p in train_projects], "eval": [p.key for p in eval_projects]},
              "validation": validate}
    train_ref = save_dataset(store, cfg.data.train_dataset, train, config)
    eval_ref = save_dataset(store, cfg.data.eval_dataset, eval_, config)
    stats = {
        "projects": {k: r.stats for k, r in sorted(results.items())},
        "errors": errors,
        "cache_hits": sorted(hits),
        "splits": splits.counts(),
        "validation": {"train": train_val, "eval": eval_val},
        "train": counts(train),
        "eval": counts(eval_),
        "reasons": dict(sum((Counter(r.stats.get("reasons", {})) for r in results.values()), Counter())),
        "seconds": round(time.monotonic() - t0, 1),
    }
    progress(f"curation: {len(train)} train tasks ({train_ref.hash}), {len(eval_)} eval tasks "
             f"({eval_ref.hash}) in {stats['seconds']} s")
    return train_ref, eval_ref, stats


def empty_split(split: str, projects: list[Project], results: dict[str, ProjectResult],
                errors: dict[str, str]) -> str:
    """Why a split that has projects kept no task, project by project."""
    why = []
    for p in projects:
        if p.key in errors:
            why.append(f"{p.key}: {errors[p.key][:600]}")
        else:
            reasons = results[p.key].stats.get("reasons", {}) if p.key in results else {}
            why.append(f"{p.key}: 0 tasks kept (candidates by outcome: {reasons or 'none'})")
    return f"the {split} split is empty, nothing was saved: " + "; ".join(why)


def _synthesise_all(projects: list[Project], opts: SynthOptions, cfg: SwerlConfig, store: Store,
                    progress: Progress, workers: int) -> tuple[dict[str, ProjectResult], dict[str, str], list[str]]:
    """Every project's result, `workers` at a time: (results, errors, cache hits) by project key."""
    results: dict[str, ProjectResult] = {}
    errors: dict[str, str] = {}
    hits: list[str] = []

    stop = threading.Event()

    def one(project: Project) -> None:
        if stop.is_set():
            return
        try:
            res, hit = curate_project(project, opts, cfg, store, progress, stop)
        except Interrupted:
            return
        except Exception as e:  # reported per project; the others still finish
            errors[project.key] = f"{type(e).__name__}: {str(e)[:1500]}"
            progress(f"[{project.key}] FAILED: {errors[project.key][:500]}")
            return
        results[project.key] = res
        if hit:
            hits.append(project.key)
        progress(f"[{project.key}] {len(res.tasks)} tasks{' (cached)' if hit else ''}")

    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    try:
        list(pool.map(one, projects))
    except BaseException:  # Ctrl-C / SIGTERM: workers stop at their next candidate, sandboxes close
        stop.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return results, errors, hits
