"""The one training loop shared by RFT and DAPO: micro-batches in, one optimizer step out.

A step's loss is the sum of per-token losses over every micro-batch of the step divided by the
number of loss tokens in the whole step (on all processes): token-level normalisation, so a long
trajectory weighs by its tokens and gradient accumulation gives exactly the full-batch gradient.

Everything goes through ``accelerate``: run as a plain script it is one process (CPU or one GPU);
under ``accelerate launch --config_file infra/accelerate/{fsdp,deepspeed-zero3}.yaml`` the same
code shards the model. Callers give each process its own share of samples (``shard``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any, Literal

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, gather_object
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR
from tqdm.auto import tqdm

from swerl.config import TrainConfig
from training.batching import MicroBatch, micro_batches, split_rows
from training.checkpoint import save_checkpoint
from training.logprobs import PACKABLE_ATTENTION, token_logprobs
from training.precision import resolve_dtype
from training.trajectory import TrainingSample

# loss_fn(logprobs [b, L-1], batch) -> (per-token loss [b, L-1], zero off the loss mask;
#                                      metric sums to add up over the step)
LossFn = Callable[[Tensor, MicroBatch], tuple[Tensor, dict[str, float]]]


def lr_factor(step: int, warmup: int, total: int, schedule: Literal["cosine", "constant"],
              min_ratio: float = 0.1) -> float:
    """Linear warmup to 1, then cosine down to ``min_ratio`` at ``total`` (or flat).

    Step 0 already gets 1/warmup: a zero learning rate would waste the first batch.
    """
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class Trainer:
    """Model + AdamW + schedule + accelerator. Keep one per stage so AdamW state carries over."""

    def __init__(self, model: nn.Module, cfg: TrainConfig, total_steps: int, *,
                 lr: float | None = None, chunk: int = 1024,
                 schedule: Literal["cosine", "constant"] = "cosine", pad_id: int = 0,
                 progress: bool = True, temperature: float = 1.0):
        self.cfg = cfg
        self.chunk = chunk
        self.temperature = temperature  # the policy is softmax(logits / T): the sampler's T
        self.pad_id = pad_id
        # Multi-GPU settings (FSDP, ZeRO-3, bf16 policy) come from `accelerate launch`'s env.
        self.accelerator = Accelerator()
        self.progress = progress and self.accelerator.is_main_process
        if cfg.gradient_checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr or cfg.lr,
                                      weight_decay=cfg.weight_decay)
        warmup = math.ceil(cfg.warmup_ratio * total_steps)
        # Not passed to prepare(): accelerate would step it once per process.
        self.scheduler = LambdaLR(optimizer, partial(lr_factor, warmup=warmup, total=total_steps,
                                                     schedule=schedule))
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.steps_done = 0

    # ---- distribution helpers -------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    def shard(self, index: list[int]) -> list[int]:
        """This process's share of one step's samples."""
        acc = self.accelerator
        return index[acc.process_index::acc.num_processes]

    def global_sum(self, values: list[float]) -> list[float]:
        if self.accelerator.num_processes == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        return self.accelerator.reduce(t, reduction="sum").tolist()

    def global_sum_dict(self, values: dict[str, float]) -> dict[str, float]:
        """Like global_sum, for dicts whose keys may differ between ranks (a rank that only ran
        padding micro-batches has no loss-specific metrics)."""
        if self.accelerator.num_processes == 1:
            return values
        out: dict[str, float] = {}
        for d in gather_object([values]):
            for k, v in d.items():
                out[k] = out.get(k, 0.0) + v
        return out

    def _dummy(self) -> MicroBatch:
        ids = torch.full((1, 2), self.pad_id, dtype=torch.long)
        zeros = torch.zeros(1, 1)
        return MicroBatch([], ids, torch.ones_like(ids), zeros, zeros.clone(), zeros.clone(), {})

    def _even_out(self, batches: list[MicroBatch]) -> list[MicroBatch]:
        """Sharded models run collectives in every forward: all ranks need as many micro-batches.

        Ranks with fewer get padding micro-batches (empty ``index``) that carry no loss.
        """
        if self.accelerator.num_processes == 1:
            return batches
        most = int(max(self.accelerator.gather(torch.tensor([len(batches)], device=self.device))))
        return batches + [self._dummy() for _ in range(most - len(batches))]

    @contextmanager
    def _accumulating(self, last: bool):
        acc = self.accelerator
        # DeepSpeed steps its engine inside backward() only on a sync boundary, and
        # AcceleratedOptimizer.step() is skipped off the boundary: mark the last micro-batch.
        acc.gradient_state._set_sync_gradients(last)
        ddp = acc.distributed_type == DistributedType.MULTI_GPU
        with acc.no_sync(self.model) if (ddp and not last) else nullcontext():
            yield
        acc.gradient_state._set_sync_gradients(True)

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16,
                              enabled=resolve_dtype(self.cfg.dtype, self.device.type) == "bfloat16")

    @property
    def packs(self) -> bool:
        """Whether rows may share a prompt: it takes an attention that accepts a 4D mask."""
        impl = getattr(self.unwrapped().config, "_attn_implementation", None)
        return impl in PACKABLE_ATTENTION

    def micro_batches(self, samples: list[TrainingSample], index: list[int],
                      extras: dict[str, list[Tensor]] | None = None) -> list[MicroBatch]:
        """One step's samples as this trainer's micro-batches (its budget, pad id, packing)."""
        return micro_batches(samples, index, self.cfg.micro_batch_tokens, self.pad_id, extras,
                             pack=self.packs)

    # ---- the two things a trainer does ------------------------------------------------------
    @torch.no_grad()
    def score(self, batches: list[MicroBatch], model: nn.Module | None = None,
              desc: str = "scoring") -> list[list[Tensor]]:
        """Logprobs of each batch's targets, one [len_i - 1] CPU tensor per row, no grad.

        ``model`` defaults to the policy (e.g. a frozen reference model for a KL term).
        """
        model = model or self.model
        was_training = model.training
        model.eval()
        out = []
        for mb in progress_bar(self._even_out(batches), desc, self.progress and len(batches) > 4):
            mb = mb.to(self.device)
            with self._autocast():
                lp = token_logprobs(model, mb.input_ids, mb.model_mask(), self.chunk,
                                    temperature=self.temperature, position_ids=mb.position_ids,
                                    only=head_positions(mb))
            out.append(split_rows(lp.float(), mb))
        model.train(was_training)
        return out[:len(batches)]

    def step(self, batches: list[MicroBatch], loss_fn: LossFn) -> dict[str, float]:
        """One optimizer step over ``batches`` (this process's share of the step)."""
        t0 = time.perf_counter()
        loss_tokens, real_tokens = self.global_sum(
            [sum(b.loss_tokens for b in batches), sum(b.real_tokens for b in batches)])
        batches = self._even_out(batches)
        # Gradients are averaged over processes, so scale back up to a global token sum.
        scale = self.accelerator.num_processes / max(loss_tokens, 1.0)
        self.model.train()
        sums: dict[str, float] = {"loss": 0.0, "entropy": 0.0}
        for k, mb in enumerate(batches):
            mb = mb.to(self.device)
            with self._accumulating(last=k == len(batches) - 1):
                with self._autocast():
                    lp, ent = token_logprobs(self.model, mb.input_ids, mb.model_mask(), self.chunk,
                                             with_entropy=True, temperature=self.temperature,
                                             position_ids=mb.position_ids, only=head_positions(mb))
                if mb.index:
                    token_loss, stats = loss_fn(lp.float(), mb)
                else:  # a padding micro-batch (see _even_out): forward/backward, zero loss
                    token_loss, stats = lp.float() * 0.0, {}
                loss = token_loss.sum() * scale
                self.accelerator.backward(loss)
            sums["loss"] += float(token_loss.detach().sum())
            sums["entropy"] += float((ent * mb.loss_mask).sum())
            for key, v in stats.items():
                sums[key] = sums.get(key, 0.0) + float(v)
        grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps_done += 1
        totals = self.global_sum_dict(sums)
        denom = max(loss_tokens, 1.0)
        elapsed = time.perf_counter() - t0
        return {
            **{k: v / denom for k, v in totals.items()},  # token means
            "grad_norm": float(grad_norm) if grad_norm is not None else float("nan"),
            "lr": lr,
            "loss_tokens": loss_tokens,
            "tokens": real_tokens,
            "time_s": elapsed,
            "tokens_per_s": real_tokens / elapsed if elapsed > 0 else 0.0,
        }

    def unwrapped(self) -> nn.Module:
        return self.accelerator.unwrap_model(self.model)

    def close(self) -> None:
        """Tear the process group down on every rank together: a rank that exits while gloo's
        threads still run aborts with "terminate called without an active exception"."""
        self.accelerator.wait_for_everyone()
        self.accelerator.end_training()

    def save(self, out_dir: str | Path, tokenizer: Any, info: dict[str, Any]) -> Path:
        """Gather the (possibly sharded) weights and write a checkpoint from the main process."""
        acc = self.accelerator
        state = acc.get_state_dict(self.model)
        if acc.is_main_process:
            save_checkpoint(self.unwrapped(), tokenizer, out_dir, info, state_dict=state)
        acc.wait_for_everyone()
        return Path(out_dir)


def head_positions(mb: MicroBatch) -> Tensor:
    """Where the LM head runs: the loss tokens, and at least one position, so that the head's
    weights take part in every backward (DDP expects all parameters in each rank's graph, and a
    padding micro-batch has no loss token)."""
    only = mb.loss_mask > 0
    if not only.any():
        only = only.clone()
        only.view(-1)[0] = True
    return only


def progress_bar(items: list, desc: str, enabled: bool):
    """A tqdm bar on the main process for loops that take more than a few seconds."""
    return tqdm(items, desc=desc, leave=False) if enabled else items
