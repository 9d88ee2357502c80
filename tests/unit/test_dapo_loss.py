"""dapo_loss against numbers worked out by hand, and the masks that keep gradient off tokens
the policy did not choose (observations, format-error turns)."""

import math

import pytest
import torch

from training.batching import collate
from training.dapo import dapo_loss, kl_k3
from bench.synthetic import make_trajectory, tiny_llama
from training.logprobs import naive_token_logprobs, token_logprobs
from training.trajectory import training_sample

pytestmark = pytest.mark.unit

EPS_LOW, EPS_HIGH = 0.2, 0.28


def _clip_case():
    # Five tokens, old logprobs 0, so r = exp(logprobs). Per token (r, A) -> min(rA, clip(r)A):
    #   t0 (1.5, +1): min(1.5, 1.28)   =  1.28  clip binds high (A>0, r>1.28) -> no gradient
    #   t1 (0.5, -1): min(-0.5, -0.8)  = -0.8   clip binds low  (A<0, r<0.8)  -> no gradient
    #   t2 (1.1, +1): min(1.1, 1.1)    =  1.1   inside the trust region
    #   t3 (0.5, +2): min(1.0, 1.6)    =  1.0   A>0 and r low: unclipped
    #   t4 (1.5, -1): min(-1.5, -1.28) = -1.5   A<0 and r high: unclipped
    # sum = 1.28 - 0.8 + 1.1 + 1.0 - 1.5 = 1.08 over 5 tokens -> loss = -0.216
    r = torch.tensor([[1.5, 0.5, 1.1, 0.5, 1.5]], dtype=torch.float64)
    logprobs = r.log().requires_grad_(True)
    old = torch.zeros_like(r)
    adv = torch.tensor([[1.0, -1.0, 1.0, 2.0, -1.0]], dtype=torch.float64)
    return logprobs, old, adv, torch.ones_like(r)


