"""vLLM in process, for GPU workers: same contract as the hf backend, continuous batching inside.

Started with ``logprobs_mode="processed_logprobs"`` so its logprobs follow the same definition as
the other backends (the distribution actually sampled). Weight swaps rebuild the engine: slower
than an in-place update but it cannot leave stale weights or a stale prefix cache behind.
"""

from __future__ import annotations

import gc
from typing import Any

from swerl.model_cache import resolve_model
from training.inference.base import (Completion, SamplingParams, check_completion, cut_at_block,
                                     policy_version_of, row_seeds, stop_ids_for)
from training.precision import resolve_dtype

GPU_EXTRA_HINT = ("backend=vllm needs vLLM, which runs on GPU workers only: install the `gpu` "
                  "extra (pip install 'swerl[gpu]'), or use rollout.backend=hf / openai")


def import_vllm() -> Any:
    try:
        import vllm
    except ImportError as err:
        raise ImportError(f"{GPU_EXTRA_HINT} ({err})") from err
    return vllm


def generation_eos(path: str) -> int | list[int] | None:
    """The model's own end-of-sequence ids (Qwen lists two), read from its checkpoint."""
    from transformers import AutoConfig, GenerationConfig

    try:
        return GenerationConfig.from_pretrained(path).eos_token_id
    except OSError:
        return AutoConfig.from_pretrained(path).eos_token_id


class VLLMBackend:
    def __init__(self, model: str = "default", dtype: str = "bfloat16", seed: int = 0,
                 **engine_kwargs: Any):
        self._vllm = import_vllm()
        self.dtype, self.seed, self.engine_kwargs = resolve_dtype(dtype, "cuda"), seed, engine_kwargs
        self.llm: Any = None
        self._start(resolve_model(model))

    def _start(self, path: str) -> None:
        kwargs = {"enable_prefix_caching": True, **self.engine_kwargs}
        self.llm = self._vllm.LLM(model=path, dtype=self.dtype, seed=self.seed,
                                  logprobs_mode="processed_logprobs", **kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.stop_ids = stop_ids_for(self.tokenizer, generation_eos(path))
        self.policy_version = policy_version_of(path)

    def _params(self, sp: SamplingParams, seed: int | None) -> Any:
        """Our own params on every call, never None: ``LLM.generate`` would then sample with the
        model's generation_config.json defaults (Qwen's top_k=20, top_p=0.8: a biased sampler)."""
        return self._vllm.SamplingParams(
            n=1, temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k if sp.top_k_on else -1,
            min_p=sp.min_p, repetition_penalty=sp.repetition_penalty, max_tokens=sp.max_new_tokens,
            stop_token_ids=sorted(self.stop_ids | set(sp.stop_token_ids)), seed=seed,
            logprobs=0)

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        return self.generate_rows(prompts, sampling, row_seeds(sampling, len(prompts)))

    def generate_rows(self, prompts: list[list[int]], sampling: SamplingParams,
                      seeds: list[int | None]) -> list[Completion]:
        """One seed (or None) per prompt; ``sampling.seed`` is unused."""
        from vllm.inputs import TokensPrompt

        if len(seeds) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        params = [self._params(sampling, seed) for seed in seeds]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
                                 params, use_tqdm=False)
        result = []
        for out in outs:
            c = out.outputs[0]
            if c.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"vLLM finished a request with {c.finish_reason!r}")
            ids = list(c.token_ids)
            lps = [float(c.logprobs[j][t].logprob) for j, t in enumerate(ids)]
            done = check_completion(Completion(ids, lps, c.finish_reason), sampling,
                                    self.stop_ids | set(sampling.stop_token_ids))
            result.append(cut_at_block(done, sampling, self.tokenizer.decode))
        return result

    def load_weights(self, checkpoint_dir: str) -> None:
        self.close()
        self._start(resolve_model(checkpoint_dir))

    def close(self) -> None:
        if self.llm is None:
            return
        engine = getattr(self.llm, "llm_engine", None)
        shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
        if callable(shutdown):
            shutdown()
        self.llm = None
        gc.collect()
        try:
            import torch
            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - freeing memory is best effort
            pass
