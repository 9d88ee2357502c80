"""Rejection-sampling fine-tuning: supervised training on the policy's own resolved episodes.

Loss is on the assistant tokens of well-formed turns only; format-error turns and observations
stay in the context (the model saw them) but are masked, exactly as ``training_sample`` marks
them. The objective is -mean token logprob over those tokens, through the same chunked
logprob function and Trainer as DAPO.
"""

from __future__ import annotations

import hashlib
import logging
import math
from pathlib import Path
from typing import Any

from swerl.config import RFTConfig, SFTConfig
from training.batching import minibatches
from training.trainer import Trainer, progress_bar, sft_loss
from training.trajectory import TrainingSample, Trajectory, training_sample
from training.update_job import UpdateJob, finish, load_trainable, pad_id_of

log = logging.getLogger(__name__)


def sft_samples(trajectories: list[Trajectory]) -> list[TrainingSample]:
    """Resolved trajectories only, format-error turns masked."""
    return [training_sample(t, mask_format_errors=True)
            for t in trajectories if t.status == "resolved"]


def trajectories_hash(trajectories: list[Trajectory]) -> str:
    """Content hash of the training set, recorded in the checkpoint for provenance."""
    h = hashlib.sha256()
    for key, text in sorted((t.key, t.to_json()) for t in trajectories):
        h.update(key.encode())
        h.update(hashlib.sha256(text.encode()).digest())
    return h.hexdigest()[:16]


def sft_update(trainer: Trainer, samples: list[TrainingSample], epochs: int, batch_size: int,
               seed: int = 0) -> list[dict[str, float]]:
    """``epochs`` shuffled passes, ``batch_size`` trajectories per optimizer step."""
    history = []
    for epoch in range(epochs):
        plan = minibatches(len(samples), batch_size, seed + epoch)
        for index in progress_bar(plan, f"rft epoch {epoch + 1}/{epochs}", trainer.progress):
            batches = trainer.micro_batches(samples, trainer.shard(index))
            history.append(trainer.step(batches, sft_loss) | {"epoch": float(epoch)})
    return history


def sft_metrics(history: list[dict[str, float]], trajectories: int) -> dict[str, float]:
    """An RFT update's optimizer steps as one set of metrics, token-weighted."""
    weights = [h["loss_tokens"] for h in history]
    return {
        "loss_first": history[0]["loss"],
        "loss_last": history[-1]["loss"],
        "loss_mean": sum(h["loss"] * w for h, w in zip(history, weights)) / max(sum(weights), 1.0),
        "steps": float(len(history)),
        "trajectories": float(trajectories),
        "loss_tokens": float(sum(weights)),
        "tokens_per_s": sum(h["tokens"] for h in history) / max(sum(h["time_s"] for h in history), 1e-9),
    }


def rft_job(trajectories: list[Trajectory], model_path: str | Path, cfg: RFTConfig | SFTConfig,
            out_dir: str | Path, *, chunk: int = 1024, info: dict[str, Any] | None = None,
            seed: int = 0, rope_parameters: dict[str, Any] | None = None) -> UpdateJob:
    """The update that SFTs ``model_path`` on the resolved ``trajectories`` into ``out_dir``."""
    tcfg = cfg.train if isinstance(cfg, RFTConfig) else cfg
    record = {"stage": "rft", "iteration": 0, "dataset_hash": trajectories_hash(trajectories),
              "parent": str(model_path)} | (info or {})
    return UpdateJob(kind="rft", model_dir=str(model_path), out_dir=str(out_dir), train=tcfg.model_dump(mode="json"),
                     info=record, seed=seed, chunk=chunk, rope_parameters=rope_parameters)


def run_job(job: UpdateJob, samples: list[TrainingSample]) -> dict[str, float]:
    """Run an RFT job in this process (one rank of a group, or the only process)."""
    if not samples:
        raise ValueError("RFT: no resolved trajectory: nothing to train on")
    tcfg = SFTConfig.model_validate(job.train)
    model, tokenizer = load_trainable(job, tcfg)
    steps = tcfg.epochs * math.ceil(len(samples) / tcfg.batch_size)
    trainer = Trainer(model, tcfg, total_steps=steps, chunk=job.chunk, pad_id=pad_id_of(tokenizer))
    history = sft_update(trainer, samples, tcfg.epochs, tcfg.batch_size, job.seed)
    metrics = finish(trainer, tokenizer, job, sft_metrics(history, len(samples)))
    log.info("RFT done: %s", metrics)
    return metrics


def train(trajectories: list[Trajectory], model_path: str | Path, cfg: RFTConfig | SFTConfig,
          out_dir: str | Path, *, chunk: int = 1024, info: dict[str, Any] | None = None,
          seed: int = 0) -> Path:
    """SFT ``model_path`` on the resolved ``trajectories`` in this process; the checkpoint's path."""
    samples = sft_samples(trajectories)
    if not samples:
        raise ValueError(f"RFT: none of {len(trajectories)} trajectories is resolved: nothing to train on")
    job = rft_job(trajectories, model_path, cfg, out_dir, chunk=chunk, info=info, seed=seed)
    run_job(job, samples)
    return Path(out_dir)
