"""Methods vLLM adds to its workers (``worker_extension_cls``): the in-place weight swap.

They run inside the engine's worker process, so one path serves the in-process engine
(``LLM.collective_rpc``) and a ``vllm serve`` server (``POST /collective_rpc``, dev mode) alike.
vLLM's own ``reload_weights`` reads the new safetensors into the live parameters, keeping the
engine, its KV cache and its compiled graphs. Nothing here imports vLLM: the worker is ``self``.
"""

from __future__ import annotations

import os
from typing import Any

# what `LLM(worker_extension_cls=...)` and `vllm serve --worker-extension-cls` are given
EXTENSION = "training.inference.vllm_sync.WeightSync"


def retie_lm_head(model: Any) -> bool:
    """Point a tied output head at the (reloaded) input embeddings and redo its kernel prep.

    A tied checkpoint has no ``lm_head.weight``, so the reload never visits the head: on CPU it
    would keep the packed GEMM copy vLLM made from the old embeddings at start. True if tied.
    """
    config = getattr(model, "config", None)
    head = getattr(model, "lm_head", None)
    inner = getattr(model, "model", None)
    embed = getattr(inner, "embed_tokens", None)
    if not getattr(config, "tie_word_embeddings", False) or head is None or embed is None:
        return False
    head.weight = embed.weight
    head.quant_method.process_weights_after_loading(head)
    return True


class WeightSync:
    """Mixed into vLLM's worker class; ``self`` is the worker."""

    def swerl_reload(self, path: str) -> dict[str, Any]:
        """Load the HF safetensors checkpoint at ``path`` into the running model, in place."""
        self.reload_weights(weights_path=path)  # type: ignore[attr-defined]
        tied = retie_lm_head(self.model_runner.get_model())  # type: ignore[attr-defined]
        return {"path": path, "tied_head": tied, "pid": os.getpid()}

    def swerl_pid(self) -> int:
        """The worker's process id: a test's proof that a swap kept the engine's process."""
        return os.getpid()
