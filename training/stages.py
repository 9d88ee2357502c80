"""The pipeline's stages as plain functions over one run: difficulty filter, RFT, DAPO, evaluation.

Each stage first looks in the store for its finished work (episodes, sealed checkpoints,
reports) and redoes none of it. The word "stage" means a pipeline stage; a step of the DAPO
curriculum is a "DAPO stage" (`cfg.dapo.stages`, checkpoints `dapo-s1-0`, `dapo-s1-1`, ...).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from environments.feedback import feedback_unavailable
from environments.records import TaskInstance
from environments.sandbox import cleanup_leaked
from environments.swe_env import SWEEnv
from swerl.config import ConfigError, DAPOStage, Sampling, SwerlConfig
from training import rft
from training.agent import AgentLimits, EpisodeSpec
from swerl.paths import state_dir
from training.checkpoint import read_info
from training.dapo import dynamic_sampling, samples_from_groups
from training.data import restated
from training.difficulty import filter_band, pass_rates, stage2_filter
from training.evaluation import predictions, summarize
from training.inference.base import SamplingParams
from training.launch import run_update
from training.layout import pin_rollout_devices
from training.rollout import RolloutSpec, RolloutStats, TrajectorySink, collect
from training.run import (RunContext, backend_for, checkpoint_name, has_checkpoint, is_checkpoint_name, model_dir,
                          publish_checkpoint, safe_name, stored_trajectories, tasks_hash)
from training.trajectory import Trajectory
from training.update_job import UpdateJob

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- rollouts
def episode_spec(cfg: SwerlConfig, dapo_stage: DAPOStage | None = None, one_shot: bool = False) -> EpisodeSpec:
    """The episodes a stage runs: the rollout settings, with a DAPO stage's turn and context
    limits and turn penalty where there is one."""
    r = cfg.rollout
    return EpisodeSpec(
        limits=AgentLimits(max_turns=dapo_stage.max_turns if dapo_stage else r.max_turns,
                           max_context_tokens=dapo_stage.max_context_tokens if dapo_stage else r.max_context_tokens,
                           max_new_tokens=r.sampling.max_new_tokens),
        action_format=r.action_format, window=cfg.environment.window, one_shot=one_shot or r.one_shot_demo,
        prompt_style=r.prompt_style, show_source=r.show_source, observation_max_chars=r.observation_max_chars,
        feedback=r.feedback, l_thr=dapo_stage.l_thr if dapo_stage else None)


def refuse_unchecked(tasks: list[TaskInstance], feedback: str) -> None:
    """Test feedback needs tests the agent may see: refuse the stage before any episode runs."""
    if feedback != "tests":
        return
    refused = [(t.instance_id, why) for t in tasks if (why := feedback_unavailable(t))]
    if refused:
        shown = "; ".join(f"{tid}: {why}" for tid, why in refused[:3])
        raise ConfigError(f"rollout.feedback=tests cannot check {len(refused)} of {len(tasks)} tasks ({shown}); "
                          "set rollout.feedback=none for this dataset")


def rollouts(ctx: RunContext, batch: str, iteration: int, tasks: list[TaskInstance], samples: int, policy: str,
             *, spec: EpisodeSpec, sampling: Sampling) -> RolloutStats:
    """`samples` episodes of each task with `policy`, stored under `rollouts/{batch}/{iteration}/`;
    finished episodes are reused on re-run."""
    cfg = ctx.cfg
    if cfg.environment.sandbox == "docker":
        removed = cleanup_leaked()  # sandboxes of processes that died (a killed earlier attempt)
        if removed:
            log.warning("removed %d sandboxes left by dead processes", len(removed))
    refuse_unchecked(tasks, spec.feedback)
    pin_rollout_devices(cfg.gpu)  # before the engine's first start
    backend = backend_for(ctx, policy)
    run_spec = RolloutSpec(**vars(spec), sampling=SamplingParams.from_config(sampling, seed=cfg.seed + iteration),
                           concurrency=cfg.rollout.concurrency)

    def make_env(task: TaskInstance) -> SWEEnv:
        return SWEEnv(task, cfg.environment, spec.action_format, observation_max_chars=spec.observation_max_chars,
                      prompt_style=spec.prompt_style, show_source=spec.show_source, feedback=spec.feedback)

    sink = TrajectorySink(ctx.store, ctx.key("rollouts", batch, iteration))
    stats = collect(tasks, samples, backend, make_env, run_spec, spec.reward, sink=sink, progress=ctx.progress,
                    on_progress=lambda done, total: ctx.on_episodes(f"{batch}/{iteration}", done, total))
    summary = stats.summary()
    log.info("%s/%s rollouts: %s", batch, iteration, json.dumps({k: round(v, 4) for k, v in summary.items()}))
    ctx.on_metrics(batch, {f"rollout/{k}": float(v) for k, v in summary.items()}, iteration)
    return stats


# ---------------------------------------------------------------- difficulty filter
def difficulty_filter(ctx: RunContext, tasks: list[TaskInstance], policy: str = "base") -> list[TaskInstance]:
    cfg = ctx.cfg
    stats = rollouts(ctx, "difficulty", 0, tasks, cfg.difficulty.samples_per_task, policy,
                     spec=episode_spec(cfg), sampling=cfg.rollout.sampling)
    rates = pass_rates(stats.trajectories)
    kept = filter_band(tasks, rates, cfg.difficulty.min_pass_rate, cfg.difficulty.max_pass_rate)
    ctx.on_metrics("difficulty", {"tasks_in": len(tasks), "tasks_kept": len(kept)}, None)
    ctx.store.put_json(ctx.key("difficulty", "rates.json"),
                       {k: {"attempts": v.attempts, "solved": v.solved} for k, v in rates.items()})
    return kept


# ---------------------------------------------------------------- RFT
def rft_stage(ctx: RunContext, tasks: list[TaskInstance], policy: str = "base") -> str:
    """Sample with the base policy, keep resolved trajectories, fine-tune on them."""
    name = checkpoint_name("rft", 0)
    if has_checkpoint(ctx, name):
        log.info("rft: checkpoint %s already complete, reusing it", name)
        return name
    cfg = ctx.cfg
    chosen = tasks[: cfg.rft.max_tasks] if cfg.rft.max_tasks else tasks
    collecting = cfg.rft_collection()  # its own hint level, source view and turns, where set
    if collecting.data.hint_level != cfg.data.hint_level:
        chosen = restated(chosen, collecting.data.hint_level, collecting.data.exact_hint_level)
    stats = rollouts(ctx, "rft", 0, chosen, cfg.rft.samples_per_task, policy,
                     spec=episode_spec(collecting, one_shot=cfg.rft.one_shot_demo),
                     sampling=cfg.rft.sampling or cfg.rollout.sampling)
    resolved = [t for t in stats.trajectories if t.status == "resolved"]
    log.info("rft: %d resolved of %d trajectories", len(resolved), len(stats.trajectories))
    ctx.on_metrics("rft", {"rft/trajectories": len(stats.trajectories), "rft/resolved": len(resolved)}, 0)
    if not resolved:
        log.warning("rft: no resolved trajectory to learn from; the policy stays %s", policy)
        return policy
    out = ctx.work / "staging" / name
    shutil.rmtree(out, ignore_errors=True)
    info = {"stage": "rft", "iteration": 0, "parent": policy, "run_id": ctx.run_id, "version": name,
            "tasks_hash": tasks_hash(chosen)}
    job = rft.rft_job(resolved, model_dir(ctx, policy), cfg.rft, out, info=info, seed=cfg.seed,
                      rope_parameters=cfg.gpu.rope_parameters)
    with engine_released(ctx):
        run_update(job, rft.sft_samples(resolved), cfg.rft.train, cfg.gpu)
    ctx.on_metrics("rft", {f"rft/{k}": v for k, v in (read_info(out).get("metrics") or {}).items()}, 0)
    publish_checkpoint(ctx, out, name)
    return name


# ---------------------------------------------------------------- DAPO
class DAPOStagePlan(BaseModel):
    """One DAPO stage of a run: its config, its number (1 for `dapo-s1`) and the global
    iteration its first iteration is (for metric steps)."""

    model_config = ConfigDict(frozen=True)
    number: int
    first_step: int
    cfg: DAPOStage

    @property
    def name(self) -> str:
        return f"dapo-s{self.number}"


def dapo_plan(cfg: SwerlConfig) -> list[DAPOStagePlan]:
    plans, step = [], 0
    for number, stage in enumerate(cfg.dapo.stages, start=1):
        plans.append(DAPOStagePlan(number=number, first_step=step, cfg=stage))
        step += stage.iterations
    return plans


def earlier_dapo_trajectories(ctx: RunContext, stage: DAPOStagePlan, iteration: int) -> list[Trajectory]:
    """Episodes of the DAPO iterations before this one, in this and earlier DAPO stages."""
    out = []
    for earlier in dapo_plan(ctx.cfg)[: stage.number]:
        last = iteration if earlier.number == stage.number else earlier.cfg.iterations
        for it in range(last):
            out += stored_trajectories(ctx, f"{earlier.name}/{it}/")
    return out


def dapo_problems(ctx: RunContext, pool: list[TaskInstance], stage: DAPOStagePlan,
                  iteration: int) -> list[TaskInstance]:
    """This iteration's candidate problems in draw order: a seeded shuffle of the pool (after the
    stage-2 rule, if the DAPO stage has one). The first `problems_per_iteration` are always drawn;
    dynamic sampling draws the next ones."""
    if stage.cfg.filter_solved_share is not None or stage.cfg.drop_never_solved:
        # Earlier iterations only: the iteration's own episodes (there when it is resumed) must
        # not change the pool it draws from, or a resume draws other problems.
        history = earlier_dapo_trajectories(ctx, stage, iteration)
        pool, dropped = stage2_filter(pool, history, stage.cfg.filter_solved_share, stage.cfg.drop_never_solved)
        log.info("%s: pool after the stage-2 rule %d (dropped %s)", stage.name, len(pool), dropped)
    rng = random.Random(f"{ctx.cfg.seed}-{stage.number - 1}-{iteration}")
    return rng.sample(pool, len(pool))


def prompt_groups(trajectories: list[Trajectory], order: list[TaskInstance] | None = None) -> list[list[Trajectory]]:
    """One group per task (DAPO's prompt groups), in `order` where given (the draw order, so that
    a batch cap keeps the first groups drawn, whatever order their episodes ended in)."""
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        groups[t.task_id].append(t)
    if order is None:
        return list(groups.values())
    return [groups[t.instance_id] for t in order if t.instance_id in groups]


def informative_groups(trajectories: list[Trajectory]) -> int:
    """Groups whose graded rewards differ: the ones that carry a gradient."""
    return len(dynamic_sampling([[t for t in g if t.status != "error"] for g in prompt_groups(trajectories)])[0])


def dapo_rollouts(ctx: RunContext, stage: DAPOStagePlan, iteration: int, pool: list[TaskInstance],
                  policy: str) -> tuple[list[TaskInstance], RolloutStats, int]:
    """The iteration's groups. Dynamic sampling: while fewer than `min_groups_kept` groups carry
    a gradient, draw the next `problems_per_extra_draw` problems (up to `max_problems_per_iteration`).
    Every draw lands in the same iteration's records, so a resumed iteration redoes none of them.
    Returns the problems drawn, their rollouts and the number of draws."""
    c = stage.cfg
    order = dapo_problems(ctx, pool, stage, iteration)
    cap = min(c.max_problems_per_iteration or c.problems_per_iteration, len(order))
    extra = c.problems_per_extra_draw or c.problems_per_iteration
    spec = episode_spec(ctx.cfg, c)
    drawn: list[TaskInstance] = []
    parts: list[RolloutStats] = []
    while len(drawn) < cap:
        chunk = order[len(drawn): min(len(drawn) + (extra if drawn else c.problems_per_iteration), cap)]
        parts.append(rollouts(ctx, stage.name, iteration, chunk, c.group_size, policy, spec=spec,
                              sampling=ctx.cfg.rollout.sampling))
        drawn += chunk
        kept = informative_groups([t for p in parts for t in p.trajectories])
        if kept >= c.min_groups_kept:
            break
        if len(drawn) < cap:
            log.info("%s/%d: %d of %d groups carry a gradient (want %d): drawing %d more problems",
                     stage.name, iteration, kept, len(drawn), c.min_groups_kept, min(extra, cap - len(drawn)))
    return drawn, RolloutStats.combine(parts), len(parts)


def dapo_iteration(ctx: RunContext, stage: DAPOStagePlan, iteration: int, pool: list[TaskInstance],
                   policy: str) -> tuple[str, dict[str, float]]:
    """Rollouts -> rewards -> group advantages -> one policy update -> checkpoint."""
    name = checkpoint_name(stage.name, iteration)
    step = stage.first_step + iteration
    if has_checkpoint(ctx, name):
        metrics = read_info(model_dir(ctx, name)).get("metrics") or {}
        log.info("%s: checkpoint already complete, reusing it", name)
        # Sent again unless already there: a run killed between sealing the checkpoint and
        # flushing MLflow lost them.
        ctx.on_missing_metrics("dapo", metrics, step)
        return name, metrics
    t0 = time.monotonic()
    problems, stats, draws = dapo_rollouts(ctx, stage, iteration, pool, policy)
    t_roll = time.monotonic() - t0
    samples, group_stats = samples_from_groups(prompt_groups(stats.trajectories, problems), ctx.cfg.dapo.adv_delta,
                                               stage.cfg.max_groups_kept)
    out = ctx.work / "staging" / name
    shutil.rmtree(out, ignore_errors=True)
    info = {"stage": stage.name, "iteration": iteration, "parent": policy, "run_id": ctx.run_id, "version": name,
            "dataset_hash": tasks_hash(problems),
            "metrics": rollout_metrics(stats, problems, draws) | {"time/rollout_s": t_roll}}
    metrics = info["metrics"] | update_policy(ctx, policy, out, samples, stage.cfg, group_stats, info,
                                              seed=ctx.cfg.seed + iteration)
    publish_checkpoint(ctx, out, name)
    drop_train_state(ctx, policy)  # the new checkpoint's state supersedes it
    ctx.on_metrics("dapo", metrics, step)
    return name, metrics


def update_policy(ctx: RunContext, policy: str, out: Path, samples: list, stage: DAPOStage,
                  group_stats: dict[str, float], info: dict[str, Any], seed: int) -> dict[str, float]:
    """One DAPO update of `policy` into the checkpoint `out`, with the sampler's temperature, going on
    from `policy`'s optimizer state where it has one; that update's own state is published first."""
    cfg = ctx.cfg
    state_out = out.parent / f"{out.name}.state"
    job = UpdateJob(kind="dapo", model_dir=model_dir(ctx, policy), out_dir=str(out), train=cfg.dapo.model_dump(mode="json"),
                    stage=stage.model_dump(mode="json"), info=info, state_in=train_state_dir(ctx, policy),
                    state_out=str(state_out), seed=seed, temperature=cfg.rollout.sampling.temperature,
                    group_stats=group_stats, chunk=cfg.dapo.logprob_chunk, rope_parameters=cfg.gpu.rope_parameters)
    with engine_released(ctx):
        metrics = run_update(job, samples, cfg.dapo.train, cfg.gpu)
    # before the checkpoint: a checkpoint without its state would restart AdamW on resume
    ctx.store.put_dir(state_out, ctx.key("train-state", out.name))
    shutil.rmtree(state_out, ignore_errors=True)
    return metrics


def train_state_dir(ctx: RunContext, policy: str) -> str | None:
    """A local copy of `policy`'s training state (AdamW moments, step count), if the store has one:
    DAPO checkpoints of this run do; the base model and RFT's checkpoint do not."""
    key = ctx.key("train-state", policy)
    if not is_checkpoint_name(policy) or not ctx.store.dir_complete(key):
        if policy.startswith("dapo-"):
            log.warning("%s has no training state in the store: this update starts a fresh optimizer", policy)
        return None
    local = state_dir() / "train-state" / key
    shutil.rmtree(local, ignore_errors=True)
    ctx.store.get_dir(key, local)
    return str(local)


