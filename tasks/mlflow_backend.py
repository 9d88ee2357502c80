"""How swerl reaches MLflow: the URI and client for a config, which errors are worth waiting
out, and the one retrying call that tracking (`tasks.tracking`) and the model registry
(`tasks.registry`) both use."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from swerl.config import SwerlConfig
from swerl.store import is_transient as is_transient_io
from swerl.store import retry_call

T = TypeVar("T")

# MLflow error codes that no amount of waiting fixes (a changed param, a deleted run, bad name).
PERMANENT_CODES = frozenset({
    "INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "RESOURCE_ALREADY_EXISTS",
    "INVALID_STATE", "BAD_REQUEST", "PERMISSION_DENIED", "UNAUTHENTICATED",
    "CUSTOMER_UNAUTHORIZED", "FEATURE_DISABLED", "ENDPOINT_NOT_FOUND", "NOT_IMPLEMENTED",
})


class TrackingUnavailable(RuntimeError):
    """The tracking backend stayed unreachable for the whole retry window."""


def is_transient(err: BaseException) -> bool:
    """MLflow wraps connection errors and database locks into MlflowException(INTERNAL_ERROR /
    TEMPORARILY_UNAVAILABLE); artifact uploads raise the storage client's own errors."""
    if isinstance(err, MlflowException):
        return err.error_code not in PERMANENT_CODES
    return is_transient_io(err)


def resolve_tracking_uri(uri: str) -> str:
    """`sqlite:///rel.db` is relative to the working directory: pin it, and create its folder."""
    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///"):]).expanduser().resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{path}"
    return uri


def bound_http_retries() -> None:
    """Our own retry window replaces MLflow's HTTP retries (7 with backoff by default: minutes
    per call), so that `retry_s` bounds how long any call can block. Exported values win."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")


def mlflow_uri(cfg: SwerlConfig) -> str:
    """`cfg.tracking.uri` as clients are given it; call before making a client (it bounds the
    client's HTTP retries)."""
    bound_http_retries()
    return resolve_tracking_uri(cfg.tracking.uri)


def new_client(uri: str) -> MlflowClient:
    """A client for tracking and the registry, both at `uri`."""
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def call_with_retry(what: str, fn: Callable[[], T], uri: str, retry_s: float) -> T:
    """A call that must happen: retried on transient errors for `retry_s` seconds, then
    `TrackingUnavailable` (its message names `what` and `uri`)."""
    return retry_call(fn, f"tracking: {what} ({uri})", retry_s,
                      transient=is_transient, unavailable=TrackingUnavailable)


def check_tracking(cfg: SwerlConfig) -> str:
    """One cheap read against the tracking backend (for `swerl doctor`); raises if unusable.

    Creates nothing but the SQLite schema of a fresh embedded database.
    """
    uri = mlflow_uri(cfg)
    MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    return uri
