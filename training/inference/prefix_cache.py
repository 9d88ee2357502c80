"""Prefix reuse for the transformers backend: each turn prefills only what is new.

Keys and values at a position depend only on the tokens up to it, so the cache of an earlier
sequence (the previous turn, or the shared system prompt) can be cut to the prefix it shares
with a new prompt and reused as is, as vLLM's prefix caching does. `PrefixCachingHFBackend` is
`HFBackend` with this around its decode loop; entries are evicted least-recently-used beyond
`max_cached_tokens`. Models whose cache is not plain full attention run uncached.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

from training.inference.base import Completion, SamplingParams
from training.inference.hf import HFBackend

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [heads, tokens, head_dim]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = (torch.tensor(a[:n]) != torch.tensor(b[:n])).nonzero()
    return int(diff[0]) if len(diff) else n


@dataclass
class _Entry:
    ids: list[int]
    kv: KV
    used: int  # LRU clock


class PrefixStore:
    """Cached keys/values of earlier sequences; finds the longest stored prefix of a prompt."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self.entries: list[_Entry] = []
        self.clock = 0

    def tokens(self) -> int:
        return sum(len(e.ids) for e in self.entries)

    def longest(self, ids: list[int]) -> tuple[_Entry | None, int]:
        best, best_n = None, 0
        for e in self.entries:
            n = common_prefix(e.ids, ids)
            if n > best_n:
                best, best_n = e, n
        if best is not None:
            self.clock += 1
            best.used = self.clock
        return best, best_n

    def add(self, ids: list[int], kv: KV) -> _Entry:
        """Keep `ids`' cache; entries it extends are dropped (it holds all they held)."""
        self.entries = [e for e in self.entries if not (len(e.ids) <= len(ids) and ids[:len(e.ids)] == e.ids)]
        self.clock += 1
        entry = _Entry(list(ids), kv, self.clock)
        self.entries.append(entry)
        while self.tokens() > self.max_tokens and len(self.entries) > 1:
            self.entries.remove(min(self.entries, key=lambda e: e.used))
        return entry

    def clear(self) -> None:
        self.entries = []


class GrowingLayer(DynamicLayer):
    """A DynamicLayer that appends into spare room instead of concatenating.

    DynamicLayer.update copies the whole cache on every decoded token (torch.cat); with 8
    rows of ~2k context that copy was 77% of decode time on the CPU. Here the buffer is sized
    once for the prompt plus the reply budget and each token is written in place; `keys` and
    `values` are views of the filled part.
    """

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity, self.length = capacity, 0
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        n = key_states.shape[-2]
        if self._k is None or self.length + n > self._k.shape[-2]:
            self._grow(key_states, value_states, max(self.capacity, 2 * (self.length + n)))
        self._k[:, :, self.length:self.length + n] = key_states
        self._v[:, :, self.length:self.length + n] = value_states
        self.length += n
        self._views()
        return self.keys, self.values

    def _grow(self, k: torch.Tensor, v: torch.Tensor, size: int) -> None:
        b, h, _, d = k.shape
        # uninitialised is safe: only the filled part [0, length) is ever viewed, and all of it
        # was written (padding columns included, as zeros); zero-filling cost 15% of decode
        new_k, new_v = k.new_empty((b, h, size, d)), v.new_empty((b, h, size, v.shape[-1]))
        if self._k is not None:
            new_k[:, :, :self.length], new_v[:, :, :self.length] = self.keys, self.values
        self._k, self._v = new_k, new_v
        self.device, self.is_initialized = k.device, True

    def fill(self, rows: list[tuple[torch.Tensor, torch.Tensor]], width: int) -> None:
        """Start `width` columns long: row r's keys/values [heads, n, dim] right-aligned, zeros
        before them (the left padding), written once, straight into the buffer."""
        h, _, d = rows[0][0].shape
        self._k = rows[0][0].new_empty((len(rows), h, max(self.capacity, width), d))
        self._v = rows[0][1].new_empty((len(rows), h, max(self.capacity, width), rows[0][1].shape[-1]))
        for r, (k, v) in enumerate(rows):
            pad = width - k.shape[1]
            self._k[r, :, :pad], self._v[r, :, :pad] = 0.0, 0.0
            self._k[r, :, pad:width], self._v[r, :, pad:width] = k, v
        self.length, self.device, self.is_initialized = width, self._k.device, True
        self._views()

    def _views(self) -> None:
        self.keys, self.values = self._k[:, :, :self.length], self._v[:, :, :self.length]

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self._k is not None:
            self._k, self._v = self._k[indices], self._v[indices]
            self._views()


@dataclass
class _Batch:
    """One `_generate_batch` call: which prompt each cache row holds, what finished rows left."""

    prompts: list[list[int]]
    max_new_tokens: int
    width: int = 0  # padded prompt width (cache columns before the first sampled token)
    rows: list[int] = field(default_factory=list)  # cache row -> prompt index
    cache: Any = None
    kept: dict[int, KV] = field(default_factory=dict)  # prompt index -> its keys/values

    def snapshot(self, row: int) -> None:
        i = self.rows[row]
        start = self.width - len(self.prompts[i])  # left padding ends here
        self.kept[i] = [(layer.keys[row, :, start:].clone(), layer.values[row, :, start:].clone())
                        for layer in self.cache.layers]


