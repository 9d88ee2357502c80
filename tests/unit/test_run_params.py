"""The pipeline's typed parameters become exactly the overrides they name."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from flows.run_params import PRESETS, PipelineParams
from swerl.config import CONFIG_DIR, load_config

pytestmark = pytest.mark.unit


def test_presets_are_the_config_files():
    assert PRESETS == tuple(sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))


def test_empty_fields_keep_the_preset():
    p = PipelineParams(preset="smoke")
    assert p.all_overrides() == []
    assert load_config(p.base, p.all_overrides()) == load_config("smoke")


def test_typed_fields_become_overrides_the_free_ones_last():
    p = PipelineParams(preset="cpu-demo-1turn", seed=2, rollout_backend="vllm", dapo_iterations=6, eval_runs=5, rft=False,
                       overrides=["eval.runs=7"])
    cfg = load_config(p.base, p.all_overrides())
    assert (cfg.seed, cfg.rollout.backend, cfg.rft.enabled) == (2, "vllm", False)
    assert [s.iterations for s in cfg.dapo.stages] == [6] * len(load_config("cpu-demo-1turn").dapo.stages)
    assert cfg.eval.runs == 7, "the free-form overrides win"


@pytest.mark.parametrize("bad", [{"preset": "nope"}, {"seed": "three"}, {"dapo_iterations": 0},
                                 {"rollout_backend": "tgi"}, {"presett": "smoke"}])
def test_wrong_values_are_refused(bad):
    with pytest.raises(ValidationError):
        PipelineParams(**bad)


def test_a_config_file_replaces_the_preset(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text((CONFIG_DIR / "smoke.yaml").read_text())
    p = PipelineParams(config_file=str(f), seed=4)
    assert p.base == str(f) and load_config(p.base, p.all_overrides()).preset == "mine"
