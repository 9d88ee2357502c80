"""Which tasks a run trains and evaluates on: the curriculum selection and the pinned datasets."""

from __future__ import annotations

import logging
from collections import defaultdict
from pathlib import Path

from environments.curation.dataset import ensure_dataset, latest_hash, load_dataset
from environments.grading import gold_out_of_scope, scope_cache
from environments.images import build_images
from environments.records import TaskInstance, at_hint_level, load_tasks
from swerl.config import CONFIG_DIR, DataConfig
from swerl.paths import swerl_home
from training.run import RunContext

log = logging.getLogger(__name__)


def restated(tasks: list[TaskInstance], level: int, exact: bool = True) -> list[TaskInstance]:
    """Each task stated at hint `level`; with `exact`, only those that can be stated so."""
    tasks = [at_hint_level(t, level) for t in tasks]
    return [t for t in tasks if t.meta.get("hint_level") == level] if exact else tasks


def select_tasks(tasks: list[TaskInstance], d: DataConfig) -> list[TaskInstance]:
    """The curriculum: each task at the configured hint level, only the configured bug kinds,
    then the per-project and total caps (in file order, so a run sees the same tasks again)."""
    tasks = restated(tasks, d.hint_level, d.exact_hint_level)
    if d.modifiers is not None:
        tasks = [t for t in tasks if set(str(t.meta.get("modifier", "")).split("+")) <= set(d.modifiers)]
    if d.max_tasks_per_project:
        per_project: dict[str, int] = defaultdict(int)
        capped = []
        for t in tasks:
            per_project[t.project] += 1
            if per_project[t.project] <= d.max_tasks_per_project:
                capped.append(t)
        tasks = capped
    return tasks[: d.max_tasks] if d.max_tasks else tasks


def pinned_dataset(ctx: RunContext, split: str, name: str) -> str:
    """The hash of the dataset this run uses for `split`: the one the config pins (`data.train_hash`,
    `eval_hash`), else the newest at the run's first load; that one from then on, so a resumed run
    never evaluates or trains on another set than it started with (kept in `runs/<id>/datasets.json`)."""
    key = ctx.key("datasets.json")
    pins = ctx.store.get_json(key) if ctx.store.exists(key) else {}
    data = ctx.cfg.data if ctx.cfg is not None else None
    wanted = data.pinned_hash(split) if data is not None else None
    if wanted:
        ensure_dataset(ctx.store, name, wanted)  # a stage run on its own may come before curation
    newest = wanted or latest_hash(ctx.store, name)
    pin = pins.get(split)
    if pin and pin["name"] == name:
        if wanted and pin["hash"] != wanted:
            raise RuntimeError(f"run {ctx.run_id} uses {split} dataset {name}@{pin['hash']}, but its config "
                               f"now pins {wanted}: start a new run (another run id) for another dataset")
        if pin["hash"] != newest:
            log.warning("run %s keeps its %s dataset %s@%s (the newest is %s)", ctx.run_id, split, name,
                        pin["hash"], newest)
        return pin["hash"]
    pins[split] = {"name": name, "hash": newest}
    ctx.store.put_json(key, pins)
    return newest


def find_file(path: str) -> str:
    """A relative path from a preset means the working directory's, else the project checkout's."""
    p = Path(path)
    if p.is_absolute() or p.exists():
        return str(p)
    return str(CONFIG_DIR.parent / p)


def load_split(ctx: RunContext, split: str) -> list[TaskInstance]:
    """The train or eval tasks of this run, with their instance images built.

    A task whose image cannot be built, or a train task whose reference patch the grader would
    refuse, is reported and skipped, not fatal: one broken project must not take the run down.
    """
    d = ctx.cfg.data
    path = d.tasks_file if split == "train" else d.eval_tasks_file
    if path:
        report = load_tasks(find_file(path))
        for err in report.errors:
            log.warning("skipping malformed task: %s", err)
        tasks = report.tasks
    else:
        name = d.train_dataset if split == "train" else d.eval_dataset
        tasks = load_dataset(ctx.store, name, pinned_dataset(ctx, split, name))
    tasks = select_tasks(tasks, d)
    # one call for the whole set: shared layers are looked up once, not once per task (~25 s
    # a demo run), and a task without an image gets its reason while the rest go on
    images = build_images(tasks, progress=log.info, workers=2)
    for iid, why in images.errors.items():
        log.error("skipping task %s: its image could not be built: %s", iid, images.details.get(iid, why))
    ready = [t for t in tasks if t.instance_id in images.images]
    for t in ready:
        t.image = images.images[t.instance_id]
    # training on a task whose real fix is graded unresolved teaches nothing; an eval set stays as
    # given (a benchmark's denominator), the grader's refusal reported
    refused = gold_out_of_scope(ready, ctx.cfg.environment, cache=scope_cache(swerl_home() / "scope-checks"))
    for iid, problems in refused.items():
        log.error("%s task %s: the grader refuses its own reference patch (%s)",
                  "skipping train" if split == "train" else "keeping eval", iid, "; ".join(problems))
    if split == "train":
        ready = [t for t in ready if t.instance_id not in refused]
    if not ready:
        raise RuntimeError(f"no usable {split} tasks (of {len(tasks)})")
    return ready
