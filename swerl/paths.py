"""Where swerl keeps machine-wide caches (models, images' build contexts) and per-project state."""

from __future__ import annotations

import os
from pathlib import Path


def swerl_home() -> Path:
    """Machine-wide cache, shared by every checkout: `$SWERL_HOME`, default `~/.cache/swerl`."""
    p = Path(os.environ.get("SWERL_HOME", Path.home() / ".cache" / "swerl")).expanduser()
    p.mkdir(parents=True, exist_ok=True)
    return p


def state_dir() -> Path:
    """Per-working-directory state: the default store and the MLflow SQLite file (`.swerl/`)."""
    p = Path(os.environ.get("SWERL_STATE", ".swerl")).resolve()
    p.mkdir(parents=True, exist_ok=True)
    return p
