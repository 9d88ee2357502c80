"""Shared pieces of the tests on the real vLLM CPU engine (import the fixtures you use).

One engine per test module, eager (no compile) and with a small pinned KV cache, so that a
module pays one ~50 s start; ``shifted_checkpoint`` is a policy update as the trainer writes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from swerl.config import VLLMEngineConfig

# the test engine: no compile, a 1 GiB KV cache, short contexts
TEST_ENGINE = VLLMEngineConfig(enforce_eager=True, kv_cache_gib=1)
TEST_MAX_MODEL_LEN = 2048  # what gpu.max_model_len gives a run's engine


def hf_model(path: str | Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype="float32").eval()


def trainer_logprobs(model: Any, prompt: list[int], reply: list[int]) -> list[float]:
    """What the trainer computes for the reply tokens after the prompt (fp32, T=1)."""
    import torch

    from training.logprobs import naive_token_logprobs

    ids = torch.tensor([prompt + reply])
    with torch.no_grad():
        lp = naive_token_logprobs(model, ids, torch.ones_like(ids))[0]
    return [float(x) for x in lp[len(prompt) - 1:]]


@pytest.fixture(scope="session")
def shifted_checkpoint(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model with every weight moved by noise (10% of its std), saved by swerl's own
    ``save_checkpoint`` (tied embeddings: no lm_head.weight in the file), version "shifted-1"."""
    import torch
    from transformers import AutoTokenizer

    from training.checkpoint import save_checkpoint

    model = hf_model(default_model_dir)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * p.float().std() * 0.1)
    out = tmp_path_factory.mktemp("ckpt") / "shifted-1"
    return save_checkpoint(model, AutoTokenizer.from_pretrained(str(default_model_dir)), out,
                           {"version": "shifted-1"})
