"""The DAPO stage's update step over a real store: each iteration's AdamW state is published
beside its checkpoint, the next iteration starts from it, and only the newest is kept."""

import pytest
import torch

from bench.synthetic import make_trajectory, tiny_llama, tiny_tokenizer
from swerl.config import DAPOStage, load_config
from swerl.store import Store
from training.checkpoint import read_info, save_checkpoint
from training.run import RunContext, model_dir, publish_checkpoint
from training.stages import drop_train_state, train_state_dir, update_policy
from training.trajectory import training_sample

pytestmark = pytest.mark.unit


def _samples():
    out = []
    for i, (ids, adv) in enumerate((([10, 11, 12, 13], 1.0), ([20, 21], -1.0))):
        s = training_sample(make_trajectory(prompt=[3, 4, 5], turns=[(ids, False, [6])], sample_index=i))
        s.advantage = adv
        out.append(s)
    return out


def test_dapo_iterations_hand_their_optimizer_on_through_the_store(tmp_path, monkeypatch):
    monkeypatch.setenv("SWERL_STATE", str(tmp_path / "state"))
    torch.manual_seed(0)
    base = save_checkpoint(tiny_llama(), tiny_tokenizer(), tmp_path / "base", {"stage": "base"})
    cfg = load_config("smoke", [f"rollout.model={base}", "dapo.train.gradient_checkpointing=false"])
    ctx = RunContext(cfg=cfg, store=Store(f"file://{tmp_path}/store"), run_id="r1", progress=False)
    stage = DAPOStage(batch_size=1, lr=1e-3, max_turns=4, l_thr=3)
    assert train_state_dir(ctx, "base") is None

    policy, totals = "base", []
    for it in range(2):
        name = f"dapo-s1-{it}"
        out = ctx.work / "staging" / name
        m = update_policy(ctx, policy, out, _samples(), stage, {"groups_kept": 1.0},
                          {"stage": "dapo-s1", "iteration": it, "parent": policy}, seed=it)
        publish_checkpoint(ctx, out, name)
        drop_train_state(ctx, policy)
        totals.append(m["optimizer_steps_total"])
        assert ctx.store.dir_complete(ctx.key("train-state", name))
        assert read_info(model_dir(ctx, name))["metrics"]["optimizer_steps_total"] == totals[-1]
        policy = name
    assert totals == [2.0, 4.0]  # iteration 2 went on from iteration 1's two AdamW steps
    assert not ctx.store.exists(ctx.key("train-state", "dapo-s1-0", "train_state.json"))
    assert train_state_dir(ctx, "dapo-s1-0") is None  # dropped once dapo-s1-1 had its own
    assert train_state_dir(ctx, "dapo-s1-1") is not None
