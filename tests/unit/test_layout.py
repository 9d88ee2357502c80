"""The GPU layout section, the accelerate config a trainer names, and what they turn into."""

import os
import sys

import pytest
from transformers import AutoModelForCausalLM, Qwen2Config

from swerl.config import ConfigError, GPUConfig, SFTConfig, load_config
from training.launch import launch_command
from training.layout import (pin_rollout_devices, trainer_env, trainer_processes, vllm_engine_kwargs,
                             with_rope_parameters)
from training.stages import engine_released

pytestmark = pytest.mark.unit

YARN = "{rope_type: yarn, factor: 4.0, original_max_position_embeddings: 32768, rope_theta: 1000000.0}"


def _error(preset: str, *overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(preset, list(overrides))
    return str(err.value)


def test_gpu_presets_fit_one_node_of_eight():
    for name in ("gpu-7b", "paper-72b"):
        g = load_config(name).gpu
        used = set(g.rollout_devices) | set(g.train_devices) if g.layout == "split" else set(range(g.tensor_parallel))
        assert used <= set(range(8)) and g.tensor_parallel <= 8, name
    g7 = load_config("gpu-7b")
    assert vllm_engine_kwargs(g7.gpu) == {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.9,
                                          "max_model_len": 32768}
    assert trainer_env(g7.gpu) == {"CUDA_VISIBLE_DEVICES": "2,3,4,5,6,7"}
    assert trainer_processes(g7.dapo.train, g7.gpu) == 6
    g72 = load_config("paper-72b")
    kw = vllm_engine_kwargs(g72.gpu)
    assert kw["enable_sleep_mode"] is True and kw["tensor_parallel_size"] == 8 and kw["max_model_len"] == 131072
    assert kw["hf_overrides"]["rope_parameters"]["rope_type"] == "yarn"
    assert trainer_env(g72.gpu) == {} and trainer_processes(g72.dapo.train, g72.gpu) is None


def test_layout_mistakes_are_one_line_config_errors():
    split = ["gpu.layout=split", "gpu.rollout_devices=[0, 1]", "gpu.train_devices=[1, 2]", "gpu.tensor_parallel=2"]
    assert "overlap" in _error("gpu-7b", *split)
    assert "tensor_parallel (1) must equal" in _error("gpu-7b", "gpu.tensor_parallel=1")
    assert "needs rollout_devices and train_devices" in _error("smoke", "gpu.layout=split")
    assert "accelerate_config must name" in _error("gpu-7b", "dapo.train.accelerate_config=single")
    assert "one per gpu.train_devices" in _error("gpu-7b", "dapo.train.num_processes=3")
    assert "needs rollout.backend vllm" in _error("smoke", "gpu.layout=colocate")
    assert "for layout split" in _error("smoke", "gpu.train_devices=[0]")
    assert "rope_theta" in _error("paper-72b", "gpu.rope_parameters={rope_type: yarn, factor: 4.0}")
    assert "below the longest context" in _error("paper-72b", "gpu.max_model_len=65536")
    assert "gpu.tensor_paralel: unknown key" in _error("smoke", "gpu.tensor_paralel=2")


def test_accelerate_config_must_be_a_launchable_file():
    assert "no such file" in _error("smoke", "dapo.train.accelerate_config=infra/accelerate/nope.yaml")
    assert SFTConfig(accelerate_config="single").in_process and SFTConfig().in_process
    assert not SFTConfig(accelerate_config="infra/accelerate/fsdp.yaml").in_process


def test_deepspeed_configs_are_refused(tmp_path):
    ds = tmp_path / "ds.yaml"
    ds.write_text("distributed_type: DEEPSPEED\nnum_processes: 8\n")
    assert "DEEPSPEED is not one of" in _error("smoke", f"rft.train.accelerate_config={ds}")


def test_launch_command_reads_the_trainer_and_layout(tmp_path):
    train = SFTConfig(accelerate_config="infra/accelerate/fsdp.yaml", num_processes=2)
    cmd = launch_command(train, GPUConfig(), tmp_path)
    assert cmd[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    assert cmd[cmd.index("--config_file") + 1].endswith("infra/accelerate/fsdp.yaml")
    assert cmd[cmd.index("--num_processes") + 1] == "2"
    assert cmd[cmd.index("--mixed_precision") + 1] == "no"  # train.dtype float32
    assert cmd[-3:] == ["-m", "training.launch", str(tmp_path)]
    assert "--num_processes" not in launch_command(train.model_copy(update={"num_processes": None}), GPUConfig(),
                                                   tmp_path)


def test_pin_rollout_devices_only_under_split(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # recorded: the test's change is undone after it
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    pin_rollout_devices(GPUConfig())
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    pin_rollout_devices(load_config("gpu-7b").gpu)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_rope_parameters_reach_the_trainers_model():
    cfg = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=64, rope_theta=1e6)
    rope = load_config("paper-72b").gpu.rope_parameters
    model = AutoModelForCausalLM.from_config(with_rope_parameters(cfg, rope))
    assert model.config.rope_parameters["rope_type"] == "yarn" and model.config.rope_parameters["factor"] == 4.0
    assert model.config.rope_parameters["rope_theta"] == 1e6
    assert model.model.rotary_emb.rope_type == "yarn" and model.model.rotary_emb.attention_scaling > 1.0
    assert with_rope_parameters(cfg, None) is cfg


class _Ctx:
    def __init__(self, layout: str, engine):
        self.cfg = load_config("paper-72b") if layout == "colocate" else load_config("smoke")
        self.engine = engine


def test_colocated_engine_sleeps_during_the_update():
    calls = []

    class Engine:
        def sleep(self):
            calls.append("sleep")

        def wake_up(self):
            calls.append("wake")

    with engine_released(_Ctx("colocate", Engine())):
        calls.append("update")
    assert calls == ["sleep", "update", "wake"]
    with engine_released(_Ctx("shared", Engine())):
        calls.append("shared")
    assert calls[-1] == "shared" and calls.count("sleep") == 1
    with pytest.raises(RuntimeError, match="cannot sleep"):
        with engine_released(_Ctx("colocate", object())):
            pass


def test_the_runs_engine_is_started_with_the_layouts_arguments(monkeypatch):
    """backend_for hands `gpu`'s vLLM arguments to the engine it starts (gpu-7b: TP 2, 32k)."""
    from training import run
    from training.inference import vllm_backend

    started = {}

    class FakeLLM:
        def __init__(self, model, **kwargs):
            started.update(kwargs, model=model)

        def get_tokenizer(self):
            return None

    monkeypatch.setattr(vllm_backend, "import_vllm", lambda: type("V", (), {"LLM": FakeLLM}))
    monkeypatch.setattr(vllm_backend, "generation_eos", lambda path: None)
    monkeypatch.setattr(vllm_backend, "resolve_model", lambda name: name)
    monkeypatch.setattr(vllm_backend, "policy_version_of", lambda path: "base")
    monkeypatch.setattr(vllm_backend, "stop_ids_for", lambda tok, eos: {0})
    cfg = load_config("gpu-7b", ["rollout.model=/m"])
    ctx = type("Ctx", (), {"cfg": cfg, "engine": None, "engine_policy_path": None})()
    monkeypatch.setattr(run, "model_dir", lambda ctx, policy: "/m")
    run.backend_for(ctx, "base")
    assert started["tensor_parallel_size"] == 2 and started["max_model_len"] == 32768
    assert started["gpu_memory_utilization"] == 0.9 and started["model"] == "/m"


def test_vllm_backend_sleeps_and_wakes_through_vllms_api():
    from training.inference.vllm_backend import VLLMBackend

    calls = []
    llm = type("LLM", (), {"sleep": lambda s, level: calls.append(("sleep", level)),
                           "wake_up": lambda s: calls.append(("wake_up",)),
                           "reset_prefix_cache": lambda s: calls.append(("reset",))})()
    backend = VLLMBackend.__new__(VLLMBackend)
    backend.llm = llm
    with engine_released(_Ctx("colocate", backend)):
        assert calls == [("sleep", 1)]
    assert calls == [("sleep", 1), ("wake_up",), ("reset",)]
