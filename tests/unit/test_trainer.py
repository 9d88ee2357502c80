"""Batching, the shared Trainer, one DAPO iteration and RFT on a tiny model."""

import copy
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from swerl.config import DAPOConfig, DAPOStage, SFTConfig
from training import dapo, rft
from training.batching import collate, length_groups, micro_batches, padding_share
from training.checkpoint import (IncompleteCheckpoint, load_checkpoint, load_train_state, read_info,
                                 read_state_info, save_checkpoint)
from training.dapo import dapo_trainer, iteration_update
from bench.synthetic import make_trajectory, synthetic_samples, tiny_llama, tiny_tokenizer
from training.logprobs import naive_token_logprobs
from training.trainer import Trainer, lr_factor
from training.trajectory import training_sample
from training.update_job import UpdateJob

pytestmark = pytest.mark.unit


def test_lr_factor_by_hand():
    f = lambda s: lr_factor(s, warmup=2, total=10, schedule="cosine", min_ratio=0.1)  # noqa: E731
    assert f(0) == 0.5 and f(1) == 1.0          # warmup: (s+1)/2
    assert f(2) == pytest.approx(1.0)           # cosine starts at the top
    assert f(6) == pytest.approx(0.55)          # progress 4/8: 0.1 + 0.9 * 0.5 * (1 + cos(pi/2))
    assert f(10) == pytest.approx(0.1) and f(50) == pytest.approx(0.1)
    assert lr_factor(7, 2, 10, "constant") == 1.0


def test_length_groups_by_hand():
    # sorted desc: 50(i1) 48(i3) 30(i4) 12(i2) 10(i0); budget 100 = rows x longest
    # [50, 48]: 2x50 = 100 ok; +30 would be 3x50 > 100 -> new group [30, 12, 10]: 3x30 = 90
    groups = length_groups([10, 50, 12, 48, 30], 100)
    assert groups == [[1, 3], [4, 2, 0]]
    samples = synthetic_samples([10, 50, 12, 48, 30], vocab=1)
    batches = micro_batches(samples, [0, 1, 2, 3, 4], 100)
    # real 98 of 100, then 52 of 90: padding = 1 - 150/190
    assert padding_share(batches) == pytest.approx(1 - 150 / 190)


def test_oversized_sequence_gets_its_own_batch():
    assert length_groups([500, 20, 20], 100) == [[0], [1, 2]]


def test_collate_aligns_masks_with_targets():
    traj = make_trajectory(prompt=[5, 6], turns=[([7, 8], False, [9])], logprob=-0.5)
    s = training_sample(traj)  # ids 5 6 7 8 9, mask 0 0 1 1 0
    mb = collate([s, synthetic_samples([3], vocab=1)[0]], [0, 1], pad_id=0)
    assert mb.input_ids.tolist() == [[5, 6, 7, 8, 9], [0, 0, 0, 0, 0]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    # column t is the prediction of token t+1: targets 6 7 8 9 -> mask 0 1 1 0
    assert mb.loss_mask.tolist()[0] == [0, 1, 1, 0]
    assert mb.behaviour_logprobs.tolist()[0] == [0.0, -0.5, -0.5, 0.0]


def _cfg(**kw):
    base = dict(lr=1e-2, micro_batch_tokens=4096, gradient_checkpointing=False, warmup_ratio=0.0)
    return SFTConfig(**(base | kw))


def test_sft_step_loss_is_token_mean_and_accumulation_is_exact():
    torch.manual_seed(0)
    model = tiny_llama()
    samples = synthetic_samples([40, 23, 31, 12], vocab=128)
    index = [0, 1, 2, 3]
    whole = micro_batches(samples, index, 4096)
    split = micro_batches(samples, index, 40)
    assert len(whole) == 1 and len(split) == 4
    b = whole[0]
    with torch.no_grad():
        lp = naive_token_logprobs(model, b.input_ids, b.attention_mask)
    expected_loss = float(-(lp * b.loss_mask).sum() / b.loss_mask.sum())

    grads = []

    def run(batches):
        t = Trainer(copy.deepcopy(model), _cfg(), total_steps=1, progress=False)
        # AdamW's first step is ~lr * sign(g): compare the gradients it is handed instead.
        t.optimizer.optimizer.register_step_pre_hook(
            lambda opt, args, kw: grads.append([p.grad.clone() for p in t.unwrapped().parameters()]))
        return t.step(batches, rft.sft_loss), t

    (m1, t1), (m2, _) = run(whole), run(split)
    assert m1["loss"] == pytest.approx(expected_loss, abs=1e-5)
    assert m2["loss"] == pytest.approx(expected_loss, abs=1e-5)
    assert m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-4)
    assert m1["tokens"] == 40 + 23 + 31 + 12
    for g1, g2 in zip(*grads):
        assert torch.allclose(g1, g2, atol=1e-7)
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), t1.unwrapped().parameters()))