def test_clip_each_side_by_hand():
    logprobs, old, adv, mask = _clip_case()
    loss, m = dapo_loss(logprobs, old, adv, mask, EPS_LOW, EPS_HIGH)
    assert loss.item() == pytest.approx(-0.216, abs=1e-12)
    assert m["clip_frac_high"] == pytest.approx(1 / 5)
    assert m["clip_frac_low"] == pytest.approx(1 / 5)
    assert m["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1 + 0.5 + 1.5) / 5)  # 1.02
    assert m["ratio_max"] == pytest.approx(1.5) and m["ratio_min"] == pytest.approx(0.5)
    loss.backward()
    # d loss/d logprob_t = -(1/5) * r_t * A_t where unclipped, 0 where the clip binds:
    #   [0, 0, -1.1/5, -(0.5*2)/5, +1.5/5] = [0, 0, -0.22, -0.2, 0.3]
    expected = torch.tensor([[0.0, 0.0, -0.22, -0.2, 0.3]], dtype=torch.float64)
    assert torch.allclose(logprobs.grad, expected, atol=1e-12)


def test_token_level_normalisation_and_mask():
    # Ratios 1 on real tokens, so the objective is A per token. Row 0 has 3 loss tokens with
    # A=+1, row 1 has 1 loss token with A=-2: sum = 3 - 2 = 1 over 4 tokens -> loss = -0.25.
    # (A per-sequence mean would give -(1 + -2)/2 = +0.5: the two normalisations differ.)
    old = torch.zeros(2, 3)
    logprobs = torch.zeros(2, 3)
    logprobs[1, 1:] = 5.0  # huge ratios, but masked: must change nothing
    logprobs.requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    loss, m = dapo_loss(logprobs, old, adv, mask, EPS_LOW, EPS_HIGH)
    assert loss.item() == pytest.approx(-0.25)
    assert m["tokens"] == 4.0
    assert m["clip_frac_high"] == 0.0 and m["clip_frac_low"] == 0.0
    loss.backward()
    # unclipped r=1: grad = -A/4 on loss tokens, exactly 0 on masked ones
    expected = torch.tensor([[-0.25, -0.25, -0.25], [0.5, 0.0, 0.0]])
    assert torch.equal(logprobs.grad, expected)


def test_sequence_advantages_equal_token_advantages():
    logprobs, old, adv, mask = _clip_case()
    per_seq = torch.tensor([2.0], dtype=torch.float64)
    a, _ = dapo_loss(logprobs, old, per_seq, mask, EPS_LOW, EPS_HIGH)
    b, _ = dapo_loss(logprobs, old, per_seq[:, None].expand_as(logprobs), mask, EPS_LOW, EPS_HIGH)
    assert a.item() == b.item()


def test_empty_mask_is_zero_not_nan():
    lp = torch.zeros(1, 4, requires_grad=True)
    loss, m = dapo_loss(lp, torch.zeros(1, 4), torch.tensor([1.0]), torch.zeros(1, 4), EPS_LOW, EPS_HIGH)
    assert loss.item() == 0.0 and m["tokens"] == 0.0
    loss.backward()
    assert torch.equal(lp.grad, torch.zeros(1, 4))


def test_kl_k3_by_hand():
    # d = ref - pi: d=0 -> 0; d=1 -> e - 2 = 0.718281...; d=-1 -> 1/e = 0.367879...
    pi = torch.tensor([0.0, -1.0, 0.0])
    ref = torch.tensor([0.0, 0.0, -1.0])
    assert torch.allclose(kl_k3(pi, ref), torch.tensor([0.0, math.e - 2.0, math.exp(-1.0)]))


def _format_error_batch():
    # prompt(3) | turn A ok (2) | obs (2) | turn B FORMAT ERROR (3) | obs (2) | turn C ok (2)
    traj = make_trajectory(prompt=[5, 6, 7],
                           turns=[([10, 11], False, [20, 21]),
                                  ([12, 13, 14], True, [22, 23]),
                                  ([15, 2], False, [])])
    sample = training_sample(traj)
    sample.advantage = 1.0
    #                  p  p  p  A  A  o  o  B  B  B  o  o  C  C
    assert sample.loss_mask == [0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1]
    return sample, collate([sample], [0])


def test_observation_and_format_error_tokens_get_zero_logit_gradient():
    torch.manual_seed(0)
    model = tiny_llama()
    sample, mb = _format_error_batch()
    logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
    logits.retain_grad()
    lp = logits[:, :-1].log_softmax(-1).gather(-1, mb.input_ids[:, 1:, None]).squeeze(-1)
    loss, _ = dapo_loss(lp, lp.detach(), mb.advantages, mb.loss_mask, EPS_LOW, EPS_HIGH)
    loss.backward()
    # logits at position t predict token t+1: their gradient is nonzero iff token t+1 has loss.
    has_grad = logits.grad[0].abs().sum(-1) != 0
    assert has_grad.tolist() == [bool(m) for m in sample.loss_mask[1:]] + [False]


def test_chunked_path_gives_zero_gradient_to_masked_positions():
    torch.manual_seed(0)
    model = tiny_llama()
    sample, mb = _format_error_batch()
    captured = {}

    def keep(module, args, out):  # final hidden states, the only input of the chunked head
        out.retain_grad()
        captured["h"] = out

    model.model.norm.register_forward_hook(keep)
    lp = token_logprobs(model, mb.input_ids, mb.attention_mask, chunk=4)
    loss, _ = dapo_loss(lp, lp.detach(), mb.advantages, mb.loss_mask, EPS_LOW, EPS_HIGH)
    loss.backward()
    has_grad = captured["h"].grad[0].abs().sum(-1) != 0
    assert has_grad.tolist() == [bool(m) for m in sample.loss_mask[1:]] + [False]
    ref = naive_token_logprobs(model, mb.input_ids, mb.attention_mask)
    assert torch.allclose(lp, ref, atol=1e-5)