class PrefixCachingHFBackend(HFBackend):
    def __init__(self, *args: Any, max_cached_tokens: int = 32768, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.prefix = PrefixStore(max_cached_tokens)
        self.prefill_tokens = 0  # prompt tokens actually run through the model
        self.reused_tokens = 0  # prompt tokens taken from the store instead
        self._batch: _Batch | None = None

    def load_weights(self, checkpoint_dir: str) -> None:
        super().load_weights(checkpoint_dir)
        self.reset_cache()  # keys/values of the old weights are wrong for the new ones

    def reset_cache(self) -> None:
        self.prefix.clear()

    def _generate_batch(self, prompts: list[list[int]], sp: SamplingParams,
                        gens: list[torch.Generator | None]) -> list[Completion]:
        self._batch = batch = _Batch(prompts, sp.max_new_tokens)
        try:
            out = super()._generate_batch(prompts, sp, gens)
            if batch.cache is not None:
                for row in range(len(batch.rows)):
                    batch.snapshot(row)
            for i, kv in batch.kept.items():
                fed = kv[0][0].shape[1] - len(prompts[i])  # sampled ids that went through the model
                self.prefix.add(prompts[i] + out[i].token_ids[:fed], kv)
            return out
        finally:
            self._batch = None

    def _forward(self, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, cache: Any) -> torch.Tensor:
        batch = self._batch
        if batch is None or batch.cache is not None or not _plain_dynamic(cache):
            return super()._forward(ids, attn, pos, cache)
        return self._prefill(batch, ids, attn, pos, cache)

    def _prefill(self, batch: _Batch, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor,
                 cache: Any) -> torch.Tensor:
        """Bring every prompt but its last id into the store, then feed only the last ids.

        Each row's new part runs alone (`_warm`), so a batch never pays for padding: in the
        caller's left-padded layout a batched prefill must feed the widest row's new part for
        every row. Alone costs no more per token on a CPU, where prefill is compute-bound, and
        rows that share ids (one system prompt, or two samples of one task) find each other's.
        """
        batch.width, batch.rows, batch.cache = ids.shape[1], list(range(ids.shape[0])), cache
        computed = self.prefill_tokens
        found = []  # held here: a later row's warm-up may evict an earlier row's entry from the store
        for p in batch.prompts:
            entry, n = self.prefix.longest(p)
            if len(p) > 1 and n < len(p) - 1:
                entry, n = self._warm(p[:-1]), len(p) - 1
            found.append((entry, n))
        skip = batch.width - 1  # columns filled from the store; the batched call feeds the last one
        layers = [GrowingLayer(batch.width + batch.max_new_tokens) for _ in cache.layers]
        if skip > 0:
            for i, layer in enumerate(layers):
                layer.fill([self._slice(entry, i, len(p) - 1, found) for (entry, _), p in zip(found, batch.prompts)],
                           skip)
        cache.layers = layers
        self.prefill_tokens += len(batch.prompts)
        self.reused_tokens += sum(map(len, batch.prompts)) - (self.prefill_tokens - computed)
        select = cache.batch_select_indices

        def select_and_keep(idx: torch.Tensor) -> None:
            keep = idx.tolist()
            for row in set(range(len(batch.rows))) - set(keep):  # these rows just finished
                batch.snapshot(row)
            batch.rows = [batch.rows[r] for r in keep]
            select(idx)

        cache.batch_select_indices = select_and_keep
        return super()._forward(ids[:, skip:], attn, pos[:, skip:], cache)

    def _warm(self, ids: list[int]) -> _Entry:
        """Run the model on one sequence (from its own longest stored prefix) and store it."""
        from transformers import DynamicCache

        entry, n = self.prefix.longest(ids)
        n = min(n, len(ids) - 1)
        cache = DynamicCache(config=self.model.config)
        if entry is not None and n > 0:
            for layer, (k, v) in enumerate(entry.kv):
                cache.update(k[None, :, :n], v[None, :, :n], layer)
        dev = self.device
        super()._forward(torch.tensor([ids[n:]], device=dev), torch.ones((1, len(ids)), dtype=torch.long, device=dev),
                         torch.arange(n, len(ids), device=dev)[None], cache)
        self.prefill_tokens += len(ids) - n
        return self.prefix.add(ids, [(layer.keys[0].clone(), layer.values[0].clone()) for layer in cache.layers])

    @staticmethod
    def _slice(entry: _Entry | None, layer: int, n: int, found: list[tuple[_Entry | None, int]]
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """The first n positions of an entry's keys/values at one layer (n may be 0: a one-id
        prompt, which reuses nothing; shaped from any entry of the batch)."""
        k, v = (entry or next(e for e, _ in found if e is not None)).kv[layer]
        return k[:, :n], v[:, :n]


def _plain_dynamic(cache: Any) -> bool:
    """Only full-attention dynamic layers, built up front from the config, can be cut and
    spliced like this (no sliding windows, no lazily added layers)."""
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)
