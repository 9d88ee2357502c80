"""Rows whose samples share prompt prefixes (a trie): layout by hand, and the same logprobs and
gradients as unpacked."""

import copy

import pytest
import torch

from swerl.config import SFTConfig
from training.batching import Row, collate_rows, micro_batches, pack_rows, split_rows
from training.dapo import dapo_loss
from bench.synthetic import tiny_llama
from training.trainer import Trainer
from training.trajectory import TrainingSample

pytestmark = pytest.mark.unit


def _sample(prompt: list[int], reply: list[int], advantage: float = 0.0) -> TrainingSample:
    return TrainingSample(prompt + reply, [0] * len(prompt) + [1] * len(reply),
                          [0.0] * len(prompt) + [-0.5] * len(reply), [len(prompt)], advantage)


def test_a_shared_prompt_is_stored_once_and_each_reply_sees_only_it():
    a = _sample([5, 6, 7], [8, 9], 1.0)
    b = _sample([5, 6, 7], [10], -1.0)
    c = _sample([1, 2], [3])
    samples = [a, b, c]
    mb = collate_rows(samples, [Row([0, 1]), Row([2])])
    # prompt minus its last token once, then each member from that token on
    assert mb.input_ids[0].tolist() == [5, 6, 7, 8, 9, 7, 10]
    assert mb.position_ids[0].tolist() == [0, 1, 2, 3, 4, 2, 3]
    assert mb.input_ids[1].tolist() == [1, 2, 3, 0, 0, 0, 0]
    # column t predicts token t+1: 6 7 | 8 9 | (9->7: no sample's) | 10
    assert mb.loss_mask[0].tolist() == [0, 0, 1, 1, 0, 1]
    assert mb.advantages[0].tolist()[2:4] == [1.0, 1.0] and mb.advantages[0, 5] == -1.0
    assert mb.spans == [[(0, 0, 2), (0, 2, 4)], [(0, 0, 2), (0, 5, 6)], [(1, 0, 2)]]
    assert mb.real_tokens == 7 + 3
    sees = mb.model_mask()[0, 0]
    assert sees[6].tolist() == [True, True, False, False, False, True, True]  # b's 10: prompt + own 7
    assert sees[4].tolist() == [True, True, True, True, True, False, False]   # a's 9: causal
    assert mb.model_mask()[1, 0].any(-1).all()  # padding still attends to something (no NaN)
    values = torch.arange(12.0).view(2, 6)
    assert [v.tolist() for v in split_rows(values, mb)] == [[0, 1, 2, 3], [0, 1, 5], [6, 7]]


def test_a_row_is_split_when_it_would_pass_the_budget():
    samples = [_sample(list(range(1, 9)), [20, 21]) for _ in range(5)]
    # each member adds 3 tokens to the 7 stored once: 7 + 3k <= 13 -> 2 per row (13 vs 20 alone)
    rows = pack_rows(samples, list(range(5)), micro_batch_tokens=13)
    assert [r.members for r in rows] == [[0, 1], [2, 3], [4]]
    assert pack_rows(samples, [0, 1], 100, pack=False) == [Row([0]), Row([1])]


def test_a_row_stays_unpacked_when_sharing_saves_less_than_a_quarter():
    # prompt 4, replies 10: packed 3 + 2 x 11 = 25 tokens vs 28 alone -> not worth a 4D mask
    long_replies = [_sample([1, 2, 3, 4], list(range(5, 15))) for _ in range(2)]
    assert pack_rows(long_replies, [0, 1], 100) == [Row([0]), Row([1])]
    # prompt 10, replies 2: 9 + 2 x 3 = 15 vs 24 -> packed
    short_replies = [_sample(list(range(1, 11)), [20, 21]) for _ in range(2)]
    assert pack_rows(short_replies, [0, 1], 100) == [Row([0, 1])]


