"""The one training loop shared by RFT and DAPO: micro-batches in, one optimizer step out.

A step's loss is the sum of per-token losses over every micro-batch of the step (on all
processes) divided by the step's loss-token count, so gradient accumulation gives exactly the
full-batch gradient. Run as a plain process it is one CPU or GPU; under `accelerate launch` the
same code shards the model. Callers give each process its own share of samples (`shard`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin, gather_object
from accelerate.utils.environment import parse_flag_from_env
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR
from tqdm.auto import tqdm

from training.batching import MicroBatch, micro_batches, split_rows
from training.checkpoint import load_train_state, save_checkpoint, save_train_state
from training.logprobs import PACKABLE_ATTENTION, token_logprobs
from training.precision import resolve_dtype
from training.trajectory import TrainingSample

if TYPE_CHECKING:  # a type only: infra/gpu/check.py runs the trainer where pydantic is absent
    from swerl.config import SFTConfig

# loss_fn(logprobs [b, L-1], batch, token_count) -> (loss summed over the batch's loss tokens
# / token_count, metrics). token_count is the whole step's, so the losses of a step's
# micro-batches add up to its mean; metrics add up the same way, except `*_max`/`*_min` keys.
LossFn = Callable[[Tensor, MicroBatch, float], tuple[Tensor, dict[str, float]]]


def sft_loss(lp: Tensor, mb: MicroBatch, token_count: float) -> tuple[Tensor, dict[str, float]]:
    """RFT's objective: negative log-likelihood of the loss tokens, over the step's loss-token count."""
    return -(lp * mb.loss_mask).sum() / token_count, {}


def combine_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """Metrics of several micro-batches (or processes) as one: sums, or extremes for `*_max`/`*_min`."""
    out: dict[str, float] = {}
    for part in parts:
        for k, v in part.items():
            if k not in out:
                out[k] = v
            elif k.endswith("_max"):
                out[k] = max(out[k], v)
            elif k.endswith("_min"):
                out[k] = min(out[k], v)
            else:
                out[k] += v
    return out


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


def make_accelerator() -> Accelerator:
    """The Accelerator `accelerate launch`'s environment asks for, FSDP on CPU included.

    accelerate 1.15 switches to FSDP only for accelerator devices (`AcceleratorState` checks
    MULTI_GPU, MULTI_NPU, ...): with `--cpu` an FSDP config silently becomes DDP over gloo. FSDP2
    itself runs on gloo, so on CPU the FSDP plugin is installed here, the way the GPU path has it.
    """
    acc = Accelerator()
    if acc.distributed_type == DistributedType.MULTI_CPU and parse_flag_from_env("ACCELERATE_USE_FSDP"):
        plugin = FullyShardedDataParallelPlugin()  # FSDP_* variables set by `accelerate launch`
        if acc.mixed_precision != "no":
            plugin.set_mixed_precision(acc.mixed_precision)
        # AcceleratorState re-reads PartialState's shared dict whenever it is constructed again
        # (accelerate does that inside its helpers): set the type in both.
        PartialState().distributed_type = DistributedType.FSDP
        acc.state.distributed_type = DistributedType.FSDP
        acc.state.fsdp_plugin = plugin
    return acc


def checkpoint_activations(model: nn.Module) -> None:
    """Recompute each layer's activations in backward, non-reentrant (FSDP2 needs that). The
    method's name moved: transformers 5.24 has `activation_checkpointing_enable` (and deprecates
    the old one), 5.19, which vLLM's CPU build pins, only `gradient_checkpointing_enable`."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def as_float(x: Any) -> float:
    """A scalar tensor, possibly a replicated DTensor (FSDP2's grad norm), as a float."""
    if x is None:
        return float("nan")
    return float(x.full_tensor() if hasattr(x, "full_tensor") else x)


