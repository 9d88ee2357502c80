"""Shared fixtures for tests that need the real default model (SmolLM2-135M-Instruct).

Import the fixtures you use into your test module (pytest finds imported fixtures):
    from tests.conftest_model import default_model_dir, hf_backend, chat_prompt
The first use on a machine downloads and converts the model (~30 s); later uses take < 1 s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    from swerl.model_cache import ensure_default_model

    return ensure_default_model(progress=lambda msg: None)


@pytest.fixture(scope="session")
def hf_backend(default_model_dir: Path) -> Any:
    from training.inference.hf import HFBackend

    backend = HFBackend(str(default_model_dir), seed=0)
    yield backend
    backend.close()


def chat_prompt(tokenizer: Any, user: str, system: str | None = None) -> list[int]:
    """Token ids of a one-message chat ready for the assistant's reply."""
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    out = tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return [int(t) for t in ids]


@pytest.fixture
def versioned_checkpoint(default_model_dir: Path, tmp_path: Path) -> Path:
    """The default weights under a new version name (files linked, not copied: 500 MB)."""
    import json

    ckpt = tmp_path / "ckpt-v1"
    ckpt.mkdir()
    for f in default_model_dir.iterdir():
        if f.name != "swerl.json":
            (ckpt / f.name).symlink_to(f)
    (ckpt / "swerl.json").write_text(json.dumps({"version": "test-v1"}))
    return ckpt


def tiny_model(dest: Path) -> Path:
    """A randomly initialised 2-layer model of SmolLM2's architecture with its real tokenizer
    (12 MB, saved in a second): a real HF checkpoint for tests of what handles checkpoints."""
    from swerl.model_cache import ensure_default_model
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    default = ensure_default_model(progress=lambda msg: None)
    config = AutoConfig.from_pretrained(default)
    config.update({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16})
    AutoModelForCausalLM.from_config(config).save_pretrained(dest)
    AutoTokenizer.from_pretrained(default).save_pretrained(dest)
    return dest


def stop_server(proc: Any, grace_s: float) -> None:
    """Stop a model server the tests started: SIGTERM, then SIGKILL after `grace_s`."""
    import subprocess

    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
