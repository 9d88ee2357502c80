"""DAPO: group advantages, dynamic sampling, the clipped token-level loss, one policy update.

The math (``group_advantages``, ``dynamic_sampling``, ``dapo_loss``) is pure and unit-tested
against hand-computed numbers; ``iteration_update`` runs the shared Trainer with that same
``dapo_loss``, normalisation included. Rewards are in ``training.rewards``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from swerl.config import DAPOConfig, DAPOStage
from training.batching import MicroBatch, minibatches
from training.trainer import Trainer, progress_bar
from training.trajectory import TrainingSample, Trajectory, training_sample
from training.update_job import UpdateJob, finish, load_trainable, pad_id_of

log = logging.getLogger(__name__)

# A token whose probability differs by more than 2x between sampler and trainer counts as
# mismatched: small numeric noise (bf16 vs fp32, kernel order) stays far below that.
MISMATCH_BOUND = math.log(2.0)


# ---- advantages ---------------------------------------------------------------------------
def group_advantages(rewards: list[float], delta: float) -> list[float]:
    """(R - mean) / (std + delta) within one prompt's group.

    Population std (ddof=0): the group is all the samples there are for this prompt, and it
    makes the advantages unit-variance whatever the group size (a 2-sample group with rewards
    0 and 1 gets -1 and +1, not +-0.71).
    """
    n = len(rewards)
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n)
    return [(r - mean) / (std + delta) for r in rewards]


def _reward_of(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) else float(x.reward)


def dynamic_sampling(groups: Sequence[Sequence[Any]]) -> tuple[list[Sequence[Any]], int]:
    """Drop groups whose members all got the same reward: their advantages are all zero, so they
    add tokens to the normaliser but no gradient. Members are rewards or have ``.reward``."""
    kept = []
    for g in groups:
        rewards = [_reward_of(x) for x in g]
        if rewards and max(rewards) != min(rewards):
            kept.append(g)
    return kept, len(groups) - len(kept)


def samples_from_groups(groups: list[list[Trajectory]], delta: float,
                        max_groups: int | None = None) -> tuple[list[TrainingSample], dict[str, float]]:
    """Training samples (with advantages) from each prompt's group of trajectories; at most the
    first `max_groups` groups that carry a gradient, as DAPO fills a batch of fixed size.

    Episodes that ended in an infrastructure error are dropped before the group statistics:
    they say nothing about the policy and must not count as reward 0. A format-error turn gets
    loss only in an episode with a negative advantage: it is pushed down, never up. Masked
    everywhere, the errors were never pushed down, while the losers' well-formed turns were, and
    format errors rose 0.19 -> 0.25 per turn over three iterations (docs/history/decisions.md).
    """
    clean = [[t for t in g if t.status != "error"] for g in groups]
    errored = sum(len(g) for g in groups) - sum(len(g) for g in clean)
    kept, dropped = dynamic_sampling(clean)
    over = kept[max_groups:] if max_groups is not None else []
    kept = kept[:max_groups]  # [:None] keeps them all
    samples = []
    for g in kept:
        for traj, adv in zip(g, group_advantages([t.reward for t in g], delta)):
            s = training_sample(traj, mask_format_errors=adv >= 0)
            s.advantage = adv
            samples.append(s)
    valid = [t for g in clean for t in g]
    stats = {
        "groups_kept": float(len(kept)),
        "groups_dropped": float(dropped),
        "groups_over_batch": float(len(over)),
        "trajectories_errored": float(errored),
        "reward_mean": sum(t.reward for t in valid) / len(valid) if valid else float("nan"),
        "resolved_share": sum(t.status == "resolved" for t in valid) / len(valid) if valid else float("nan"),
    }
    return samples, stats


# ---- the loss ---------------------------------------------------------------------------
def _per_token(advantages: Tensor, like: Tensor) -> Tensor:
    return advantages[:, None].expand_as(like) if advantages.dim() == 1 else advantages


def clipped_objective(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor,
                      eps_low: float, eps_high: float) -> tuple[Tensor, Tensor]:
    """Per-token min(r*A, clip(r, 1-eps_low, 1+eps_high)*A) and the ratio r."""
    ratio = torch.exp(logprobs - old_logprobs)
    adv = _per_token(advantages, ratio)
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    return torch.minimum(ratio * adv, clipped * adv), ratio


def clip_sums(ratio: Tensor, advantages: Tensor, mask: Tensor, eps_low: float,
              eps_high: float) -> dict[str, float]:
    """Token counts where the clip binds (zeroing the gradient), plus the ratio sum.

    Low side: A < 0 and r < 1-eps_low. High side: A > 0 and r > 1+eps_high. Sums, so that
    micro-batches add up; divide by the loss-token count for shares.
    """
    r = ratio.detach()
    adv = _per_token(advantages, r)
    m = mask > 0
    return {
        "clip_frac_low": float(((r < 1.0 - eps_low) & (adv < 0) & m).sum()),
        "clip_frac_high": float(((r > 1.0 + eps_high) & (adv > 0) & m).sum()),
        "ratio_mean": float((r * mask).sum()),
    }


def dapo_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, loss_mask: Tensor,
              eps_low: float, eps_high: float, *, token_count: float | None = None,
              tis_weight: Tensor | None = None, ref_logprobs: Tensor | None = None,
              kl_coef: float = 0.0) -> tuple[Tensor, dict[str, float]]:
    """Clipped surrogate, summed over all masked tokens / their count (the trainer passes the
    whole step's `token_count`, so micro-batches add up to the step's mean).

    Token-level normalisation (DAPO): every token weighs the same, whichever sequence it is in.
    logprobs, old_logprobs, loss_mask: [B, T]; advantages: [B] or [B, T]. Optional: truncated
    importance weights from the sampler mismatch (`tis_weight`) and a k3 KL term to a reference.
    """
    mask = loss_mask.to(logprobs.dtype)
    obj, ratio = clipped_objective(logprobs, old_logprobs, advantages, eps_low, eps_high)
    if tis_weight is not None:
        obj = obj * tis_weight
    token_loss = -obj
    if kl_coef > 0:
        token_loss = token_loss + kl_coef * kl_k3(logprobs, ref_logprobs)
    n = float(mask.sum())
    denom = max(n if token_count is None else token_count, 1.0)
    loss = (token_loss * mask).sum() / denom
    metrics = {k: v / denom for k, v in clip_sums(ratio, advantages, mask, eps_low, eps_high).items()}
    if n:
        masked = ratio.detach()[mask > 0]
        metrics["ratio_max"], metrics["ratio_min"] = float(masked.max()), float(masked.min())
    metrics["tokens"] = n
    return loss, metrics


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(policy || ref) on policy samples: exp(d) - 1 - d, d = ref - pi.

    Non-negative and unbiased; used only when ``kl_coef`` > 0 (DAPO has no KL term by default).
    """
    d = ref_logprobs - logprobs
    return torch.exp(d) - 1.0 - d


