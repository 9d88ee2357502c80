"""The curation task: the run's train and eval datasets, imported, pinned or synthesised (the work is
cached per project in the store, see environments/curation), logged as MLflow dataset inputs."""

from __future__ import annotations

from typing import Any

from prefect import task

from environments.curation.curate import curate_pinned, curate_synth
from environments.curation.imported import curate_imported
from tasks.retry import RETRYABLE_TASK
from tasks.run_context import RunRef, open_run, timed


def curate_datasets(ref: RunRef) -> dict[str, Any]:
    """Both datasets of the run's config: imported (data.*_import), pinned, else synthesised (or
    found cached); logged to MLflow as dataset inputs."""
    t = open_run(ref)
    cfg, store = t.ctx.cfg, t.ctx.store
    train, evals, stats = (curate_imported(cfg, store, progress=print) or curate_pinned(cfg, store, progress=print)
                           or curate_synth(cfg, store, progress=print))
    rid = t.child("curate")
    for dataset, split in ((train, "train"), (evals, "eval")):
        n = dataset.counts["total"]
        t.tracker.log_dataset_input(dataset.name, dataset.hash, dataset.uri, n, context=split, run_id=rid)
        t.tracker.log_dataset_input(dataset.name, dataset.hash, dataset.uri, n, context=split, run_id=t.parent())
    t.tracker.log_metrics({"train_tasks": train.counts["total"], "eval_tasks": evals.counts["total"]}, run_id=rid)
    return {"train": train.to_dict(), "eval": evals.to_dict(), "stats": stats}


@task(name="curate", tags=["sandbox"], **RETRYABLE_TASK)
def curate_task(ref: RunRef) -> dict[str, Any]:
    with timed(ref, "curate"):
        return curate_datasets(ref)
