"""Inference backends: token ids in, token ids and behaviour logprobs out.

``make_backend(cfg.rollout)`` picks one: ``hf`` (transformers in process, the CPU default),
``openai`` (any OpenAI-compatible server over HTTP), ``vllm`` (in process on GPU workers).
"""

from __future__ import annotations

from swerl.config import RolloutConfig
from training.inference.base import Completion, InferenceBackend, SamplingParams

__all__ = ["Completion", "InferenceBackend", "SamplingParams", "make_backend"]


def make_backend(rollout: RolloutConfig) -> InferenceBackend:
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
        import_vllm()  # fail before resolving (maybe downloading) the model
        return VLLMBackend(rollout.model, dtype=rollout.dtype, seed=rollout.seed)
    raise ValueError(f"unknown rollout.backend {rollout.backend!r}")
