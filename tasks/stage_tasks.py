"""Prefect tasks: one per retryable unit of the pipeline, each a thin call into training.stages.

Retries happen on infrastructure errors only (`retry_on_infra`); a failing test is a result.
Every unit is idempotent through the object store (finished episodes, complete checkpoints and
reports are found and reused), so a retry or a re-run of the flow never redoes finished work.
Tags `gpu` and `sandbox` carry the concurrency limits that `swerl deploy` creates.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff

from environments.records import TaskInstance
from tasks.retry import retry_on_infra
from tasks.run_context import RunRef, timed, tracked
from training import data, stages
from training.run import tasks_hash

UNIT = dict(retries=3, retry_delay_seconds=exponential_backoff(backoff_factor=10), retry_jitter_factor=0.5,
            retry_condition_fn=retry_on_infra, cache_policy=NO_CACHE, persist_result=True, log_prints=True)


def _tasks(dicts: list[dict[str, Any]]) -> list[TaskInstance]:
    return [TaskInstance.from_dict(d) for d in dicts]


@task(name="load-tasks", tags=["sandbox"], **UNIT)
def load_tasks(ref: RunRef, split: str) -> list[dict[str, Any]]:
    """The split's tasks with their images built (the image build is the retryable part)."""
    with timed(ref, f"data-{split}"):
        t = tracked(ref)
        tasks = data.load_split(t.ctx, split)
        dataset_hash = tasks_hash(tasks)
        t.tracker.log_dataset_input(f"{split}-tasks", dataset_hash,
                                    t.ctx.cfg.data.tasks_file or t.ctx.store.url("datasets"),
                                    len(tasks), context=split, run_id=t.parent())
        return [x.to_dict() for x in tasks]


@task(name="evaluate", tags=["gpu", "sandbox"], **UNIT)
def evaluate(ref: RunRef, label: str, policy: str, eval_tasks: list[dict[str, Any]]) -> dict[str, Any]:
    from tasks.registry_tasks import publish_evaluation  # here: registry_tasks imports this module

    with timed(ref, f"eval-{label}"):
        report = stages.evaluate(tracked(ref).ctx, label, policy, _tasks(eval_tasks))
        publish_evaluation(tracked(ref), report["label"])
        return report


@task(name="difficulty-filter", tags=["gpu", "sandbox"], **UNIT)
def difficulty_filter(ref: RunRef, train_tasks: list[dict[str, Any]], policy: str = "base") -> list[dict[str, Any]]:
    with timed(ref, "difficulty"):
        ctx = tracked(ref).ctx
        if not ctx.cfg.difficulty.enabled:
            return train_tasks
        return [t.to_dict() for t in stages.difficulty_filter(ctx, _tasks(train_tasks), policy)]


@task(name="rft", tags=["gpu", "sandbox"], **UNIT)
def rft(ref: RunRef, train_tasks: list[dict[str, Any]], policy: str = "base") -> str:
    with timed(ref, "rft"):
        t = tracked(ref)
        name = stages.rft_stage(t.ctx, _tasks(train_tasks), policy)
        if name != policy:
            _log_checkpoint(ref, "rft", name)
        return name


@task(name="dapo-iteration", tags=["gpu", "sandbox"], **UNIT)
def dapo_iteration(ref: RunRef, stage: stages.DAPOStagePlan, iteration: int, pool: list[dict[str, Any]],
                   policy: str) -> tuple[str, dict[str, float]]:
    with timed(ref, "dapo"):
        name, metrics = stages.dapo_iteration(tracked(ref).ctx, stage, iteration, _tasks(pool), policy)
        _log_checkpoint(ref, "dapo", name)
        return name, metrics


def _log_checkpoint(ref: RunRef, stage: str, name: str) -> None:
    """Record where the checkpoint lives (the store is the artifact of record: it is large)."""
    t = tracked(ref)
    t.tracker.set_tags({f"checkpoint.{name}": t.ctx.store.url(t.ctx.key("checkpoints", name))}, run_id=t.child(stage))
