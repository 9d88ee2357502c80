"""`models:/swerl-agent@champion` -> a local checkpoint directory, through the MLflow registry.

Registered versions point at checkpoints in the object store (tags `swerl.run_id` and
`swerl.policy` name the store key); the base model is registered by its local path.
"""

from __future__ import annotations

from pathlib import Path

from swerl.config import SwerlConfig
from swerl.model_cache import register_uri_resolver


def resolve_registry_uri(uri: str, cfg: SwerlConfig) -> str:
    from mlflow import MlflowClient

    from swerl.paths import state_dir
    from swerl.store import open_store
    from tasks.tracking import resolve_tracking_uri
    from training.checkpoint import is_complete

    ref = uri.split(":/", 1)[1].lstrip("/")
    tracking = resolve_tracking_uri(cfg.tracking.uri)
    client = MlflowClient(tracking_uri=tracking, registry_uri=tracking)
    if "@" in ref:
        name, alias = ref.split("@", 1)
        mv = client.get_model_version_by_alias(name, alias)
    else:
        name, version = ref.rsplit("/", 1)
        mv = client.get_model_version(name, version)
    tags = mv.tags or {}
    if tags.get("swerl.policy", "base") == "base" or Path(mv.source).exists():
        return mv.source
    key = f"runs/{tags['swerl.run_id']}/checkpoints/{tags['swerl.policy']}"
    local = state_dir() / "models" / key
    if not is_complete(local):
        import shutil

        shutil.rmtree(local, ignore_errors=True)
        open_store(cfg.storage).get_dir(key, local)
    return str(local)


def install(cfg: SwerlConfig) -> None:
    """Teach `swerl.model_cache.resolve_model` the `models:/` scheme for this config."""
    register_uri_resolver("models", lambda uri: resolve_registry_uri(uri, cfg))
