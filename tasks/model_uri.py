"""`models:/swerl-agent@champion` -> a local checkpoint directory, through the MLflow registry.

A registered version points at its checkpoint through tags, not through its MLflow `source`
(which an MLflow server only accepts as a non-local URI): `swerl.checkpoint_key` is the store key
of a sealed checkpoint directory, and a version of the base model carries `swerl.base_model`,
the `rollout.model` it was evaluated with ("default", a hub id, a path).

Downloads are cached by content: the local directory is named by the store's hash of the
checkpoint and appears all at once (`Store.get_dir`), so an existing one is complete and current.
"""

from __future__ import annotations

from pathlib import Path

from swerl.config import SwerlConfig
from swerl.model_cache import ModelResolutionError, register_uri_resolver
from swerl.paths import state_dir
from swerl.store import open_store
from tasks.registry import ModelRegistry


def parse_models_uri(uri: str) -> tuple[str, str | None, str | None]:
    """`models:/name@alias` -> (name, None, alias); `models:/name/3` -> (name, "3", None)."""
    ref = uri.split(":/", 1)[1].lstrip("/")
    if "@" in ref:
        name, alias = ref.split("@", 1)
        return name, None, alias
    if "/" not in ref:
        raise ModelResolutionError(f"{uri}: expected models:/NAME@ALIAS or models:/NAME/VERSION")
    name, version = ref.rsplit("/", 1)
    return name, version, None


def checkpoint_key(tags: dict[str, str]) -> str | None:
    """The store key of a version's checkpoint; None for a version of the base model."""
    if tags.get("swerl.checkpoint_key"):
        return tags["swerl.checkpoint_key"]
    if tags.get("swerl.policy", "base") == "base":
        return None
    return f"runs/{tags['swerl.run_id']}/checkpoints/{tags['swerl.policy']}"  # versions registered before that tag existed


def fetch_checkpoint(store, key: str, cache_root: Path) -> Path:
    """A local copy of the sealed store directory `key`, downloaded once per content hash."""
    digest = store.dir_manifest(key)["hash"]
    local = cache_root / digest[:32]
    if local.is_dir():
        return local
    try:
        store.get_dir(key, local)
    except FileExistsError:  # another process finished the same download first
        if not local.is_dir():
            raise
    return local


def resolve_registry_uri(uri: str, cfg: SwerlConfig) -> str:
    """A registry URI -> something `swerl.model_cache.resolve_model` loads."""
    name, version, alias = parse_models_uri(uri)
    registry = ModelRegistry(cfg)
    if alias is not None:
        version = registry.get_version_by_alias(name, alias)
        if version is None:
            raise ModelResolutionError(f"{uri}: no version of {name!r} has the alias {alias!r} "
                                       f"(registry {registry.tracking_uri})")
    tags = registry.get_version_tags(name, version)
    key = checkpoint_key(tags)
    if key is None:
        return tags.get("swerl.base_model") or cfg.rollout.model
    store = open_store(cfg.storage)
    if not store.dir_complete(key):
        raise ModelResolutionError(f"{uri} (version {version}): checkpoint {store.url(key)} is missing or "
                                   "incomplete in the store")
    return str(fetch_checkpoint(store, key, state_dir() / "models" / "registry"))


def install(cfg: SwerlConfig) -> None:
    """Teach `swerl.model_cache.resolve_model` the `models:/` scheme for this config."""
    register_uri_resolver("models", lambda uri: resolve_registry_uri(uri, cfg))
