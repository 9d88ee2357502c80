"""One policy update as data: what an RFT or DAPO update reads and writes, in files.

The same job runs in the pipeline's own process or in every rank of an `accelerate launch`
group (training/launch.py); the group gets it as `job.json` + `samples.jsonl` and answers
with the checkpoint, the training state and `metrics.json`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate.utils.environment import parse_flag_from_env
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from swerl.config import TrainerConfig
from training.layout import with_rope_parameters
from training.precision import resolve_dtype
from training.trajectory import TrainingSample

JOB_FILE, SAMPLES_FILE, METRICS_FILE = "job.json", "samples.jsonl", "metrics.json"


@dataclass
class UpdateJob:
    """`train` is the update's trainer section as a dict (SFTConfig for rft, DAPOConfig for dapo),
    `stage` the DAPO stage; `state_in`/`state_out` are training-state directories (AdamW moments,
    step count) that carry DAPO's optimizer from one update to the next; `info` goes into the
    checkpoint's swerl.json, its `metrics` merged with the update's."""

    kind: str  # "rft" | "dapo"
    model_dir: str
    out_dir: str
    train: dict[str, Any]
    info: dict[str, Any] = field(default_factory=dict)
    stage: dict[str, Any] | None = None
    state_in: str | None = None
    state_out: str | None = None
    seed: int = 0
    temperature: float = 1.0
    group_stats: dict[str, float] = field(default_factory=dict)
    chunk: int = 1024
    rope_parameters: dict[str, Any] | None = None
    started: float = field(default_factory=time.perf_counter)

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if k != "started"}, default=str)

    @classmethod
    def from_json(cls, text: str) -> "UpdateJob":
        return cls(**json.loads(text))


def write_samples(path: Path, samples: list[TrainingSample]) -> None:
    with open(path, "w") as f:
        for s in samples:
            f.write(json.dumps(asdict(s)) + "\n")


def read_samples(path: Path) -> list[TrainingSample]:
    with open(path) as f:
        return [TrainingSample(**json.loads(line)) for line in f if line.strip()]


def device_type() -> str:
    """The device kind this process trains on (checked without starting CUDA)."""
    return "cuda" if torch.version.cuda is not None and torch.cuda.is_available() else "cpu"


def load_dtype(tcfg: TrainerConfig) -> torch.dtype:
    """fp32, except for a sharded bf16 run: there each rank keeps only a shard of fp32 master
    weights, and rank 0 reads bf16 from disk (accelerate upcasts it before sharding)."""
    bf16 = resolve_dtype(tcfg.dtype, device_type()) == "bfloat16"
    return torch.bfloat16 if bf16 and parse_flag_from_env("ACCELERATE_USE_FSDP") else torch.float32


def load_trainable(job: UpdateJob, tcfg: TrainerConfig) -> tuple[Any, Any]:
    """The job's model (with the layout's long-context RoPE) and tokenizer."""
    config = with_rope_parameters(AutoConfig.from_pretrained(job.model_dir), job.rope_parameters)
    model = AutoModelForCausalLM.from_pretrained(job.model_dir, config=config, dtype=load_dtype(tcfg))
    return model, AutoTokenizer.from_pretrained(job.model_dir)


def pad_id_of(tokenizer: Any) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def finish(trainer: Any, tokenizer: Any, job: UpdateJob, metrics: dict[str, float]) -> dict[str, float]:
    """Write the checkpoint (swerl.json with the update's metrics) and the training state, then
    end the trainer's process group. Returns the metrics with the update's wall time."""
    metrics = metrics | {"time/training_s": time.perf_counter() - job.started}
    record = job.info | {"metrics": (job.info.get("metrics") or {}) | metrics}
    trainer.save(job.out_dir, tokenizer, record)
    if job.state_out:
        trainer.save_state(job.state_out)
    trainer.close()
    return metrics