def drop_train_state(ctx: RunContext, policy: str) -> None:
    """Only the newest training state is needed to go on (or to resume): free the older one."""
    if is_checkpoint_name(policy):
        ctx.store.delete(ctx.key("train-state", policy))
        shutil.rmtree(state_dir() / "train-state" / ctx.key("train-state", policy), ignore_errors=True)


@contextmanager
def engine_released(ctx: RunContext) -> Iterator[None]:
    """Under `gpu.layout: colocate`, the rollout engine sleeps while the trainer holds the devices."""
    engine = ctx.engine
    if ctx.cfg.gpu.layout != "colocate" or engine is None:
        yield
        return
    if not (hasattr(engine, "sleep") and hasattr(engine, "wake_up")):
        raise RuntimeError(f"gpu.layout colocate: the {type(engine).__name__} engine cannot sleep and wake up")
    engine.sleep()
    try:
        yield
    finally:
        engine.wake_up()


def rollout_metrics(stats: RolloutStats, problems: list[TaskInstance], draws: int) -> dict[str, float]:
    summary = stats.summary()
    return {
        "resolved_rate": summary["resolved_rate"], "format_error_rate": summary["format_error_rate"],
        "mean_turns": summary["mean_turns"], "reward_mean_all": summary["reward_mean"],
        "response_tokens": float(sum(len(tr.token_ids) for t in stats.trajectories for tr in t.turns)),
        "problems": float(len(problems)), "draws": float(draws),
        "time/generation_s": summary["gen_time_s"], "time/environment_s": summary["env_time_s"],
        "time/grading_s": summary["grade_time_s"],
    }


