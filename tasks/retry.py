"""Retry on infrastructure errors only: a failing test is a result, not an error to retry."""

from __future__ import annotations

from typing import Any

INFRA_ERRORS: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError, OSError)


def _infra_errors() -> tuple[type[BaseException], ...]:
    errs = list(INFRA_ERRORS)
    try:
        from environments.sandbox import SandboxError

        errs.append(SandboxError)
    except ImportError:
        pass
    try:
        from swerl.store import StoreUnavailable

        errs.append(StoreUnavailable)
    except ImportError:
        pass
    try:
        import docker.errors

        errs += [docker.errors.APIError, docker.errors.DockerException]
    except ImportError:
        pass
    return tuple(errs)


def is_infra_error(exc: BaseException) -> bool:
    return isinstance(exc, _infra_errors())


def retry_on_infra(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect `retry_condition_fn`: retry only when the failure is an infrastructure error."""
    try:
        state.result()
    except BaseException as exc:  # noqa: BLE001 - classifying, not handling
        return is_infra_error(exc)
    return False