def test_bf16_autocast_and_checkpointing_run():
    torch.manual_seed(0)
    t = Trainer(tiny_llama(), _cfg(dtype="bfloat16", gradient_checkpointing=True), total_steps=2,
                progress=False)
    m = t.step(micro_batches(synthetic_samples([30, 20], vocab=128), [0, 1], 64), rft.sft_loss)
    assert math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0


def _dapo_samples(model, shift: float):
    """Two trajectories, A = +1 (4 loss tokens) and A = -1 (2 loss tokens), whose behaviour
    logprobs are the model's own minus ``shift`` on every loss token."""
    good = make_trajectory(prompt=[3, 4, 5], turns=[([10, 11, 12, 13], False, [6])], reward=1.0)
    bad = make_trajectory(prompt=[3, 4, 5], turns=[([20, 21], False, [6, 7])], reward=0.0,
                          sample_index=1)
    out = []
    for traj, adv in ((good, 1.0), (bad, -1.0)):
        s = training_sample(traj)
        s.advantage = adv
        ids = torch.tensor([s.input_ids])
        with torch.no_grad():
            lp = naive_token_logprobs(model, ids, torch.ones_like(ids))[0]
        s.behaviour_logprobs = [0.0] + [float(v) - shift if m else 0.0
                                        for v, m in zip(lp, s.loss_mask[1:])]
        out.append(s)
    return out


def _update(model, samples, cfg, stage, **kw):
    """One iteration_update with a fresh Trainer for the stage, as the pipeline's first iteration."""
    trainer = dapo_trainer(model, cfg, stage, math.ceil(len(samples) / stage.batch_size), progress=False)
    return iteration_update(trainer, samples, cfg, stage, **kw)


def _dapo_cfg(**kw):
    stage = DAPOStage(batch_size=8, lr=1e-2, max_turns=4, l_thr=3)
    return DAPOConfig(stages=[stage], train=_cfg(), **kw), stage


def test_iteration_update_by_hand():
    torch.manual_seed(0)
    model = tiny_llama()
    samples = _dapo_samples(model, shift=1.0)
    before = [naive_token_logprobs(model, torch.tensor([s.input_ids]), torch.ones(1, len(s.input_ids),
              dtype=torch.long))[0].detach() for s in samples]
    cfg, stage = _dapo_cfg()
    m = _update(model, samples, cfg, stage, group_stats={"groups_kept": 1.0})
    # One minibatch, old logprobs = current weights: r = 1, no clipping, objective = A per token:
    # (4 x +1 + 2 x -1) / 6 tokens -> loss = -1/3
    assert m["loss"] == pytest.approx(-1 / 3, abs=1e-5)
    assert m["clip_frac_low"] == 0.0 and m["clip_frac_high"] == 0.0
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    # Sampler logprobs are 1 nat below the trainer's: log r = +1 on all 6 tokens:
    # |diff| = 1, k3 = e - 1 - 1 = 0.71828 > warn level 0.05, and 1 > log 2 on every token.
    assert m["mismatch/abs_diff_mean"] == pytest.approx(1.0, abs=1e-5)
    assert m["mismatch/kl_k3"] == pytest.approx(math.e - 2.0, abs=1e-4)
    assert m["mismatch/share_over_bound"] == 1.0 and m["mismatch/warn"] == 1.0
    assert m["steps"] == 1 and m["loss_tokens"] == 6 and m["groups_kept"] == 1.0
    assert m["grad_norm"] > 0 and m["entropy"] > 0
    # the update moves probability towards A > 0 and away from A < 0
    after = [naive_token_logprobs(model, torch.tensor([s.input_ids]), torch.ones(1, len(s.input_ids),
             dtype=torch.long))[0].detach() for s in samples]
    gain = [float(((a - b) * torch.tensor(s.loss_mask[1:])).sum()) for a, b, s in zip(after, before, samples)]
    assert gain[0] > 0 > gain[1]