# ---------------------------------------------------------------- evaluation
def set_aside_eval(ctx: RunContext, label: str, old_policy: str) -> None:
    """Move a label's evaluation of another policy (report and episodes) to `{label}@{policy}`,
    so the label can be evaluated again without reusing the old policy's episodes."""
    aside = f"{label}@{safe_name(old_policy)}"
    log.warning("eval %s: the stored evaluation is of %s; moved to %s, evaluating again", label, old_policy, aside)
    for src, dst in ((ctx.key("eval", label), ctx.key("eval", aside)),
                     (ctx.key("rollouts", f"eval-{label}"), ctx.key("rollouts", f"eval-{aside}"))):
        for key in [k for k in ctx.store.ls(src) if k.startswith(src + "/")]:  # not `{label}2/`
            ctx.store.put_bytes(dst + key[len(src):], ctx.store.get_bytes(key))
            ctx.store.delete(key)


def evaluate(ctx: RunContext, label: str, policy: str, tasks: list[TaskInstance]) -> dict[str, Any]:
    """n independent runs on the eval set; predictions per run, a report and a summary."""
    cfg = ctx.cfg
    label = safe_name(label)
    report_key = ctx.key("eval", label, "report.json")
    if ctx.store.exists(report_key):
        report = ctx.store.get_json(report_key)
        if report.get("policy") == policy:
            return report
        # e.g. "dapo" after a finished run is resumed with more iterations: a new final policy
        set_aside_eval(ctx, label, report.get("policy", "unknown"))
    chosen = tasks[: cfg.eval.max_tasks] if cfg.eval.max_tasks else tasks
    stats = rollouts(ctx, f"eval-{label}", 0, chosen, cfg.eval.runs, policy, spec=episode_spec(cfg),
                     sampling=cfg.eval.sampling)
    summary = summarize(stats.trajectories, chosen, cfg.eval.runs, cfg.eval.k)
    for r in range(cfg.eval.runs):
        lines = predictions(stats.trajectories, f"swerl/{ctx.run_id}/{policy}", r)
        ctx.store.put_text(ctx.key("eval", label, f"predictions-run{r}.jsonl"),
                           "".join(json.dumps(p) + "\n" for p in lines))
    report = {"label": label, "policy": policy, "run_id": ctx.run_id, "dataset_hash": tasks_hash(chosen),
              **summary.to_dict(),
              "resolved_ids": sorted(t.task_id for t in stats.trajectories if t.status == "resolved"),
              "error_ids": sorted({t.task_id for t in stats.trajectories if t.status == "error"})}
    ctx.store.put_json(report_key, report)
    ctx.on_metrics(f"eval-{label}", {"pass@1": summary.pass1, "sem": summary.sem,
                                     **{f"pass@{k}": v for k, v in summary.pass_k.items()},
                                     "errors": summary.errors, "format_error_rate": summary.format_error_rate},
                   None)
    return report
