"""Where the rollout engine and the trainer run on a GPU node: `cfg.gpu` as process settings.

`split` gives vLLM some devices (tensor parallel over them) and the trainer's process group the
others, through CUDA_VISIBLE_DEVICES: each side sees only its own. `colocate` gives both every
device and needs vLLM's sleep mode, which frees the KV cache and moves the weights to host memory
while the trainer updates. `shared` (CPU, one small GPU) changes nothing.
"""

from __future__ import annotations

import os
from typing import Any

from swerl.config import GPUConfig, TrainerConfig


def devices_env(devices: list[int]) -> dict[str, str]:
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(d) for d in devices)} if devices else {}


def trainer_env(gpu: GPUConfig) -> dict[str, str]:
    """Environment the trainer's process group starts with: its devices under `split`."""
    return devices_env(gpu.train_devices) if gpu.layout == "split" else {}


def trainer_processes(train: TrainerConfig, gpu: GPUConfig) -> int | None:
    """Processes in the trainer's group; None leaves the accelerate config's own count."""
    if train.num_processes is not None:
        return train.num_processes
    return len(gpu.train_devices) if gpu.layout == "split" else None


def pin_rollout_devices(gpu: GPUConfig) -> None:
    """Make the engine's process see only its devices under `split`. Call before the engine
    starts: CUDA reads CUDA_VISIBLE_DEVICES once, at its first use in the process."""
    os.environ.update(devices_env(gpu.rollout_devices) if gpu.layout == "split" else {})


def vllm_engine_kwargs(gpu: GPUConfig) -> dict[str, Any]:
    """Arguments for `vllm.LLM(...)` that the layout decides."""
    kwargs: dict[str, Any] = {"tensor_parallel_size": gpu.tensor_parallel,
                              "gpu_memory_utilization": gpu.gpu_memory_utilization}
    if gpu.max_model_len is not None:
        kwargs["max_model_len"] = gpu.max_model_len
    if gpu.rope_parameters is not None:
        kwargs["hf_overrides"] = {"rope_parameters": dict(gpu.rope_parameters)}
    if gpu.layout == "colocate":
        kwargs["enable_sleep_mode"] = True
    return kwargs


def with_rope_parameters(config: Any, rope_parameters: dict[str, Any] | None) -> Any:
    """A transformers model config with the layout's long-context RoPE (what vLLM gets as
    `hf_overrides`), merged over the model's own; unchanged when there is none."""
    if rope_parameters is None:
        return config
    config.rope_parameters = {**(getattr(config, "rope_parameters", None) or {}), **rope_parameters}
    if hasattr(config, "standardize_rope_params"):
        config.standardize_rope_params()
    return config
