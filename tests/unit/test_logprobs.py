"""Chunked logprobs equal the naive ones (values, entropy, gradients) and use far less memory."""

import pytest
import torch

from bench.train import peak_logprob_memory
from bench.synthetic import tiny_llama
from training.logprobs import naive_token_logprobs, token_logprobs

pytestmark = pytest.mark.unit


def _inputs(vocab=128, b=3, t=41):
    torch.manual_seed(0)
    ids = torch.randint(0, vocab, (b, t))
    attn = torch.ones_like(ids)
    attn[1, 30:] = 0  # a right-padded row
    return ids, attn


@pytest.mark.parametrize("chunk", [1, 7, 16, 64])
def test_equals_naive(chunk):
    model = tiny_llama()
    ids, attn = _inputs()
    fast = token_logprobs(model, ids, attn, chunk)
    ref = naive_token_logprobs(model, ids, attn)
    assert fast.shape == (3, 40)
    real = attn[:, 1:].bool()
    assert torch.allclose(fast[real], ref[real], atol=1e-5)


def test_tempered_logprobs_are_what_a_sampler_at_that_temperature_reports():
    """The trainer's policy at T is the sampler's distribution at T (no top-k/p filter)."""
    from training.inference.base import SamplingParams
    from training.inference.sampling import processed_logprobs

    model = tiny_llama()
    ids, attn = _inputs()
    fast = token_logprobs(model, ids, attn, 7, temperature=0.5)
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
    sampler = processed_logprobs(logits.reshape(-1, logits.shape[-1]), SamplingParams(temperature=0.5))
    ref = sampler.reshape(logits.shape).gather(-1, ids[:, 1:, None]).squeeze(-1)
    real = attn[:, 1:].bool()
    assert torch.allclose(fast[real], ref[real], atol=1e-5)
    assert not torch.allclose(fast[real], token_logprobs(model, ids, attn, 7)[real], atol=1e-3)


def test_entropy_equals_naive():
    model = tiny_llama()
    ids, attn = _inputs()
    _, ent = token_logprobs(model, ids, attn, 16, with_entropy=True)
    logp = model(input_ids=ids, attention_mask=attn).logits[:, :-1].log_softmax(-1)
    ref = -(logp.exp() * logp).sum(-1)
    assert torch.allclose(ent, ref, atol=1e-5)
    assert not ent.requires_grad


def test_gradients_equal_naive():
    model = tiny_llama()
    ids, attn = _inputs()
    weights = torch.randn(3, 40) * attn[:, 1:]

    def grads(fn):
        model.zero_grad()
        (fn() * weights).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    fast = grads(lambda: token_logprobs(model, ids, attn, 7))
    ref = grads(lambda: naive_token_logprobs(model, ids, attn))
    for name in ref:
        assert torch.allclose(fast[name], ref[name], atol=1e-5), name


def test_head_is_restored():
    model = tiny_llama()
    ids, attn = _inputs()
    token_logprobs(model, ids, attn, 8)
    assert model(input_ids=ids, attention_mask=attn).logits.shape == (3, 41, 128)


def test_chunked_peak_memory_is_a_quarter_of_naive_or_less():
    # SmolLM2's vocabulary at 1024 tokens: naive logits are 1024 x 49152 x 4 B = 192 MiB each.
    m = peak_logprob_memory(tokens=1024, vocab=49152, hidden=32, chunk=64)
    # Sanity of the measurement: logits and log_softmax output alive together (2 x 192 MiB).
    assert m["peak_mb_naive"] > 2 * 192 * 0.95
    assert m["peak_mb_chunked"] <= m["peak_mb_naive"] / 4, m


def test_head_at_chosen_positions_only_gives_the_same_values_and_gradients():
    """``only`` skips the LM head where the loss is masked: same logprobs, entropy and
    gradients there, exact zeros elsewhere."""
    model = tiny_llama()
    ids, attn = _inputs()
    only = torch.zeros(3, 40, dtype=torch.bool)
    only[0, 20:] = only[1, 5:12] = only[2, 39] = True
    weights = torch.randn(3, 40) * only

    def run(**kw):
        model.zero_grad()
        lp, ent = token_logprobs(model, ids, attn, 7, with_entropy=True, **kw)
        (lp * weights).sum().backward()
        return lp.detach(), ent, {n: p.grad.clone() for n, p in model.named_parameters()}

    lp, ent, grads = run(only=only)
    ref_lp, ref_ent, ref_grads = run()
    assert torch.allclose(lp[only], ref_lp[only], atol=1e-5)
    assert torch.allclose(ent[only], ref_ent[only], atol=1e-5)
    assert (lp[~only] == 0).all() and (ent[~only] == 0).all()
    for name in ref_grads:
        assert torch.allclose(grads[name], ref_grads[name], atol=1e-5), name
