"""Training rollouts must sample the raw policy; evaluation may sample however it likes."""

import pytest

from swerl.config import ConfigError, load_config
from training.inference.base import SamplingParams, check_completion, Completion

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("override, name", [
    ("rollout.sampling.top_p=0.9", "top_p"),
    ("rollout.sampling.top_k=20", "top_k"),
    ("rollout.sampling.min_p=0.05", "min_p"),
    ("rollout.sampling.temperature=0", "temperature"),
    ("rollout.sampling.repetition_penalty=1.1", "repetition_penalty"),
])
def test_training_sampling_filters_fail_at_config_time(override, name):
    with pytest.raises(ConfigError) as err:
        load_config("smoke", [override])
    assert "rollout.sampling" in str(err.value)
    assert name in str(err.value)


def test_eval_sampling_may_filter():
    cfg = load_config("smoke", ["eval.sampling.top_p=0.9", "eval.sampling.temperature=0.6",
                                "eval.sampling.top_k=20"])
    assert cfg.eval.sampling.top_p == 0.9 and cfg.eval.sampling.temperature == 0.6
    assert cfg.rollout.sampling.unbiased_problems() == []


def test_sampling_params_from_config_carries_every_field():
    cfg = load_config("smoke", ["eval.sampling.top_p=0.9", "eval.sampling.min_p=0.1"])
    sp = SamplingParams.from_config(cfg.eval.sampling, seed=3, stop_token_ids=[7])
    assert (sp.top_p, sp.min_p, sp.seed, sp.stop_token_ids) == (0.9, 0.1, 3, (7,))
    assert sp.max_new_tokens == cfg.eval.sampling.max_new_tokens


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_k=-2),
                                 dict(min_p=1.5), dict(repetition_penalty=0), dict(max_new_tokens=0)])
def test_invalid_sampling_params_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad)


def test_completion_check_catches_ignored_limits():
    sp = SamplingParams(max_new_tokens=3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        check_completion(Completion([5, 6, 7, 8], [0.0] * 4, "length"), sp, {2})
    with pytest.raises(ValueError, match="stop ids"):
        check_completion(Completion([5, 6], [0.0] * 2, "stop"), sp, {2})
    with pytest.raises(ValueError, match="finish_reason=length"):
        check_completion(Completion([5], [0.0], "length"), sp, {2})
    ok = Completion([5, 2], [-1.0, -0.5], "stop")
    assert check_completion(ok, sp, {2}) is ok


def test_rft_collection_may_sample_cooler_and_defaults_to_the_rollout_sampler():
    """RFT keeps resolved episodes as SFT targets (no importance ratio), so its sampler is free."""
    cfg = load_config("smoke", ["rft.sampling.temperature=0.5", "rft.sampling.max_new_tokens=64"])
    assert cfg.rft.sampling.temperature == 0.5 and cfg.rft.sampling.max_new_tokens == 64
    assert cfg.rollout.sampling.temperature == 1.0
    assert load_config("smoke").rft.sampling is None
    with pytest.raises(ConfigError, match="rft.sampling.temprature"):
        load_config("smoke", ["rft.sampling.temprature=0.5"])
