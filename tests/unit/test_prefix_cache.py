"""Prefix reuse must not change what the model computes: same tokens, same logprobs (to float
noise) as prefilling everything, over several turns of several episodes batched together."""

from __future__ import annotations

import random

import pytest
import torch

from tests.unit.byte_chat import byte_chat_tokenizer
from bench.synthetic import tiny_llama
from training.inference.base import SamplingParams
from training.inference.hf import HFBackend
from training.inference.prefix_cache import PrefixCachingHFBackend, PrefixStore, common_prefix

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("tiny")
    tok = byte_chat_tokenizer()
    model = tiny_llama(vocab=len(tok), hidden=64, layers=3)
    model.config.eos_token_id = tok.eos_token_id
    model.config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


def test_common_prefix_and_store():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0 and common_prefix([7], [8]) == 0
    kv = [(torch.zeros(1, 3, 2), torch.zeros(1, 3, 2))]
    store = PrefixStore(max_tokens=8)
    store.add([1, 2, 3], kv)
    store.add([1, 2, 3, 4, 5], kv)  # extends the first: replaces it
    assert [e.ids for e in store.entries] == [[1, 2, 3, 4, 5]]
    store.add([9, 9, 9], kv)  # 8 tokens in all: fits
    store.longest([1, 2, 3, 4, 5, 6])  # touches the first entry
    store.add([7, 7], kv)  # over the budget: the least recently used goes
    assert [e.ids for e in store.entries] == [[1, 2, 3, 4, 5], [7, 7]]
    assert store.longest([1, 2, 7])[1] == 2


@pytest.mark.parametrize("budget", [32768, 60])  # 60: entries are evicted inside every batch
def test_cached_turns_compute_what_a_full_prefill_computes(model_dir, budget):
    plain = HFBackend(model_dir, seed=0, threads=1)
    cached = PrefixCachingHFBackend(model_dir, seed=0, threads=1, max_cached_tokens=budget)
    rng = random.Random(0)
    system = [rng.randrange(3, 200) for _ in range(40)]  # shared by every episode
    contexts = [system + [rng.randrange(3, 200) for _ in range(rng.randrange(1, 30))] for _ in range(5)]
    sp = SamplingParams(temperature=0.0, max_new_tokens=12)
    for turn in range(4):
        if turn == 2:
            contexts.append(list(system[:25]))  # a newcomer mid-run: only part of a prefix is cached
        want = plain.generate(contexts, sp)
        got = cached.generate(contexts, sp)
        if turn == 0 and budget > 1000:  # the shared system prompt ran once; nothing ran twice, no padding ran at all
            assert cached.prefill_tokens == sum(len(c) for c in contexts) - (len(contexts) - 1) * len(system)
        for w, g in zip(want, got):
            assert g.token_ids == w.token_ids and g.finish_reason == w.finish_reason
            assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-4)
        for i, c in enumerate(got):  # the next turn: the reply, then an observation
            contexts[i] = contexts[i] + c.token_ids + [rng.randrange(3, 200) for _ in range(rng.randrange(1, 9))]
    if budget > 1000:
        assert cached.reused_tokens > 2 * cached.prefill_tokens  # most of each context came from the store
    seeded = SamplingParams(temperature=1.0, max_new_tokens=8)
    want = plain.generate_rows(contexts, seeded, list(range(len(contexts))))
    got = cached.generate_rows(contexts, seeded, list(range(len(contexts))))
    assert [g.token_ids for g in got] == [w.token_ids for w in want]


def test_growing_layer_matches_concatenation():
    from training.inference.prefix_cache import GrowingLayer

    layer = GrowingLayer(capacity=2)  # too small on purpose: it must grow and keep what it held
    parts = [torch.randn(3, 2, n, 4) for n in (3, 1, 1, 5)]
    for p in parts:
        keys, values = layer.update(p, -p)
    want = torch.cat(parts, dim=2)
    assert torch.equal(keys, want) and torch.equal(values, -want) and layer.get_seq_length() == 10
    layer.batch_select_indices(torch.tensor([2, 0]))
    assert torch.equal(layer.keys, want[[2, 0]])
    keys, _ = layer.update(torch.ones(2, 2, 1, 4), torch.ones(2, 2, 1, 4))
    assert torch.equal(keys[:, :, :10], want[[2, 0]]) and keys.shape[2] == 11
    layer = GrowingLayer(capacity=8)
    rows = [torch.randn(2, n, 4) for n in (3, 0, 5)]
    layer.fill([(r, r + 1) for r in rows], width=5)
    for i, r in enumerate(rows):
        assert torch.equal(layer.keys[i, :, 5 - r.shape[1]:], r) and not layer.keys[i, :, :5 - r.shape[1]].any()
        assert torch.equal(layer.values[i, :, 5 - r.shape[1]:], r + 1)