def test_iteration_update_tis_and_matched_sampler():
    torch.manual_seed(0)
    model = tiny_llama()
    cfg, stage = _dapo_cfg(tis_cap=2.0)
    # log r = +1 -> weight min(e, 2) = 2 on every token: loss = 2 x (-1/3)
    m = _update(copy.deepcopy(model), _dapo_samples(model, 1.0), cfg, stage)
    assert m["loss"] == pytest.approx(-2 / 3, abs=1e-5)
    # a sampler that agrees with the trainer: no mismatch, no warning, weight 1
    m = _update(copy.deepcopy(model), _dapo_samples(model, 0.0), cfg, stage)
    assert m["mismatch/kl_k3"] == pytest.approx(0.0, abs=1e-6) and m["mismatch/warn"] == 0.0
    assert m["loss"] == pytest.approx(-1 / 3, abs=1e-5)


def test_sampler_old_logprobs_take_the_ratio_against_the_sampler_and_measure_the_first_step():
    torch.manual_seed(0)
    model = tiny_llama()
    cfg, stage = _dapo_cfg(old_logprobs="sampler")
    # sampler 1 nat below the trainer: r = e on every token. A = +1 clips at 1 + eps_high, A = -1
    # keeps -e: loss = -(4 (1 + eps_high) - 2e) / 6. The first step (old weights) sees log r = +1.
    m = _update(copy.deepcopy(model), _dapo_samples(model, 1.0), cfg, stage)
    assert m["loss"] == pytest.approx(-(4 * (1 + stage.eps_high) - 2 * math.e) / 6, abs=1e-5)
    assert m["clip_frac_high"] == pytest.approx(4 / 6, abs=1e-6)
    assert m["mismatch/abs_diff_mean"] == pytest.approx(1.0, abs=1e-5)
    assert m["mismatch/kl_k3"] == pytest.approx(math.e - 2.0, abs=1e-4) and m["mismatch/warn"] == 1.0
    # a sampler that agrees: the same update as rescoring with the trainer, without the pass
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    ma = _update(a, _dapo_samples(model, 0.0), cfg, stage)
    mb = _update(b, _dapo_samples(model, 0.0), _dapo_cfg()[0], stage)
    assert ma["loss"] == pytest.approx(mb["loss"], abs=1e-6) == -1 / 3
    assert ma["mismatch/kl_k3"] == pytest.approx(0.0, abs=1e-6)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6)


def test_sampler_old_logprobs_measure_the_mismatch_at_the_first_step_only():
    """Two steps: the second runs at moved weights, where trainer and sampler differ by design."""
    torch.manual_seed(0)
    model = tiny_llama()
    cfg, _ = _dapo_cfg(old_logprobs="sampler")
    stage = DAPOStage(batch_size=1, lr=5e-2, max_turns=4, l_thr=3)
    m = _update(model, _dapo_samples(model, 0.0), cfg, stage)
    assert m["steps"] == 2 and (m["ratio_max"] > 1.01 or m["ratio_min"] < 0.99)  # the weights moved
    assert m["mismatch/abs_diff_mean"] == pytest.approx(0.0, abs=1e-6)


def test_sampler_old_logprobs_fall_back_to_the_trainer_where_a_sample_has_none(caplog):
    torch.manual_seed(0)
    model = tiny_llama()
    samples = _dapo_samples(model, 1.0)
    samples[1].behaviour_logprobs = [0.0] * len(samples[1].behaviour_logprobs)
    cfg, stage = _dapo_cfg(old_logprobs="sampler")
    m = _update(model, samples, cfg, stage)
    assert "the trainer scores them all" in caplog.text
    # rescored: r = 1, no clipping; the monitor counts the sample without logprobs
    assert m["loss"] == pytest.approx(-1 / 3, abs=1e-5) and m["mismatch/samples_without_logprobs"] == 1


def test_sampler_old_logprobs_exclude_tis():
    with pytest.raises(ValueError, match="already taken against the sampler"):
        DAPOConfig(old_logprobs="sampler", tis_cap=2.0)


def test_iteration_update_minibatches_and_guards():
    torch.manual_seed(0)
    model = tiny_llama()
    cfg, _ = _dapo_cfg()
    stage = DAPOStage(batch_size=1, lr=1e-2, max_turns=4, l_thr=3)
    m = _update(model, _dapo_samples(model, 0.0), cfg, stage)
    assert m["steps"] == 2 and m["samples"] == 2
    assert _update(model, [], cfg, stage)["steps"] == 0
    with pytest.raises(ValueError, match="ref_model"):
        _update(model, _dapo_samples(model, 0.0), cfg,
                DAPOStage(kl_coef=0.1, max_turns=4, l_thr=3))


