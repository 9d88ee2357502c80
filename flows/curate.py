"""The curation flow: synthesise validated tasks from real PyPI projects into train/eval datasets.

The work is cached per project by content hash in the store (environments/curation), so a
re-run of the same config is a cache hit and a crashed run continues with the missing projects.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, task
from prefect.artifacts import create_table_artifact

from tasks.run_context import RunRef, tracked
from tasks.stage_tasks import UNIT


def curate_datasets(ref: RunRef) -> dict[str, Any]:
    """Both datasets of the run's config: the pinned ones, else synthesised (or found cached);
    logged to MLflow as dataset inputs."""
    from environments.curation.curate import curate_pinned, curate_synth

    t = tracked(ref)
    train, evals, stats = (curate_pinned(t.ctx.cfg, t.ctx.store, progress=print)
                           or curate_synth(t.ctx.cfg, t.ctx.store, progress=print))
    rid = t.child("curate")
    for ref_, split in ((train, "train"), (evals, "eval")):
        t.tracker.log_dataset_input(ref_.name, ref_.hash, ref_.uri, ref_.counts["total"], context=split, run_id=rid)
        t.tracker.log_dataset_input(ref_.name, ref_.hash, ref_.uri, ref_.counts["total"], context=split, run_id=t.parent())
    t.tracker.log_metrics({"train_tasks": train.counts["total"], "eval_tasks": evals.counts["total"]}, run_id=rid)
    return {"train": train.to_dict(), "eval": evals.to_dict(), "stats": stats}


@task(name="curate", tags=["sandbox"], **UNIT)
def curate_task(ref: RunRef) -> dict[str, Any]:
    from tasks.run_context import timed

    with timed(ref, "curate"):
        return curate_datasets(ref)


@flow(name="curate", log_prints=True)
def curate(preset: str = "cpu-demo", overrides: list[str] = [], run_id: str | None = None  # noqa: B006
           ) -> dict[str, Any]:
    """Build (or find) the preset's train and eval datasets."""
    ref = RunRef.create(preset, overrides, run_id)
    out = curate_task(ref)
    rows = [{"split": split, "name": d["name"], "hash": d["hash"], "tasks": d["counts"]["total"]}
            for split, d in (("train", out["train"]), ("eval", out["eval"]))]
    create_table_artifact(rows, key="swerl-datasets", description="curated datasets")
    return out
