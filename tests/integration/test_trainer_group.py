"""A DAPO update as a 2-process FSDP2 group through `accelerate launch` (CPU, gloo) gives the
single-process trainer's numbers: loss, gradient norm, new weights, and, one iteration later,
the same again from the sharded (DCP) optimizer state as from the single-process one."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bench.synthetic import synthetic_samples, tiny_llama, tiny_tokenizer
from swerl.config import DAPOConfig, DAPOStage, GPUConfig, TrainerConfig
from training.checkpoint import read_info, read_state_info, save_checkpoint
from training.launch import UpdateFailed, run_update
from training.update_job import UpdateJob

pytestmark = pytest.mark.integration

STAGE = DAPOStage(batch_size=2, lr=1e-3, max_turns=4, l_thr=3)


def _samples():
    samples = synthetic_samples([100, 53, 71, 32, 120], vocab=128)
    for s, a in zip(samples, [1.0, -1.0, 0.5, -0.5, 1.0]):
        s.advantage = a
    return samples


def _two_iterations(root: Path, base: Path, accelerate_config: str | None) -> list[dict]:
    train = TrainerConfig(micro_batch_tokens=128, gradient_checkpointing=True, accelerate_config=accelerate_config,
                          num_processes=2 if accelerate_config else None)
    cfg = DAPOConfig(stages=[STAGE], train=train)
    out, parent, state = [], base, None
    for it in range(2):
        job = UpdateJob(kind="dapo", model_dir=str(parent), out_dir=str(root / f"it{it}"),
                        train=cfg.model_dump(mode="json"), stage=STAGE.model_dump(mode="json"),
                        state_in=state, state_out=str(root / f"it{it}.state"), seed=it,
                        info={"stage": "dapo-s1", "iteration": it})
        out.append(run_update(job, _samples(), train, GPUConfig()))
        parent, state = root / f"it{it}", job.state_out
    return out


def test_two_process_fsdp_group_matches_one_process(tmp_path):
    torch.manual_seed(0)
    base = save_checkpoint(tiny_llama(), tiny_tokenizer(), tmp_path / "base", {"stage": "base"})
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = _two_iterations(tmp_path / "one", base, None)
    two = _two_iterations(tmp_path / "two", base, "infra/accelerate/fsdp.yaml")
    for a, b in zip(one, two):
        assert b["tokens"] == a["tokens"] and b["steps"] == a["steps"] == 3
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    assert two[1]["optimizer_steps_total"] == one[1]["optimizer_steps_total"] == 6
    assert read_state_info(tmp_path / "two" / "it1.state")["format"] == "dcp"
    assert read_state_info(tmp_path / "one" / "it1.state")["format"] == "torch"
    assert list((tmp_path / "two" / "it1.state").glob("*.distcp"))  # one shard file per rank
    w1 = load_file(tmp_path / "one" / "it1" / "model.safetensors")
    w2 = load_file(tmp_path / "two" / "it1" / "model.safetensors")
    assert w1.keys() == w2.keys()
    assert all(torch.allclose(w1[k], w2[k], atol=1e-6) for k in w1)
    assert any(not torch.equal(w1[k], load_file(base / "model.safetensors")[k]) for k in w1)
    # the group wrote the checkpoint's info with its own metrics, as the in-process path does
    assert read_info(tmp_path / "two" / "it1")["metrics"]["loss"] == pytest.approx(two[1]["loss"])


def test_a_failing_group_is_one_error_naming_its_last_lines(tmp_path):
    train = TrainerConfig(accelerate_config="infra/accelerate/fsdp.yaml", num_processes=1)
    job = UpdateJob(kind="dapo", model_dir=str(tmp_path / "no-such-model"), out_dir=str(tmp_path / "it0"),
                    train=DAPOConfig(stages=[STAGE], train=train).model_dump(mode="json"),
                    stage=STAGE.model_dump(mode="json"))
    with pytest.raises(UpdateFailed, match=r"dapo update: `accelerate launch` exited [1-9]\d*: rank0: ") as err:
        run_update(job, _samples(), train, GPUConfig())
    assert "no-such-model" in str(err.value)  # the rank's own error, from the tail
    assert not (tmp_path / "it0").exists()