def test_rft_trains_on_resolved_only_and_writes_checkpoint(tmp_path):
    torch.manual_seed(0)
    base = save_checkpoint(tiny_llama(), tiny_tokenizer(), tmp_path / "base", {"stage": "base"})
    turns = [([10, 11, 12], False, [30, 31]), ([40, 41], True, [32]), ([13, 14, 2], False, [])]
    trajs = [make_trajectory(prompt=[3, 4, 5], turns=turns, sample_index=i) for i in range(2)]
    trajs.append(make_trajectory(prompt=[3, 4, 5], turns=turns, status="unresolved", reward=0.0,
                                 sample_index=2))
    cfg = _cfg(batch_size=2, epochs=4)
    out = rft.train(trajs, base, cfg, tmp_path / "rft-0")
    info = read_info(out)
    assert info["stage"] == "rft" and info["parent"] == str(base)
    m = info["metrics"]
    # 2 resolved x 6 loss tokens: turns 1 and 3 (3 + 3 tokens); the format-error turn is masked
    assert m["trajectories"] == 2 and m["loss_tokens"] == 4 * 2 * 6 and m["steps"] == 4
    assert m["loss_last"] < m["loss_first"]
    with pytest.raises(ValueError, match="resolved"):
        rft.train(trajs[2:], base, cfg, tmp_path / "rft-1")


_TWO_PROCESS_SCRIPT = '''
import json, sys, torch
from swerl.config import DAPOConfig, DAPOStage, SFTConfig
from training.dapo import iteration_update
from bench.synthetic import synthetic_samples, tiny_llama
from training.trainer import Trainer
torch.manual_seed(0)
samples = synthetic_samples([100, 53, 71, 32, 120], vocab=128)
for s, a in zip(samples, [1.0, -1.0, 0.5, -0.5, 1.0]):
    s.advantage = a
if sys.argv[1] == "sampler":  # engine logprobs on all but the last sample: every rank must rescore
    for s in samples[:4]:
        s.behaviour_logprobs = [-0.5 if m else 0.0 for m in s.loss_mask]
# 5 samples, 2 per step: the last step leaves rank 1 with only a padding micro-batch
stage = DAPOStage(batch_size=2, lr=1e-3, max_turns=4, l_thr=3)
cfg = DAPOConfig(stages=[stage], train=SFTConfig(micro_batch_tokens=128, gradient_checkpointing=False),
                 old_logprobs=sys.argv[1])
t = Trainer(tiny_llama(), cfg.train, total_steps=6, lr=stage.lr, schedule="constant", progress=False)
m = [iteration_update(t, samples, cfg, stage, seed=k) for k in range(2)]
w = sum(float(p.detach().double().sum()) for p in t.unwrapped().parameters())
if t.accelerator.is_main_process:
    print(json.dumps({"n": t.accelerator.num_processes, "loss": [x["loss"] for x in m],
                      "grad_norm": [x["grad_norm"] for x in m], "tokens": m[0]["tokens"], "w": w}))
t.close()
'''


