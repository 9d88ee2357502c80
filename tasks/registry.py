"""The MLflow model registry: versions of a registered model, their tags and aliases.

Not optional like metrics: a promotion decision must not vanish, so every call retries for
`cfg.tracking.retry_s` and then raises `TrackingUnavailable`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException

from swerl.config import SwerlConfig
from tasks.mlflow_backend import call_with_retry, mlflow_uri, new_client

T = TypeVar("T")


class ModelRegistry:
    """Reads and writes of `cfg.tracking.registered_model` (and any model named explicitly)."""

    def __init__(self, cfg: SwerlConfig, client: MlflowClient | None = None) -> None:
        self.model_name = cfg.tracking.registered_model
        self.retry_s = cfg.tracking.retry_s
        self.tracking_uri = mlflow_uri(cfg)
        self.client = client or new_client(self.tracking_uri)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        return call_with_retry(what, fn, self.tracking_uri, self.retry_s)

    def register_model(self, source_uri: str, run_id: str | None = None,
                       tags: Mapping[str, Any] | None = None, model_id: str | None = None) -> str:
        """A new version of `cfg.tracking.registered_model` pointing at `source_uri` (with
        `model_id`, the LoggedModel it is a version of)."""

        def create_model() -> None:
            try:
                self.client.create_registered_model(self.model_name)
            except MlflowException as e:
                if e.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise

        self._call(f"create registered model {self.model_name}", create_model)
        str_tags = {k: str(v) for k, v in (tags or {}).items()}
        version = self._call(f"register {source_uri}", lambda: self.client.create_model_version(
            self.model_name, source_uri, run_id=run_id, tags=str_tags, model_id=model_id))
        return str(version.version)

    def set_alias(self, name: str, alias: str, version: str | int) -> None:
        self._call(f"set alias {name}@{alias}",
                   lambda: self.client.set_registered_model_alias(name, alias, str(version)))

    def get_version_by_alias(self, name: str, alias: str) -> str | None:
        """The version behind `name@alias`, or None when the model or alias does not exist."""

        def lookup() -> str | None:
            try:
                return str(self.client.get_model_version_by_alias(name, alias).version)
            except MlflowException as e:
                if e.error_code in ("INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST"):
                    return None
                raise

        return self._call(f"get {name}@{alias}", lookup)

    def get_version(self, name: str, version: str | int) -> ModelVersion:
        """The full version: its tags and the MLflow run it was registered from."""
        return self._call(f"get {name} v{version}", lambda: self.client.get_model_version(name, str(version)))

    def get_version_tags(self, name: str, version: str | int) -> dict[str, str]:
        return self._call(f"read tags of {name} v{version}",
                          lambda: dict(self.client.get_model_version(name, str(version)).tags or {}))

    def set_version_tags(self, name: str, version: str | int, tags: Mapping[str, Any]) -> None:
        for key, value in tags.items():
            self._call(f"tag {name} v{version}", lambda k=key, v=value: self.client.set_model_version_tag(
                name, str(version), k, str(v)))

    def find_versions(self, name: str, tags: Mapping[str, str]) -> list[ModelVersion]:
        """Versions of `name` carrying all `tags` (keys with dots are fine), newest first."""
        if any("'" in str(v) for v in (name, *tags.values())):
            raise ValueError(f"registry search: quotes are not allowed in {name!r} / {dict(tags)}")
        where = " and ".join([f"name = '{name}'", *(f"tags.`{k}` = '{v}'" for k, v in tags.items())])
        found = self._call(f"search {name} versions", lambda: self.client.search_model_versions(where))
        return sorted(found, key=lambda mv: int(mv.version), reverse=True)
