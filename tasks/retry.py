"""Which failures a Prefect task retries, and the task options that say so.

Only infrastructure errors are retried: a failing test is a result, not an error to retry.
"""

from __future__ import annotations

from typing import Any

import docker.errors
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff

from environments.sandbox import SandboxError
from swerl.store import StoreUnavailable

INFRA_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionError, TimeoutError, OSError, SandboxError, StoreUnavailable,
    docker.errors.APIError, docker.errors.DockerException,
)


def is_infra_error(exc: BaseException) -> bool:
    return isinstance(exc, INFRA_ERRORS)


def retry_on_infra(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect `retry_condition_fn`: retry only when the failure is an infrastructure error."""
    try:
        state.result()
    except BaseException as exc:  # noqa: BLE001 - classifying, not handling
        return is_infra_error(exc)
    return False


# `@task(**RETRYABLE_TASK)`: every pipeline task is an idempotent unit (it finds its finished work
# in the store), so it may be retried as a whole. Nothing is cached and no result is persisted:
# the store is the only record (ARCHITECTURE.md, "Tracking and orchestration").
def retry_delays(first_s: float) -> Any:
    """Prefect's exponential backoff starting at `first_s` (orchestration.retry_delay_s)."""
    return exponential_backoff(backoff_factor=first_s)


RETRYABLE_TASK: dict[str, Any] = dict(
    retries=3, retry_delay_seconds=retry_delays(10.0), retry_jitter_factor=0.5,
    retry_condition_fn=retry_on_infra, cache_policy=NO_CACHE, persist_result=False, log_prints=True)
