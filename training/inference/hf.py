"""The in-process transformers backend: the CPU default, and the reference the others match.

A hand-written decode loop rather than ``model.generate``: we need the logprob of each sampled
token under the exact distribution it was drawn from, and rows that finish are dropped from the
batch (and the KV cache) at once, which matters when one episode stops after 5 tokens and
another runs to 256. Prompts are left-padded with explicit position ids, so a prompt gives the
same distribution alone or in a batch.
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from swerl.model_cache import ModelResolutionError, resolve_model
from environments.actions import closes_block
from training.inference.base import (Completion, SamplingParams, policy_version_of, row_seeds,
                                     stop_ids_for)
from training.inference.sampling import processed_logprobs, sample_rows
from training.precision import resolve_dtype

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_hf_model(name_or_path: str, dtype: str = "float32") -> tuple[Any, Any]:
    """(model in eval mode, tokenizer); an unreachable hub id becomes one clear error."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(name_or_path)
    try:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype])
    except OSError as err:
        if Path(path).exists():
            raise
        raise ModelResolutionError(
            f"cannot load {path!r}: not a local checkpoint and the HF hub is unreachable or lacks "
            f"it ({err.__class__.__name__}: {str(err)[:300]}). Use rollout.model=default or a local "
            "HF dir.") from err
    model.eval()
    return model, tok


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Use n intra-op threads for a block, then restore the process's setting.

    Decoding is a long run of tiny matmuls: on a busy 2-core box (sandboxes running tests next
    to it) OpenMP's spinning workers made 2 threads 10x slower than 1. Scoped rather than set
    once, because a trainer in the same process wants all cores back.
    """
    if n == torch.get_num_threads():
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class HFBackend:
    """Batched sampling with transformers; thread-safe (calls are serialised).

    ``threads``: torch intra-op threads while generating; default half the cores (1 on the
    2-core box), leaving the rest to the sandboxes that run beside the policy.
    """

    def __init__(self, model: str = "default", dtype: str = "float32", seed: int = 0,
                 max_batch_size: int = 16, device: str = "cpu", threads: int | None = None):
        self.device = torch.device(device)
        self.dtype = resolve_dtype(dtype, self.device.type)
        self.threads = threads or max(1, (os.cpu_count() or 2) // 2)
        self.max_batch_size = max_batch_size
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._lock = threading.Lock()
        path = resolve_model(model)
        self.model, self.tokenizer = load_hf_model(path, self.dtype)
        self.model.to(self.device)
        self.policy_version = policy_version_of(path)
        self._setup()

    def _setup(self) -> None:
        gen_eos = getattr(self.model.generation_config, "eos_token_id", None)
        self.stop_ids = stop_ids_for(self.tokenizer, gen_eos)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else min(self.stop_ids))
        # stop_at_block only needs a look at the text when a token could close a fence
        self._tick_ids = {i for t, i in self.tokenizer.get_vocab().items() if "`" in t}
        params = inspect.signature(self.model.forward).parameters
        # transformers 5.x renames past_key_values -> cache (the old name is deprecated)
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def load_weights(self, checkpoint_dir: str) -> None:
        """Reload from an HF checkpoint dir; the tokenizer must stay the same."""
        with self._lock:
            model, tok = load_hf_model(checkpoint_dir, self.dtype)
            if tok.get_vocab() != self.tokenizer.get_vocab():
                raise ValueError(f"{checkpoint_dir}: tokenizer differs from the loaded policy's")
            self.model, self.tokenizer = model.to(self.device), tok
            self.policy_version = policy_version_of(checkpoint_dir)
            self._setup()

    def close(self) -> None:
        self.model = None

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        """A seeded call gives prompt i the seed ``seed + i`` (as the openai client does)."""
        return self.generate_rows(prompts, sampling, row_seeds(sampling, len(prompts)))

    def generate_rows(self, prompts: list[list[int]], sampling: SamplingParams,
                      seeds: list[int | None]) -> list[Completion]:
        """One seed (or None: the backend's own stream) per prompt; ``sampling.seed`` is unused.

        The server needs this to batch seeded requests from different clients together.
        """
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt: every prompt needs at least one token")
        if self.model is None:
            raise RuntimeError("backend is closed")
        # shortest first keeps padding low inside each chunk
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        out: list[Completion | None] = [None] * len(prompts)
        with self._lock, torch.inference_mode(), torch_threads(self.threads):
            for s in range(0, len(order), self.max_batch_size):
                chunk = order[s:s + self.max_batch_size]
                gens = [None if seeds[i] is None else
                        torch.Generator(device=self.device).manual_seed(seeds[i]) for i in chunk]
                done = self._generate_batch([prompts[i] for i in chunk], sampling, gens)
                for i, c in zip(chunk, done):
                    out[i] = c
        return out  # type: ignore[return-value]

    def _forward(self, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, cache: Any) -> torch.Tensor:
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True,
                         logits_to_keep=1, **{self._cache_kw: cache})
        return out.logits[:, -1, :]

    def _generate_batch(self, prompts: list[list[int]], sp: SamplingParams,
                        gens: list[torch.Generator | None]) -> list[Completion]:
        from transformers import DynamicCache

        device = self.device
        n, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((n, width), dtype=torch.long)
        for r, p in enumerate(prompts):
            ids[r, width - len(p):] = torch.tensor(p, dtype=torch.long)
            attn[r, width - len(p):] = 1
        ids, attn = ids.to(device), attn.to(device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        seen = None
        if sp.repetition_penalty != 1.0:
            vocab = self.model.get_output_embeddings().weight.shape[0]
            seen = torch.zeros((n, vocab), dtype=torch.bool, device=device)
            for r, p in enumerate(prompts):
                seen[r, torch.tensor(p, device=device)] = True

        stop = self.stop_ids | set(sp.stop_token_ids)
        tokens: list[list[int]] = [[] for _ in range(n)]
        lps: list[list[float]] = [[] for _ in range(n)]
        reasons: list[str] = ["length"] * n
        rows = list(range(n))  # batch row -> prompt index, shrinks as rows finish
        cache = DynamicCache(config=self.model.config)
        logits = self._forward(ids, attn, pos, cache)
        next_pos = pos[:, -1:] + 1
        for step in range(sp.max_new_tokens):
            logp = processed_logprobs(logits, sp, seen)
            tok, tok_lp = sample_rows(logp, sp, gens, self.generator)
            keep = []
            for r, (i, t, lp) in enumerate(zip(rows, tok.tolist(), tok_lp.tolist())):
                tokens[i].append(t)
                lps[i].append(lp)
                if t in stop:
                    reasons[i] = "stop"
                elif sp.stop_at_block and t in self._tick_ids and closes_block(self.tokenizer.decode(tokens[i])):
                    reasons[i] = "block"
                else:
                    keep.append(r)
            if not keep or step == sp.max_new_tokens - 1:
                break
            if len(keep) < len(rows):
                idx = torch.tensor(keep, device=device)
                cache.batch_select_indices(idx)
                tok, attn, next_pos = tok[idx], attn[idx], next_pos[idx]
                seen = seen[idx] if seen is not None else None
                rows = [rows[r] for r in keep]
                gens = [gens[r] for r in keep]
            if seen is not None:
                seen.scatter_(1, tok.unsqueeze(-1), True)
            attn = torch.cat([attn, attn.new_ones((len(rows), 1))], dim=1)
            logits = self._forward(tok.unsqueeze(-1), attn, next_pos, cache)
            next_pos = next_pos + 1
        return [Completion(tokens[i], lps[i], reasons[i]) for i in range(n)]  # type: ignore[arg-type]
