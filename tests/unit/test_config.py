import subprocess
import sys

import pytest

from swerl.config import ConfigError, flat_params, load_config

pytestmark = pytest.mark.unit


def test_presets_load():
    for name in ("smoke", "cpu-demo-1turn", "cpu-demo-multiturn", "gpu-7b", "paper-72b"):
        cfg = load_config(name)
        assert cfg.preset == name


def test_paper_preset_carries_the_papers_numbers():
    cfg = load_config("paper-72b")
    s1, s2 = cfg.dapo.stages
    assert (s1.group_size, s1.eps_low, s1.eps_high, s1.lr, s1.batch_size) == (10, 0.2, 0.3, 1e-6, 128)
    assert (s2.group_size, s2.eps_low, s2.eps_high, s2.lr, s2.batch_size) == (10, 0.2, 0.26, 1e-6, 256)
    assert (s1.problems_per_iteration, s2.problems_per_iteration) == (300, 100)
    assert (s1.max_turns, s2.max_turns) == (40, 80)
    assert (s1.max_context_tokens, s2.max_context_tokens) == (65536, 131072)
    assert s1.l_thr == s2.l_thr == 10
    assert s2.drop_never_solved and s2.filter_solved_share == pytest.approx(2 / 3, abs=1e-3)
    assert (cfg.rft.train.lr, cfg.rft.train.batch_size) == (5e-6, 64)
    assert cfg.rollout.sampling.temperature == 1.0 and cfg.rollout.sampling.top_p == 1.0


def test_unknown_override_names_the_key():
    with pytest.raises(ConfigError, match=r"dapo\.eps_hgih: unknown key"):
        load_config("smoke", ["dapo.eps_hgih=0.3"])


def test_list_override_and_bad_index():
    cfg = load_config("smoke", ["dapo.stages.0.eps_high=0.3", "rollout.max_turns=7"])
    assert cfg.dapo.stages[0].eps_high == 0.3 and cfg.rollout.max_turns == 7
    with pytest.raises(ConfigError, match=r"dapo\.stages\.5"):
        load_config("smoke", ["dapo.stages.5.eps_high=0.3"])


def test_invalid_value_names_the_path():
    with pytest.raises(ConfigError, match=r"rollout\.max_turns"):
        load_config("smoke", ["rollout.max_turns=0"])
    with pytest.raises(ConfigError, match=r"environment\.sandbox"):
        load_config("smoke", ["environment.sandbox=podman"])
    with pytest.raises(ConfigError, match=r"environment\.window"):
        load_config("smoke", ["environment.window=0"])
    assert load_config("smoke", ["environment.window=1"]).environment.window == 1


def test_preset_file_with_unknown_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout:\n  max_turns: 5\n  sampling:\n    temprature: 1.0\n")
    with pytest.raises(ConfigError, match=r"rollout\.sampling\.temprature: unknown key"):
        load_config(str(bad))


def test_training_sampling_guard_names_the_setting():
    with pytest.raises(ConfigError, match=r"rollout\.sampling.*top_p=0\.9"):
        load_config("smoke", ["rollout.sampling.top_p=0.9"])
    with pytest.raises(ConfigError, match=r"min_p"):
        load_config("smoke", ["rollout.sampling.min_p=0.05"])
    # evaluation may sample however it likes
    assert load_config("smoke", ["eval.sampling.top_p=0.9"]).eval.sampling.top_p == 0.9


def test_line_style_needs_a_quoted_line_and_an_open_file():
    assert load_config("cpu-demo-1turn").rollout.prompt_style == "line"
    for bad in ("data.hint_level=3", "data.exact_hint_level=false", "rollout.show_source=false",
                "rollout.action_format=tools"):
        with pytest.raises(ConfigError, match=r"rollout\.prompt_style: 'line'"):
            load_config("cpu-demo-1turn", [bad])


def test_flat_params_cover_nested_lists():
    p = flat_params(load_config("paper-72b"))
    assert p["dapo.stages.1.eps_high"] == "0.26"
    assert p["rollout.sampling.temperature"] == "1.0"


def test_cli_config_show_exit_codes():
    ok = subprocess.run([sys.executable, "-m", "flows.cli", "config", "show", "--preset", "paper-72b"],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and "eps_high: 0.26" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "flows.cli", "config", "show", "--set", "dapo.eps_hgih=0.3"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "dapo.eps_hgih" in bad.stderr
