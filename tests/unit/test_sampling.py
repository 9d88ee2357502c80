"""The sampler's math: the logprob recorded for a token is its probability under the
distribution it was actually drawn from."""

import pytest
import torch

from training.inference.base import SamplingParams
from training.inference.sampling import processed_logprobs, sample, sample_rows

pytestmark = pytest.mark.unit


def logits(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_unfiltered_temperature_one_is_the_raw_policy():
    x = torch.randn(3, 50)
    assert torch.allclose(processed_logprobs(x, SamplingParams()), torch.log_softmax(x, -1))


def test_temperature_scales_logits():
    x = torch.randn(2, 10)
    got = processed_logprobs(x, SamplingParams(temperature=0.5))
    assert torch.allclose(got, torch.log_softmax(x / 0.5, -1))


def test_greedy_keeps_unscaled_logprobs_and_takes_argmax():
    x = logits([0.0, 3.0, 1.0])
    sp = SamplingParams(temperature=0.0)
    lp = processed_logprobs(x, sp)
    ids, tok_lp = sample(lp, sp)
    assert ids.tolist() == [1]
    assert tok_lp.item() == pytest.approx(torch.log_softmax(x, -1)[0, 1].item())


def test_top_k_renormalises_over_the_k_best():
    x = logits([1.0, 4.0, 3.0, 2.0])
    lp = processed_logprobs(x, SamplingParams(top_k=2))
    assert torch.isinf(lp[0, [0, 3]]).all()
    assert torch.allclose(lp[0, [1, 2]], torch.log_softmax(torch.tensor([4.0, 3.0]), -1))


def test_top_p_keeps_smallest_set_reaching_p():
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    lp = processed_logprobs(p.log(), SamplingParams(top_p=0.75))
    kept = torch.isfinite(lp[0]).tolist()
    assert kept == [True, True, False, False]  # 0.5 < 0.75, 0.5 + 0.3 >= 0.75
    assert lp[0, 0].exp().item() == pytest.approx(0.5 / 0.8)


def test_min_p_drops_tokens_below_fraction_of_best():
    p = torch.tensor([[0.6, 0.3, 0.07, 0.03]])
    lp = processed_logprobs(p.log(), SamplingParams(min_p=0.1))  # floor 0.06
    assert torch.isfinite(lp[0]).tolist() == [True, True, True, False]


def test_repetition_penalty_hits_only_seen_tokens():
    x = logits([2.0, -2.0, 2.0])
    seen = torch.tensor([[True, True, False]])
    lp = processed_logprobs(x, SamplingParams(repetition_penalty=2.0), seen)
    assert torch.allclose(lp, torch.log_softmax(logits([1.0, -4.0, 2.0]), -1))
    with pytest.raises(ValueError, match="seen"):
        processed_logprobs(x, SamplingParams(repetition_penalty=2.0))


def test_sampled_token_logprob_matches_its_row():
    torch.manual_seed(0)
    lp = torch.log_softmax(torch.randn(4, 30), -1)
    ids, tok_lp = sample(lp, SamplingParams(), torch.Generator().manual_seed(1))
    assert torch.equal(tok_lp, lp[torch.arange(4), ids])


def test_sampling_follows_the_distribution():
    lp = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).expand(20000, 3)
    ids, _ = sample(lp, SamplingParams(), torch.Generator().manual_seed(0))
    freq = torch.bincount(ids, minlength=3).float() / len(ids)
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.02)


def test_seeded_rows_do_not_depend_on_their_neighbours():
    lp = torch.log_softmax(torch.randn(3, 100), -1)
    sp = SamplingParams()
    gens = lambda: [torch.Generator().manual_seed(s) for s in (11, 12, 13)]  # noqa: E731
    batch, _ = sample_rows(lp, sp, gens())
    alone, _ = sample_rows(lp[1:2], sp, [torch.Generator().manual_seed(12)])
    assert batch[1] == alone[0]
    again, _ = sample_rows(lp, sp, gens())
    assert torch.equal(batch, again)