class Trainer:
    """Model + AdamW + schedule + accelerator. One per update; AdamW state and the step count
    carry over between updates through `save_state`/`load_state` (DAPO's continuous training)."""

    def __init__(self, model: nn.Module, cfg: SFTConfig, total_steps: int, *,
                 lr: float | None = None, chunk: int = 1024,
                 schedule: Literal["cosine", "constant"] = "cosine", pad_id: int = 0,
                 progress: bool = True, temperature: float = 1.0):
        self.cfg = cfg
        self.chunk = chunk
        self.temperature = temperature  # the policy is softmax(logits / T): the sampler's T
        self.pad_id = pad_id
        # Group settings (FSDP2, bf16 policy) come from `accelerate launch`'s env.
        self.accelerator = make_accelerator()
        self.progress = progress and self.accelerator.is_main_process
        if cfg.gradient_checkpointing:
            checkpoint_activations(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr or cfg.lr,
                                      weight_decay=cfg.weight_decay)
        self.steps_done = 0  # optimizer steps so far, earlier updates' included (load_state)
        self.step_offset = 0  # steps done before this Trainer: the schedule goes on from there
        factor = partial(lr_factor, warmup=math.ceil(cfg.warmup_ratio * total_steps), total=total_steps,
                         schedule=schedule)
        # Not passed to prepare(): accelerate would step it once per process.
        self.scheduler = LambdaLR(optimizer, lambda s: factor(s + self.step_offset))
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)

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

    def global_metrics(self, values: dict[str, float]) -> dict[str, float]:
        """`combine_metrics` over processes; keys may differ between ranks (a rank that only ran
        padding micro-batches has no loss-specific metrics)."""
        if self.accelerator.num_processes == 1:
            return values
        return combine_metrics(gather_object([values]))

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
        token_count = max(loss_tokens, 1.0)
        self.model.train()
        parts: list[dict[str, float]] = []
        for k, mb in enumerate(batches):
            mb = mb.to(self.device)
            with self._accumulating(last=k == len(batches) - 1):
                with self._autocast():
                    lp, ent = token_logprobs(self.model, mb.input_ids, mb.model_mask(), self.chunk,
                                             with_entropy=True, temperature=self.temperature,
                                             position_ids=mb.position_ids, only=head_positions(mb))
                if mb.index:
                    loss, stats = loss_fn(lp.float(), mb, token_count)
                else:  # a padding micro-batch (see _even_out): forward/backward, zero loss
                    loss, stats = lp.float().sum() * 0.0, {}
                # gradients are averaged over processes: scale back up to the global token sum
                self.accelerator.backward(loss * self.accelerator.num_processes)
            parts.append({**stats, "loss": float(loss.detach()),
                          "entropy": float((ent * mb.loss_mask).sum()) / token_count})
        grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps_done += 1
        elapsed = time.perf_counter() - t0
        return {
            **self.global_metrics(combine_metrics(parts)),  # token means over the step
            "grad_norm": as_float(grad_norm),
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

    @property
    def sharded(self) -> bool:
        """Whether each process holds only a shard of the weights and optimizer state (FSDP2)."""
        return self.accelerator.is_fsdp2

    def export_dtype(self) -> torch.dtype:
        """The checkpoint's float type: bf16 for a sharded bf16 run (rank 0 never holds a full fp32
        copy; the fp32 master weights go on in `save_state`), else the weights as trained."""
        bf16 = resolve_dtype(self.cfg.dtype, self.device.type) == "bfloat16"
        return torch.bfloat16 if self.sharded and bf16 else torch.float32

    def _full_state_dict(self) -> dict[str, Tensor] | None:
        """The whole model's weights on the main process (None elsewhere), gathered one tensor at
        a time and cast to `export_dtype` on the way: a bf16 run never holds a full fp32 copy."""
        if not self.sharded:
            return None
        dtype, main = self.export_dtype(), self.accelerator.is_main_process
        out = {}
        for name, t in self.model.state_dict().items():
            full = t.full_tensor() if hasattr(t, "full_tensor") else t  # a collective: every rank
            if main:
                out[name] = full.detach().to("cpu", dtype if full.is_floating_point() else full.dtype, copy=True)
            del full
        return out if main else None

    def save(self, out_dir: str | Path, tokenizer: Any, info: dict[str, Any]) -> Path:
        """Gather the (possibly sharded) weights and write a checkpoint from the main process."""
        acc = self.accelerator
        state = self._full_state_dict()
        if acc.is_main_process:
            save_checkpoint(self.unwrapped(), tokenizer, out_dir, info, state_dict=state)
        acc.wait_for_everyone()
        return Path(out_dir)

    def save_state(self, out_dir: str | Path) -> Path:
        """AdamW's moments and the step count (plus the fp32 master shards when sharded), for the
        next update to go on from; see `training.checkpoint.save_train_state`."""
        save_train_state(out_dir, self.unwrapped(), self.optimizer.optimizer, self.steps_done,
                         sharded=self.sharded, main=self.accelerator.is_main_process)
        self.accelerator.wait_for_everyone()
        return Path(out_dir)

    def load_state(self, state_dir: str | Path) -> None:
        """Go on from an earlier update's `save_state`: its AdamW moments and step count, with this
        Trainer's own hyperparameters (a new DAPO stage has its own lr) and schedule position."""
        opt = self.optimizer.optimizer
        hyper = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
        self.steps_done = load_train_state(state_dir, self.unwrapped(), opt, sharded=self.sharded)
        for group, mine in zip(opt.param_groups, hyper):
            group.update(mine)
        self.step_offset = self.steps_done - self.scheduler.last_epoch
        for group, base, fn in zip(opt.param_groups, self.scheduler.base_lrs, self.scheduler.lr_lambdas):
            group["lr"] = base * fn(self.scheduler.last_epoch)
        self.scheduler._last_lr = [g["lr"] for g in opt.param_groups]


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
