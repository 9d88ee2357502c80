"""The curation flow: synthesise validated tasks from real PyPI projects into train/eval datasets
(or take the preset's pinned ones); a re-run of the same config is a cache hit."""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.artifacts import create_table_artifact

from swerl.config import DEFAULT_PRESET
from tasks.curate_tasks import curate_task
from tasks.run_context import RunRef


@flow(name="curate", log_prints=True)
def curate(preset: str = DEFAULT_PRESET, overrides: list[str] = [], run_id: str | None = None  # noqa: B006
           ) -> dict[str, Any]:
    """Build (or find) the preset's train and eval datasets."""
    ref = RunRef.create(preset, overrides, run_id)
    out = curate_task(ref)
    rows = [{"split": split, "name": d["name"], "hash": d["hash"], "tasks": d["counts"]["total"]}
            for split, d in (("train", out["train"]), ("eval", out["eval"]))]
    create_table_artifact(rows, key="swerl-datasets", description="curated datasets")
    return out