# ---- sampler/trainer mismatch -----------------------------------------------------------
def _has_behaviour(s: TrainingSample) -> bool:
    """training_sample() writes 0.0 where the sampler gave no logprobs; a real record has some
    nonzero logprob on its loss tokens."""
    return any(lp != 0.0 for lp, m in zip(s.behaviour_logprobs, s.loss_mask) if m)


def _mismatch_sums(log_r: Tensor, bound: float = MISMATCH_BOUND) -> dict[str, float]:
    """Sums over loss tokens of log r = log p_trainer - log p_sampler; k3 = r - 1 - log r estimates
    KL(sampler || trainer) from the sampled tokens."""
    return {"abs_diff": float(log_r.abs().sum()), "kl_k3": float((torch.exp(log_r) - 1.0 - log_r).sum()),
            "over_bound": float((log_r.abs() > bound).sum()), "tokens": float(log_r.numel())}


def _add(sums: dict[str, float], more: dict[str, float]) -> None:
    for k, v in more.items():
        sums[k] = sums.get(k, 0.0) + v


def _no_mismatch() -> dict[str, float]:
    return {"abs_diff": 0.0, "kl_k3": 0.0, "over_bound": 0.0, "tokens": 0.0, "missing": 0.0}


def mismatch_stats(samples: list[TrainingSample], index: list[int], old: list[Tensor | None],
                   bound: float = MISMATCH_BOUND) -> dict[str, float]:
    """Sums comparing the sampler's logprobs with the trainer's recomputed ones on loss tokens."""
    sums = _no_mismatch()
    for i in index:
        s = samples[i]
        if not _has_behaviour(s):
            sums["missing"] += 1
            continue
        mask = torch.tensor(s.loss_mask[1:], dtype=torch.bool)
        _add(sums, _mismatch_sums(old[i][mask] - sampler_logprobs(s)[mask], bound))
    return sums


def sampler_logprobs(s: TrainingSample) -> Tensor:
    """The sampler's logprob of each target token, aligned with the trainer's [len - 1] rows."""
    return torch.tensor(s.behaviour_logprobs[1:], dtype=torch.float32)