@pytest.mark.slow
@pytest.mark.parametrize("old_logprobs", ["trainer", "sampler"])
def test_two_processes_match_one(tmp_path, old_logprobs):
    """DDP over gloo: sharding, padding micro-batches and global token normalisation give the
    single-process numbers. With `sampler` one sample lacks engine logprobs: the ranks agree to
    rescore (a rank that scored alone would hang in the collective)."""
    script = tmp_path / "two.py"
    script.write_text(_TWO_PROCESS_SCRIPT)
    repo = Path(__file__).resolve().parents[2]
    env = os.environ | {"PYTHONPATH": str(repo), "ACCELERATE_USE_CPU": "true"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    outs = []
    for cmd in ([sys.executable, str(script), old_logprobs], torchrun + [str(script), old_logprobs]):
        # Own process group, so a hang is killed with its workers, not just the launcher.
        proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        assert proc.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    one, two = outs
    assert (one["n"], two["n"]) == (1, 2)
    assert two["tokens"] == one["tokens"]
    assert two["loss"] == pytest.approx(one["loss"], abs=1e-6)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    assert two["w"] == pytest.approx(one["w"], abs=1e-4)


def _dapo_job(tmp_path, model_dir, name, stage, state_in=None):
    cfg = DAPOConfig(stages=[stage], train=_cfg())
    return UpdateJob(kind="dapo", model_dir=str(model_dir), out_dir=str(tmp_path / name),
                     train=cfg.model_dump(mode="json"), stage=stage.model_dump(mode="json"),
                     state_in=state_in and str(state_in), state_out=str(tmp_path / f"{name}.state"))


def test_dapo_iteration_two_starts_from_iteration_ones_optimizer(tmp_path):
    torch.manual_seed(0)
    model = tiny_llama()
    base = save_checkpoint(model, tiny_tokenizer(), tmp_path / "base", {"stage": "base"})
    samples = _dapo_samples(model, shift=0.0)
    stage1 = DAPOStage(batch_size=1, lr=1e-2, max_turns=4, l_thr=3)
    m1 = dapo.run_job(_dapo_job(tmp_path, base, "it0", stage1), samples)
    assert m1["steps"] == 2 and m1["optimizer_steps_total"] == 2
    saved = torch.load(tmp_path / "it0.state" / "optimizer.pt", weights_only=True)["state"]
    assert read_state_info(tmp_path / "it0.state")["steps_done"] == 2

    # iteration 2's trainer (another DAPO stage: its own lr) loads exactly what iteration 1 left
    stage2 = DAPOStage(batch_size=1, lr=5e-3, max_turns=4, l_thr=3)
    reloaded, _, _ = load_checkpoint(tmp_path / "it0")
    trainer = dapo_trainer(reloaded, DAPOConfig(stages=[stage2], train=_cfg()), stage2, 2, progress=False)
    trainer.load_state(tmp_path / "it0.state")
    opt = trainer.optimizer.optimizer
    names = [n for n, _ in trainer.unwrapped().named_parameters()]
    for name, p in zip(names, opt.param_groups[0]["params"]):
        mine, theirs = opt.state[p], saved[name]
        assert float(mine["step"]) == float(theirs["step"]) == 2.0
        assert torch.equal(mine["exp_avg"], theirs["exp_avg"]) and torch.equal(mine["exp_avg_sq"], theirs["exp_avg_sq"])
    assert opt.param_groups[0]["lr"] == 5e-3 and trainer.steps_done == 2
    assert any(float(saved[n]["exp_avg"].abs().sum()) > 0 for n in names)

    m2 = dapo.run_job(_dapo_job(tmp_path, tmp_path / "it0", "it1", stage2, state_in=tmp_path / "it0.state"), samples)
    assert m2["optimizer_steps_total"] == 4 and m2["lr"] == 5e-3
    after = torch.load(tmp_path / "it1.state" / "optimizer.pt", weights_only=True)["state"]
    assert all(float(after[n]["step"]) == 4.0 for n in names)
    # a fresh optimizer would have taken other steps from the same weights and samples
    fresh = dapo.run_job(_dapo_job(tmp_path, tmp_path / "it0", "it1-fresh", stage2), samples)
    w_carried = load_checkpoint(tmp_path / "it1")[0].state_dict()
    w_fresh = load_checkpoint(tmp_path / "it1-fresh")[0].state_dict()
    assert fresh["optimizer_steps_total"] == 2
    assert any(not torch.equal(w_carried[k], w_fresh[k]) for k in w_carried)


def test_training_state_refuses_another_layout(tmp_path):
    torch.manual_seed(0)
    t = Trainer(tiny_llama(), _cfg(), total_steps=1, progress=False)
    t.step(t.micro_batches(synthetic_samples([30], vocab=128), [0]), rft.sft_loss)
    t.save_state(tmp_path / "st")
    with pytest.raises(ValueError, match="saved 'torch', this trainer is 'dcp'"):
        load_train_state(tmp_path / "st", t.unwrapped(), t.optimizer.optimizer, sharded=True)
    (tmp_path / "st" / "train_state.json").unlink()
    with pytest.raises(IncompleteCheckpoint):
        t.load_state(tmp_path / "st")


def test_an_update_without_steps_hands_on_no_invented_adamw_step(tmp_path):
    torch.manual_seed(0)
    t = Trainer(tiny_llama(), _cfg(), total_steps=1, progress=False)
    t.save_state(tmp_path / "st")
    assert read_state_info(tmp_path / "st")["empty"] and not (tmp_path / "st" / "optimizer.pt").exists()
    t2 = Trainer(tiny_llama(), _cfg(), total_steps=1, progress=False)
    t2.load_state(tmp_path / "st")
    assert not t2.optimizer.optimizer.state and t2.steps_done == 0
