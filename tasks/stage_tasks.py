"""Prefect tasks for the pipeline stages: one per retryable unit, each a thin call into
training.stages.

Retries happen on infrastructure errors only (`tasks.retry`). Every unit is idempotent through
the object store (finished episodes, complete checkpoints and reports are found and reused), so
a retry or a re-run of the flow never redoes finished work. Tags `gpu` and `sandbox` carry the
concurrency limits that `swerl deploy` creates.
"""

from __future__ import annotations

from typing import Any

from prefect import task

from environments.records import TaskInstance
from tasks.reports import publish_evaluation
from tasks.retry import RETRYABLE_TASK
from tasks.run_context import RunRef, open_run, timed
from tasks.traces import log_evaluation_traces
from training import data, stages
from training.run import tasks_hash


def _tasks(dicts: list[dict[str, Any]]) -> list[TaskInstance]:
    return [TaskInstance.from_dict(d) for d in dicts]


@task(name="load-tasks", tags=["sandbox"], **RETRYABLE_TASK)
def load_tasks(ref: RunRef, split: str) -> list[dict[str, Any]]:
    """The split's tasks with their images built (the image build is the retryable part)."""
    with timed(ref, f"data-{split}"):
        t = open_run(ref)
        tasks = data.load_split(t.ctx, split)
        dataset_hash = tasks_hash(tasks)
        t.tracker.log_dataset_input(f"{split}-tasks", dataset_hash,
                                    t.ctx.cfg.data.tasks_file or t.ctx.store.url("datasets"),
                                    len(tasks), context=split, run_id=t.parent())
        return [x.to_dict() for x in tasks]


@task(name="evaluate", tags=["gpu", "sandbox"], **RETRYABLE_TASK)
def evaluate(ref: RunRef, label: str, policy: str, eval_tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """The evaluation's report, its outputs published with it (one retryable unit)."""
    with timed(ref, f"eval-{label}"):
        report = stages.evaluate(open_run(ref).ctx, label, policy, _tasks(eval_tasks))
        publish_evaluation(open_run(ref), report["label"])
        log_evaluation_traces(open_run(ref), report["label"])
        return report


@task(name="difficulty-filter", tags=["gpu", "sandbox"], **RETRYABLE_TASK)
def difficulty_filter(ref: RunRef, train_tasks: list[dict[str, Any]], policy: str = "base") -> list[dict[str, Any]]:
    with timed(ref, "difficulty"):
        ctx = open_run(ref).ctx
        if not ctx.cfg.difficulty.enabled:
            return train_tasks
        return [t.to_dict() for t in stages.difficulty_filter(ctx, _tasks(train_tasks), policy)]


@task(name="rft", tags=["gpu", "sandbox"], **RETRYABLE_TASK)
def rft(ref: RunRef, train_tasks: list[dict[str, Any]], policy: str = "base") -> str:
    with timed(ref, "rft"):
        t = open_run(ref)
        name = stages.rft_stage(t.ctx, _tasks(train_tasks), policy)
        if name != policy:
            _log_checkpoint(ref, "rft", name)
        return name


@task(name="dapo-iteration", tags=["gpu", "sandbox"], **RETRYABLE_TASK)
def dapo_iteration(ref: RunRef, dapo_stage: stages.DAPOStagePlan, iteration: int, pool: list[dict[str, Any]],
                   policy: str) -> tuple[str, dict[str, float]]:
    """Iteration `iteration` of one DAPO stage."""
    with timed(ref, "dapo"):
        name, metrics = stages.dapo_iteration(open_run(ref).ctx, dapo_stage, iteration, _tasks(pool), policy)
        _log_checkpoint(ref, "dapo", name)
        return name, metrics


def _log_checkpoint(ref: RunRef, stage: str, name: str) -> None:
    """Record where the checkpoint lives (the store is the artifact of record: it is large)."""
    t = open_run(ref)
    t.tracker.set_tags({f"checkpoint.{name}": t.ctx.store.url(t.ctx.key("checkpoints", name))}, run_id=t.child(stage))