def tis_weights(samples: list[TrainingSample], old: list[Tensor | None], cap: float) -> list[Tensor | None]:
    """Truncated importance sampling: min(p_trainer / p_sampler, cap) per token, as a constant.

    Corrects for rollouts sampled by an engine whose numerics differ from the trainer's; the
    cap bounds the variance. Samples without sampler logprobs get weight 1.
    """
    out: list[Tensor | None] = []
    for s, o in zip(samples, old):
        if o is None:
            out.append(None)
        elif not _has_behaviour(s):
            out.append(torch.ones_like(o))
        else:
            out.append(torch.exp(o - sampler_logprobs(s)).clamp(max=cap))
    return out


# ---- one iteration's update -------------------------------------------------------------
def _score_samples(trainer: Trainer, samples: list[TrainingSample], index: list[int],
                   model: nn.Module | None = None, desc: str = "old logprobs") -> list[Tensor | None]:
    out: list[Tensor | None] = [None] * len(samples)
    batches = trainer.micro_batches(samples, index)
    for mb, rows in zip(batches, trainer.score(batches, model=model, desc=desc)):
        for i, lp in zip(mb.index, rows):
            out[i] = lp
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def dapo_trainer(model: nn.Module, cfg: DAPOConfig, stage: DAPOStage, total_steps: int,
                 temperature: float = 1.0, progress: bool = True, pad_id: int = 0) -> Trainer:
    """The Trainer a DAPO stage updates with: its lr, constant after warmup, the sampler's T."""
    return Trainer(model, cfg.train, total_steps=max(1, total_steps), lr=stage.lr, chunk=cfg.logprob_chunk,
                   schedule="constant", temperature=temperature, progress=progress, pad_id=pad_id)


def mismatch_metrics(trainer: Trainer, local: dict[str, float], warn_kl: float) -> dict[str, float]:
    """The sampler/trainer logprob mismatch (``mismatch_stats`` sums) over all processes, as
    metrics; warns on a jump."""
    sums = dict(zip(local, trainer.global_sum(list(local.values()))))
    n = max(sums["tokens"], 1.0)
    out = {
        "mismatch/abs_diff_mean": sums["abs_diff"] / n,
        "mismatch/kl_k3": sums["kl_k3"] / n,
        "mismatch/share_over_bound": sums["over_bound"] / n,
        "mismatch/samples_without_logprobs": sums["missing"],
        "mismatch/warn": float(sums["kl_k3"] / n > warn_kl),
    }
    if out["mismatch/warn"]:
        log.warning("sampler/trainer logprob mismatch jumped: KL(k3)=%.4f > %.4f (mean |diff| %.4f)",
                    out["mismatch/kl_k3"], warn_kl, out["mismatch/abs_diff_mean"])
    return out


def step_summary(steps: list[dict[str, float]], seconds: float) -> dict[str, float]:
    """An update's optimizer steps as one set of metrics, token-weighted where they are means."""
    weights = [s["loss_tokens"] for s in steps]
    total_w = max(sum(weights), 1.0)
    out = {key: sum(s.get(key, 0.0) * w for s, w in zip(steps, weights)) / total_w
           for key in ("loss", "entropy", "clip_frac_low", "clip_frac_high", "ratio_mean")}
    for key, pick in (("ratio_max", max), ("ratio_min", min)):
        seen = [s[key] for s in steps if key in s]
        if seen:
            out[key] = pick(seen)
    tokens = sum(s["tokens"] for s in steps)
    return out | {
        "grad_norm": _mean([s["grad_norm"] for s in steps]),
        "grad_norm_max": max(s["grad_norm"] for s in steps),
        "lr": steps[-1]["lr"],
        "steps": float(len(steps)),
        "tokens": tokens,
        "loss_tokens": sum(weights),
        "time_s": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
    }


def old_logprobs(trainer: Trainer, samples: list[TrainingSample], index: list[int],
                 source: str) -> tuple[list[Tensor | None], dict[str, float] | None]:
    """pi_old's logprobs of the samples ``index`` and the mismatch sums, or None where the first
    step must measure them. ``trainer``: a scoring pass with the weights before any step (what
    the rollouts' engine was given). ``sampler``: the engine's own logprobs, no pass; only where
    every sample on every process carries them (else all processes score, with a warning)."""
    if source == "sampler":
        lacking = sum(not _has_behaviour(samples[i]) for i in index)
        if trainer.global_sum([float(lacking)])[0] == 0:  # one answer on every rank: scoring is collective
            out: list[Tensor | None] = [None] * len(samples)
            for i in index:
                out[i] = sampler_logprobs(samples[i])
            return out, None
        log.warning("old_logprobs: sampler, but some samples carry no sampler logprobs: the trainer scores them all")
    old = _score_samples(trainer, samples, index)
    return old, mismatch_stats(samples, index, old)


