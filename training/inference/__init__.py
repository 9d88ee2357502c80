"""Inference backends: token ids in, token ids and behaviour logprobs out.

``make_backend(cfg.rollout)`` picks one: ``hf`` (transformers in process, the CPU default),
``openai`` (any OpenAI-compatible server over HTTP, e.g. ``vllm serve``), ``vllm`` (vLLM in
process, its CPU or CUDA build; where it is not installed, ``hf`` with a warning).
"""

from __future__ import annotations

import logging
from typing import Any

from swerl.config import RolloutConfig
from training.inference.base import Completion, InferenceBackend, SamplingParams

__all__ = ["Completion", "InferenceBackend", "SamplingParams", "make_backend"]

log = logging.getLogger(__name__)


def make_backend(rollout: RolloutConfig, engine_kwargs: dict[str, Any] | None = None) -> InferenceBackend:
    """`engine_kwargs`: vLLM engine arguments the GPU layout decides (training.layout)."""
    if rollout.backend == "hf":
        # multi-turn episodes re-send their whole context each turn: reuse the earlier turns' KV
        from training.inference.prefix_cache import PrefixCachingHFBackend
        return PrefixCachingHFBackend(rollout.model, dtype=rollout.dtype, seed=rollout.seed,
                                      threads=rollout.infer_threads)
    if rollout.backend == "openai":
        if not rollout.server_url:
            raise ValueError("rollout.backend=openai needs rollout.server_url (e.g. http://127.0.0.1:8000)")
        from training.inference.openai_client import OpenAIBackend
        return OpenAIBackend(rollout.server_url, model=rollout.model)
    if rollout.backend == "vllm":
        from training.inference.vllm_backend import VLLMBackend, import_vllm
        try:
            import_vllm()  # before resolving (maybe downloading) the model
        except ImportError as err:
            log.warning("rollout.backend=vllm: %s; falling back to rollout.backend=hf", err)
            return make_backend(rollout.model_copy(update={"backend": "hf"}))
        return VLLMBackend(rollout.model, dtype=rollout.dtype, seed=rollout.seed, engine=rollout.vllm,
                           threads=rollout.infer_threads, **(engine_kwargs or {}))
    raise ValueError(f"unknown rollout.backend {rollout.backend!r}")