def test_prompts_that_share_a_prefix_share_it_too():
    """Two tasks' prompts begin alike (the instructions), each task has two replies: the common
    part once, each task's own part once, each reply once, and a reply sees its chain only."""
    a1, a2 = _sample([1, 2, 3, 4, 5], [6], 1.0), _sample([1, 2, 3, 4, 5], [7], -1.0)
    b1 = _sample([1, 2, 3, 8, 9], [10, 11], 0.5)
    samples = [a1, a2, b1]
    mb = collate_rows(samples, [Row([0, 1, 2])])
    # [1 2] once; a's branch [3 4], its replies [5 6] [5 7]; b's branch [3 8 9 10 11] (alone below)
    assert mb.input_ids[0].tolist() == [1, 2, 3, 4, 5, 6, 5, 7, 3, 8, 9, 10, 11]
    assert mb.position_ids[0].tolist() == [0, 1, 2, 3, 4, 5, 4, 5, 2, 3, 4, 5, 6]
    sees = mb.model_mask()[0, 0].int()
    assert sees[7].tolist() == [1, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0]  # a2's 7: common, a's, own
    assert sees[12].tolist() == [1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1]  # b1's 11: common, own
    assert mb.loss_mask[0].tolist() == [0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 1, 1]
    values = torch.arange(12.0).view(1, 12)
    assert [v.tolist() for v in split_rows(values, mb)] == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 6],
                                                            [0, 1, 8, 9, 10, 11]]
    assert mb.real_tokens == 13  # against 6 + 6 + 7 = 19 unpacked


def test_a_one_token_sample_splits_into_an_empty_tensor():
    mb = collate_rows([TrainingSample([7], [0], [0.0], [])], [Row([0])])
    assert [v.shape for v in split_rows(torch.zeros(1, 0), mb)] == [(0,)]


def _group(seed: int = 0) -> list[TrainingSample]:
    """Two prompts of 4 and 2 samples that begin alike, replies of different lengths, plus one
    lone sample."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(3, 128, (n,), generator=g).tolist()  # noqa: E731
    common = rand(6)
    p1, p2 = common + rand(14), common + rand(7)
    out = [_sample(p1, rand(n), adv) for n, adv in ((5, 1.0), (9, -1.0), (3, 0.5), (7, -0.5))]
    out += [_sample(p2, rand(4), 1.0), _sample(p2, rand(6), -1.0), _sample(rand(11), rand(8), 0.3)]
    return out


def _trainer(model, dtype: str = "float32") -> Trainer:
    cfg = SFTConfig(lr=1e-2, micro_batch_tokens=4096, gradient_checkpointing=False,
                      warmup_ratio=0.0, dtype=dtype)
    return Trainer(model, cfg, total_steps=1, progress=False)


def _loss(lp, mb, token_count):
    """DAPO's clipped loss, with old logprobs 0.1 below so some ratios clip."""
    return dapo_loss(lp, lp.detach() - 0.1, mb.advantages, mb.loss_mask, 0.2, 0.28, token_count=token_count)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_rows_give_the_same_logprobs_and_gradients(attention):
    torch.manual_seed(0)
    model = tiny_llama()
    model.set_attn_implementation(attention)
    samples = _group()
    index = list(range(len(samples)))
    packed = micro_batches(samples, index, 4096, pack=True)
    plain = micro_batches(samples, index, 4096, pack=False)
    assert packed[0].segments is not None and plain[0].segments is None
    # the common 5 (the 6th is repeated in each branch), p1's 14 and p2's 7 beyond it, each reply
    # behind the repeated last prompt token, the lone sample whole
    assert sum(b.real_tokens for b in packed) == 5 + 14 + 7 + (1 + 5 + 1 + 9 + 1 + 3 + 1 + 7) + (1 + 4 + 1 + 6) + 19
    assert sum(b.real_tokens for b in plain) == sum(len(s.input_ids) for s in samples)

    def per_sample(batches):
        out = {}
        for mb, rows in zip(batches, _trainer(copy.deepcopy(model)).score(batches)):
            out |= dict(zip(mb.index, rows))
        return [out[i] for i in index]

    for p, q, s in zip(per_sample(packed), per_sample(plain), samples):
        assert p.shape == (len(s.input_ids) - 1,)
        assert torch.allclose(p, q, atol=1e-5)

    grads = []

    def step(batches):
        t = _trainer(copy.deepcopy(model))
        t.optimizer.optimizer.register_step_pre_hook(
            lambda opt, args, kw: grads.append([p.grad.clone() for p in t.unwrapped().parameters()]))
        return t.step(batches, _loss)

    m_packed, m_plain = step(packed), step(plain)
    assert m_packed["loss"] == pytest.approx(m_plain["loss"], abs=1e-6)
    assert m_packed["loss_tokens"] == m_plain["loss_tokens"] == 5 + 9 + 3 + 7 + 4 + 6 + 8
    for g1, g2 in zip(*grads):
        assert torch.allclose(g1, g2, atol=1e-6)
    assert any(g.abs().sum() > 0 for g in grads[0])


def test_the_trainer_packs_only_with_an_attention_that_takes_a_mask():
    model = tiny_llama()
    assert _trainer(model).packs
    model.config._attn_implementation = "flash_attention_2"  # not installed here; only the name
    assert not _trainer(model).packs
