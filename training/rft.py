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

from torch import Tensor
from transformers import AutoModelForCausalLM, AutoTokenizer

from swerl.config import RFTConfig, SFTConfig
from training.batching import MicroBatch, minibatches
from training.trainer import Trainer, progress_bar
from training.trajectory import TrainingSample, Trajectory, training_sample

log = logging.getLogger(__name__)


def sft_loss(lp: Tensor, mb: MicroBatch, token_count: float) -> tuple[Tensor, dict[str, float]]:
    """Negative log-likelihood of the loss tokens, over the step's loss-token count."""
    return -(lp * mb.loss_mask).sum() / token_count, {}


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


def train(trajectories: list[Trajectory], model_path: str | Path, cfg: RFTConfig | SFTConfig,
          out_dir: str | Path, *, chunk: int = 1024, info: dict[str, Any] | None = None,
          seed: int = 0) -> Path:
    """SFT ``model_path`` on the resolved ``trajectories``; write a checkpoint to ``out_dir``."""
    tcfg = cfg.train if isinstance(cfg, RFTConfig) else cfg
    samples = sft_samples(trajectories)
    if not samples:
        raise ValueError(f"RFT: none of {len(trajectories)} trajectories is resolved: nothing to train on")
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    steps = tcfg.epochs * math.ceil(len(samples) / tcfg.batch_size)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    trainer = Trainer(model, tcfg, total_steps=steps, chunk=chunk, pad_id=pad_id)
    history = sft_update(trainer, samples, tcfg.epochs, tcfg.batch_size, seed)
    weights = [h["loss_tokens"] for h in history]
    metrics = {
        "loss_first": history[0]["loss"],
        "loss_last": history[-1]["loss"],
        "loss_mean": sum(h["loss"] * w for h, w in zip(history, weights)) / max(sum(weights), 1.0),
        "steps": float(len(history)),
        "trajectories": float(len(samples)),
        "loss_tokens": float(sum(weights)),
        "tokens_per_s": sum(h["tokens"] for h in history) / max(sum(h["time_s"] for h in history), 1e-9),
    }
    log.info("RFT done: %s", metrics)
    record = {"stage": "rft", "iteration": 0, "dataset_hash": trajectories_hash(trajectories),
              "metrics": metrics, "parent": str(model_path)} | (info or {})
    return trainer.save(out_dir, tokenizer, record)