def iteration_update(trainer: Trainer, samples: list[TrainingSample], cfg: DAPOConfig, stage: DAPOStage,
                     *, ref_model: nn.Module | None = None, group_stats: dict[str, float] | None = None,
                     seed: int = 0, temperature: float = 1.0) -> dict[str, float]:
    """One DAPO policy update over an iteration's samples (advantages already set).

    Old logprobs come from ``cfg.old_logprobs`` (see ``old_logprobs``), then the data is passed
    over ONCE in shuffled minibatches of ``stage.batch_size`` trajectories per optimizer step.
    With the sampler's logprobs, the first step's forward runs at the old weights and measures
    the sampler/trainer mismatch on its samples. Keep one Trainer across iterations to carry AdamW
    state over. ``temperature`` is the sampler's: the policy trained is the one the rollouts were
    drawn from.
    """
    if stage.kl_coef > 0 and ref_model is None:
        raise ValueError(f"kl_coef={stage.kl_coef} needs a ref_model")
    if trainer.temperature != temperature:
        raise ValueError(f"trainer temperature {trainer.temperature} != sampler temperature {temperature}")
    metrics: dict[str, float] = dict(group_stats or {})
    if not samples:
        log.warning("DAPO iteration has no samples with a nonzero advantage: no update")
        return metrics | {"steps": 0.0, "tokens": 0.0}
    t0 = time.perf_counter()
    plan = [trainer.shard(b) for b in minibatches(len(samples), stage.batch_size, seed)]
    own = sorted({i for b in plan for i in b})  # this process's samples

    old, mismatch = old_logprobs(trainer, samples, own, cfg.old_logprobs)
    if mismatch is not None:
        metrics.update(mismatch_metrics(trainer, mismatch, cfg.mismatch_warn_kl))
    extras: dict[str, list] = {"old_logprobs": old}
    if cfg.tis_cap is not None:
        extras["tis_weight"] = tis_weights(samples, old, cfg.tis_cap)
    if stage.kl_coef > 0:
        extras["ref_logprobs"] = _score_samples(trainer, samples, own, model=ref_model.to(trainer.device),
                                                desc="ref logprobs")
    first_step, in_first = _no_mismatch(), trainer.steps_done

    def loss_fn(lp: Tensor, mb: MicroBatch, token_count: float) -> tuple[Tensor, dict[str, float]]:
        if mismatch is None and trainer.steps_done == in_first:  # still the sampler's weights
            _add(first_step, _mismatch_sums((lp.detach() - mb.extras["old_logprobs"])[mb.loss_mask > 0]))
        return dapo_loss(lp, mb.extras["old_logprobs"], mb.advantages, mb.loss_mask, stage.eps_low,
                         stage.eps_high, token_count=token_count, tis_weight=mb.extras.get("tis_weight"),
                         ref_logprobs=mb.extras.get("ref_logprobs"), kl_coef=stage.kl_coef)

    steps = [trainer.step(trainer.micro_batches(samples, index, extras), loss_fn)
             for index in progress_bar(plan, "dapo update", trainer.progress)]
    if mismatch is None:
        metrics.update(mismatch_metrics(trainer, first_step, cfg.mismatch_warn_kl))
    return metrics | step_summary(steps, time.perf_counter() - t0) | {"samples": float(len(samples))}


def run_job(job: UpdateJob, samples: list[TrainingSample]) -> dict[str, float]:
    """Run one DAPO iteration's update in this process (a rank of a group, or the only one):
    from the previous update's optimizer state where the job names one."""
    cfg, stage = DAPOConfig.model_validate(job.train), DAPOStage.model_validate(job.stage)
    model, tokenizer = load_trainable(job, cfg.train)
    trainer = dapo_trainer(model, cfg, stage, -(-len(samples) // stage.batch_size), job.temperature,
                           pad_id=pad_id_of(tokenizer))
    if job.state_in:
        trainer.load_state(job.state_in)
    metrics = iteration_update(trainer, samples, cfg, stage, group_stats=job.group_stats, seed=job.seed,
                               temperature=job.temperature)
    return finish(trainer, tokenizer, job, metrics | {"optimizer_steps_total": float(trainer.steps_done)})
