"""The pipeline's stages as plain functions over one run: difficulty filter, RFT, DAPO, evaluation.

Every stage's output is keyed in the object store under `runs/{run_id}/` (one record per finished
episode, one directory per checkpoint with a completion marker, one report per evaluation), and
each function first looks there: a re-run after a crash redoes nothing that finished. Prefect and
MLflow wrap these functions in tasks/ and flows/; nothing here imports them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import shutil
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from environments.records import TaskInstance, at_hint_level
from swerl.config import DataConfig, Sampling, SwerlConfig, dump_config
from swerl.paths import state_dir
from training.agent import AgentLimits
from training.rollout import RolloutSpec, RolloutStats, TrajectorySink, collect
from training.trajectory import Trajectory

log = logging.getLogger(__name__)

MetricsFn = Callable[[str, dict[str, float], int | None], None]  # (stage, metrics, step)


def config_hash(cfg: SwerlConfig) -> str:
    return hashlib.sha256(dump_config(cfg).encode()).hexdigest()[:10]


def default_run_id(cfg: SwerlConfig) -> str:
    """Same config, same run: a re-run resumes instead of starting over."""
    return f"{cfg.preset}-{config_hash(cfg)}"


@dataclass
class RunContext:
    cfg: SwerlConfig
    store: Any  # swerl.store.Store
    run_id: str
    on_metrics: MetricsFn = lambda stage, metrics, step: None
    # for metrics a resumed run sends again: the tracker skips those it already has at that step
    on_missing_metrics: MetricsFn = lambda stage, metrics, step: None
    progress: bool = True
    _backend: Any = field(default=None, repr=False)
    _backend_path: str | None = field(default=None, repr=False)

    def key(self, *parts: object) -> str:
        return "/".join(["runs", self.run_id, *map(str, parts)])

    @property
    def work(self) -> Path:
        p = state_dir() / "runs" / self.run_id
        p.mkdir(parents=True, exist_ok=True)
        return p


# ---------------------------------------------------------------- models
def checkpoint_name(stage: str, iteration: int) -> str:
    return f"{stage}-{iteration}"


def has_checkpoint(ctx: RunContext, name: str) -> bool:
    return ctx.store.dir_complete(ctx.key("checkpoints", name))


def model_dir(ctx: RunContext, name: str) -> str:
    """A local directory holding model `name`: "base", a checkpoint of this run ("rft-0"), a store
    key of a checkpoint directory, a local path, or a registry URI ("models:/swerl-agent@champion")."""
    from swerl.model_cache import resolve_model
    from training.checkpoint import is_complete

    if name == "base":
        return resolve_model(ctx.cfg.rollout.model)
    key = ctx.key("checkpoints", name) if _is_checkpoint_name(name) else name.strip("/")
    if _is_checkpoint_name(name) or (not Path(name).exists() and ":/" not in name and ctx.store.dir_complete(key)):
        local = state_dir() / "models" / key
        if not is_complete(local):
            shutil.rmtree(local, ignore_errors=True)
            ctx.store.get_dir(key, local)
        return str(local)
    return resolve_model(name)


def _is_checkpoint_name(name: str) -> bool:
    return re.fullmatch(r"(rft|dapo-s\d+)-\d+", name) is not None


def publish_checkpoint(ctx: RunContext, local_dir: str | Path, name: str) -> str:
    """Upload a complete local checkpoint; the store's own marker makes the upload atomic."""
    key = ctx.key("checkpoints", name)
    ctx.store.put_dir(local_dir, key)
    return key


def backend_for(ctx: RunContext, policy: str) -> Any:
    """One inference backend per run, reloading weights when the policy changes."""
    from training.inference import make_backend

    path = model_dir(ctx, policy)
    if ctx._backend is None:
        ctx._backend = make_backend(ctx.cfg.rollout.model_copy(update={"model": path}))
    elif ctx._backend_path != path:
        ctx._backend.load_weights(path)
    ctx._backend_path = path
    ctx._backend.policy_version = policy
    return ctx._backend


# ---------------------------------------------------------------- rollouts
def rollouts(ctx: RunContext, stage: str, iteration: int, tasks: list[TaskInstance], samples: int, policy: str,
             *, max_turns: int, max_context: int, sampling: Sampling, one_shot: bool = False,
             l_thr: int | None = None) -> RolloutStats:
    """`samples` episodes of each task with `policy`; finished episodes are reused on re-run."""
    from environments.swe_env import SWEEnv
    from training.dapo import reward
    from training.inference.base import SamplingParams

    from environments.sandbox import cleanup_leaked

    cfg = ctx.cfg
    if cfg.environment.sandbox == "docker":
        removed = cleanup_leaked()  # sandboxes of processes that died (a killed earlier attempt)
        if removed:
            log.warning("removed %d sandboxes left by dead processes", len(removed))
    backend = backend_for(ctx, policy)
    spec = RolloutSpec(
        limits=AgentLimits(max_turns=max_turns, max_context_tokens=max_context,
                           max_new_tokens=sampling.max_new_tokens),
        sampling=SamplingParams.from_config(sampling, seed=cfg.seed + iteration),
        action_format=cfg.rollout.action_format, window=cfg.environment.window,
        one_shot=one_shot or cfg.rollout.one_shot_demo, concurrency=cfg.rollout.concurrency,
        prompt_style=cfg.rollout.prompt_style, show_source=cfg.rollout.show_source)

    def reward_fn(t: Trajectory) -> float:
        if l_thr is None:
            return float(t.status == "resolved")
        return reward(t.status == "resolved", t.num_turns, l_thr, max_turns)

    sink = TrajectorySink(ctx.store, ctx.key("rollouts", stage, iteration))
    stats = collect(tasks, samples, backend,
                    lambda task: SWEEnv(task, cfg.environment, cfg.rollout.action_format,
                                        observation_max_chars=cfg.rollout.observation_max_chars,
                                        prompt_style=cfg.rollout.prompt_style,
                                        show_source=cfg.rollout.show_source),
                    spec, reward_fn, sink=sink, progress=ctx.progress)
    summary = stats.summary()
    log.info("%s/%s rollouts: %s", stage, iteration, json.dumps({k: round(v, 4) for k, v in summary.items()}))
    ctx.on_metrics(stage, {f"rollout/{k}": float(v) for k, v in summary.items()}, iteration)
    return stats


def stored_trajectories(ctx: RunContext, stage_prefix: str = "",
                        keep: Callable[[str], bool] | None = None) -> list[Trajectory]:
    """Every finished episode of this run (optionally of stages starting with a prefix, and
    whose key below rollouts/ passes ``keep``)."""
    out = []
    for key in ctx.store.ls(ctx.key("rollouts")):
        rel = key.split("/rollouts/", 1)[-1]
        if key.endswith(".json") and rel.startswith(stage_prefix) and (keep is None or keep(rel)):
            out.append(Trajectory.from_json(ctx.store.get_text(key)))
    return out


def _before(stage_idx: int, iteration: int) -> Callable[[str], bool]:
    """Keys (``dapo-s{stage}/{iteration}/...``) of DAPO iterations before this one."""
    def keep(rel: str) -> bool:
        m = re.match(r"dapo-s(\d+)/(\d+)/", rel)
        return bool(m) and (int(m[1]) - 1, int(m[2])) < (stage_idx, iteration)
    return keep


# ---------------------------------------------------------------- difficulty filter
def difficulty_filter(ctx: RunContext, tasks: list[TaskInstance], policy: str = "base") -> list[TaskInstance]:
    from training.difficulty import filter_band, pass_rates

    cfg = ctx.cfg
    stats = rollouts(ctx, "difficulty", 0, tasks, cfg.difficulty.samples_per_task, policy,
                     max_turns=cfg.rollout.max_turns, max_context=cfg.rollout.max_context_tokens,
                     sampling=cfg.rollout.sampling)
    rates = pass_rates(stats.trajectories)
    kept = filter_band(tasks, rates, cfg.difficulty.min_pass_rate, cfg.difficulty.max_pass_rate)
    ctx.on_metrics("difficulty", {"tasks_in": len(tasks), "tasks_kept": len(kept)}, None)
    ctx.store.put_json(ctx.key("difficulty", "rates.json"),
                       {k: {"attempts": v.attempts, "solved": v.solved} for k, v in rates.items()})
    return kept


# ---------------------------------------------------------------- RFT
def rft_stage(ctx: RunContext, tasks: list[TaskInstance], policy: str = "base") -> str:
    """Sample with the base policy, keep resolved trajectories, fine-tune on them."""
    from training import rft

    name = checkpoint_name("rft", 0)
    if has_checkpoint(ctx, name):
        log.info("rft: checkpoint %s already complete, reusing it", name)
        return name
    cfg = ctx.cfg
    chosen = tasks[: cfg.rft.max_tasks] if cfg.rft.max_tasks else tasks
    stats = rollouts(ctx, "rft", 0, chosen, cfg.rft.samples_per_task, policy,
                     max_turns=cfg.rollout.max_turns, max_context=cfg.rollout.max_context_tokens,
                     sampling=cfg.rft.sampling or cfg.rollout.sampling, one_shot=cfg.rft.one_shot_demo)
    resolved = [t for t in stats.trajectories if t.status == "resolved"]
    log.info("rft: %d resolved of %d trajectories", len(resolved), len(stats.trajectories))
    ctx.on_metrics("rft", {"rft/trajectories": len(stats.trajectories), "rft/resolved": len(resolved)}, 0)
    if not resolved:
        log.warning("rft: no resolved trajectory to learn from; the policy stays %s", policy)
        return policy
    out = ctx.work / "staging" / name
    shutil.rmtree(out, ignore_errors=True)
    info = {"stage": "rft", "iteration": 0, "parent": policy, "run_id": ctx.run_id, "version": name,
            "tasks_hash": _tasks_hash(chosen)}
    path = rft.train(resolved, model_dir(ctx, policy), cfg.rft, out, info=info, seed=cfg.seed)
    from training.checkpoint import read_info

    ctx.on_metrics("rft", {f"rft/{k}": v for k, v in (read_info(path).get("metrics") or {}).items()}, 0)
    publish_checkpoint(ctx, path, name)
    return name


# ---------------------------------------------------------------- DAPO
def dapo_problems(ctx: RunContext, pool: list[TaskInstance], stage_idx: int, iteration: int) -> list[TaskInstance]:
    """This iteration's candidate problems in draw order: a seeded shuffle of the pool (after the
    stage-2 rule, if the stage has one). The first `problems_per_iteration` are always drawn;
    dynamic sampling draws the next ones."""
    stage = ctx.cfg.dapo.stages[stage_idx]
    if stage.filter_solved_share is not None or stage.drop_never_solved:
        from training.difficulty import stage2_filter

        # Earlier iterations only: the iteration's own episodes (there when it is resumed) must
        # not change the pool it draws from, or a resume draws other problems.
        history = stored_trajectories(ctx, "dapo-", _before(stage_idx, iteration))
        pool, dropped = stage2_filter(pool, history, stage.filter_solved_share, stage.drop_never_solved)
        log.info("dapo stage %d: pool after the stage-2 rule %d (dropped %s)", stage_idx + 1, len(pool), dropped)
    rng = random.Random(f"{ctx.cfg.seed}-{stage_idx}-{iteration}")
    return rng.sample(pool, len(pool))


def _groups(trajectories: list[Trajectory]) -> list[list[Trajectory]]:
    """One group per task (DAPO's prompt groups)."""
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        groups[t.task_id].append(t)
    return list(groups.values())


def _informative_groups(trajectories: list[Trajectory]) -> int:
    from training.dapo import dynamic_sampling

    return len(dynamic_sampling([[t for t in g if t.status != "error"] for g in _groups(trajectories)])[0])


def dapo_rollouts(ctx: RunContext, stage_idx: int, iteration: int, pool: list[TaskInstance],
                  policy: str) -> tuple[list[TaskInstance], RolloutStats, int]:
    """The iteration's groups. Dynamic sampling: while fewer than `min_groups_kept` groups carry
    a gradient, draw the next `problems_per_iteration` problems (up to `max_problems_per_iteration`).
    Every draw lands in the same iteration's records, so a resumed iteration redoes none of them.
    Returns the problems drawn, their rollouts and the number of draws."""
    stage = ctx.cfg.dapo.stages[stage_idx]
    order = dapo_problems(ctx, pool, stage_idx, iteration)
    cap = min(stage.max_problems_per_iteration or stage.problems_per_iteration, len(order))
    drawn: list[TaskInstance] = []
    parts: list[RolloutStats] = []
    while len(drawn) < cap:
        chunk = order[len(drawn): min(len(drawn) + stage.problems_per_iteration, cap)]
        parts.append(rollouts(ctx, f"dapo-s{stage_idx + 1}", iteration, chunk, stage.group_size, policy,
                              max_turns=stage.max_turns, max_context=stage.max_context_tokens,
                              sampling=ctx.cfg.rollout.sampling, l_thr=stage.l_thr))
        drawn += chunk
        kept = _informative_groups([t for p in parts for t in p.trajectories])
        if kept >= stage.min_groups_kept:
            break
        if len(drawn) < cap:
            log.info("dapo-s%d/%d: %d of %d groups carry a gradient (want %d): drawing %d more problems",
                     stage_idx + 1, iteration, kept, len(drawn), stage.min_groups_kept,
                     min(stage.problems_per_iteration, cap - len(drawn)))
    return drawn, RolloutStats.combine(parts), len(parts)


def dapo_iteration(ctx: RunContext, stage_idx: int, iteration: int, pool: list[TaskInstance],
                   policy: str) -> tuple[str, dict[str, float]]:
    """Rollouts -> rewards -> group advantages -> one policy update -> checkpoint."""
    import time

    from training.checkpoint import read_info, save_checkpoint
    from training.dapo import iteration_update, samples_from_groups

    stage_name = f"dapo-s{stage_idx + 1}"
    name = checkpoint_name(stage_name, iteration)
    step = sum(s.iterations for s in ctx.cfg.dapo.stages[:stage_idx]) + iteration
    if has_checkpoint(ctx, name):
        metrics = read_info(model_dir(ctx, name)).get("metrics") or {}
        log.info("%s: checkpoint already complete, reusing it", name)
        # Sent again unless already there: a run killed between sealing the checkpoint and
        # flushing MLflow lost them.
        ctx.on_missing_metrics("dapo", metrics, step)
        return name, metrics
    stage = ctx.cfg.dapo.stages[stage_idx]
    t0 = time.monotonic()
    problems, stats, draws = dapo_rollouts(ctx, stage_idx, iteration, pool, policy)
    t_roll = time.monotonic() - t0
    samples, group_stats = samples_from_groups(_groups(stats.trajectories), ctx.cfg.dapo.adv_delta)
    t1 = time.monotonic()
    model, tokenizer, _ = _load_model(ctx, policy)
    metrics = iteration_update(model, samples, ctx.cfg, stage, group_stats=group_stats,
                               seed=ctx.cfg.seed + iteration, temperature=ctx.cfg.rollout.sampling.temperature)
    t_train = time.monotonic() - t1
    summary = stats.summary()
    metrics.update({
        "resolved_rate": summary["resolved_rate"], "format_error_rate": summary["format_error_rate"],
        "mean_turns": summary["mean_turns"], "reward_mean_all": summary["reward_mean"],
        "response_tokens": float(sum(len(tr.token_ids) for t in stats.trajectories for tr in t.turns)),
        "problems": float(len(problems)), "draws": float(draws),
        "time/rollout_s": t_roll, "time/generation_s": summary["gen_time_s"],
        "time/environment_s": summary["env_time_s"], "time/grading_s": summary["grade_time_s"],
        "time/training_s": t_train,
    })
    out = ctx.work / "staging" / name
    shutil.rmtree(out, ignore_errors=True)
    save_checkpoint(_unwrap(model), tokenizer, out, {
        "stage": stage_name, "iteration": iteration, "parent": policy, "run_id": ctx.run_id, "version": name,
        "dataset_hash": _tasks_hash(problems), "metrics": metrics})
    publish_checkpoint(ctx, out, name)
    ctx.on_metrics("dapo", metrics, step)
    return name, metrics


def _load_model(ctx: RunContext, policy: str) -> tuple[Any, Any, dict]:
    from training.checkpoint import load_checkpoint

    path = model_dir(ctx, policy)
    if policy == "base":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path), {}
    return load_checkpoint(path)


def _unwrap(model: Any) -> Any:
    return getattr(model, "module", model)


def _find_file(path: str) -> str:
    """A relative path from a preset means the working directory's, else the project checkout's."""
    from swerl.config import CONFIG_DIR

    p = Path(path)
    if p.is_absolute() or p.exists():
        return str(p)
    return str(CONFIG_DIR.parent / p)


def _tasks_hash(tasks: list[TaskInstance]) -> str:
    return hashlib.sha256("\n".join(sorted(t.instance_id for t in tasks)).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- evaluation
def _safe_name(name: str) -> str:
    """A label or policy name as one store key segment."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")


def _set_aside_eval(ctx: RunContext, label: str, old_policy: str) -> None:
    """Move a label's evaluation of another policy (report and episodes) to `{label}@{policy}`,
    so the label can be evaluated again without reusing the old policy's episodes."""
    aside = f"{label}@{_safe_name(old_policy)}"
    log.warning("eval %s: the stored evaluation is of %s; moved to %s, evaluating again", label, old_policy, aside)
    for src, dst in ((ctx.key("eval", label), ctx.key("eval", aside)),
                     (ctx.key("rollouts", f"eval-{label}"), ctx.key("rollouts", f"eval-{aside}"))):
        for key in [k for k in ctx.store.ls(src) if k.startswith(src + "/")]:  # not `{label}2/`
            ctx.store.put_bytes(dst + key[len(src):], ctx.store.get_bytes(key))
            ctx.store.delete(key)


def evaluate(ctx: RunContext, label: str, policy: str, tasks: list[TaskInstance]) -> dict[str, Any]:
    """n independent runs on the eval set; predictions per run, a report and a summary."""
    from training.evaluation import predictions, summarize

    cfg = ctx.cfg
    label = _safe_name(label)
    report_key = ctx.key("eval", label, "report.json")
    if ctx.store.exists(report_key):
        report = ctx.store.get_json(report_key)
        if report.get("policy") == policy:
            return report
        # e.g. "dapo" after a finished run is resumed with more iterations: a new final policy
        _set_aside_eval(ctx, label, report.get("policy", "unknown"))
    chosen = tasks[: cfg.eval.max_tasks] if cfg.eval.max_tasks else tasks
    stats = rollouts(ctx, f"eval-{label}", 0, chosen, cfg.eval.runs, policy,
                     max_turns=cfg.rollout.max_turns, max_context=cfg.rollout.max_context_tokens,
                     sampling=cfg.eval.sampling)
    summary = summarize(stats.trajectories, chosen, cfg.eval.runs, cfg.eval.k)
    for r in range(cfg.eval.runs):
        lines = predictions(stats.trajectories, f"swerl/{ctx.run_id}/{policy}", r)
        ctx.store.put_text(ctx.key("eval", label, f"predictions-run{r}.jsonl"),
                           "".join(json.dumps(p) + "\n" for p in lines))
    report = {"label": label, "policy": policy, "run_id": ctx.run_id, "dataset_hash": _tasks_hash(chosen),
              **summary.to_dict(),
              "resolved_ids": sorted(t.task_id for t in stats.trajectories if t.status == "resolved"),
              "error_ids": sorted({t.task_id for t in stats.trajectories if t.status == "error"})}
    ctx.store.put_json(report_key, report)
    ctx.on_metrics(f"eval-{label}", {"pass@1": summary.pass1, "sem": summary.sem,
                                     **{f"pass@{k}": v for k, v in summary.pass_k.items()},
                                     "errors": summary.errors, "format_error_rate": summary.format_error_rate},
                   None)
    return report


# ---------------------------------------------------------------- data
def select_tasks(tasks: list[TaskInstance], d: DataConfig) -> list[TaskInstance]:
    """The curriculum: each task at the configured hint level, only the configured bug kinds,
    then the per-project and total caps (in file order, so a run sees the same tasks again)."""
    tasks = [at_hint_level(t, d.hint_level) for t in tasks]
    if d.exact_hint_level:
        tasks = [t for t in tasks if t.meta.get("hint_level") == d.hint_level]
    if d.modifiers is not None:
        tasks = [t for t in tasks if set(str(t.meta.get("modifier", "")).split("+")) <= set(d.modifiers)]
    if d.max_tasks_per_project:
        per: dict[str, int] = defaultdict(int)
        capped = []
        for t in tasks:
            per[t.project] += 1
            if per[t.project] <= d.max_tasks_per_project:
                capped.append(t)
        tasks = capped
    return tasks[: d.max_tasks] if d.max_tasks else tasks


def pinned_dataset(ctx: RunContext, split: str, name: str) -> str:
    """The hash of the dataset this run uses for `split`: the one the config pins (`data.train_hash`,
    `eval_hash`), else the newest at the run's first load; that one from then on, so a resumed run
    never evaluates or trains on another set than it started with (kept in `runs/<id>/datasets.json`)."""
    from environments.curation.dataset import ensure_dataset, latest_hash

    key = ctx.key("datasets.json")
    pins = ctx.store.get_json(key) if ctx.store.exists(key) else {}
    data = ctx.cfg.data if ctx.cfg is not None else None
    wanted = data.pinned_hash(split) if data is not None else None
    if wanted:
        ensure_dataset(ctx.store, name, wanted)  # a stage run on its own may come before curation
    newest = wanted or latest_hash(ctx.store, name)
    pin = pins.get(split)
    if pin and pin["name"] == name:
        if wanted and pin["hash"] != wanted:
            raise RuntimeError(f"run {ctx.run_id} uses {split} dataset {name}@{pin['hash']}, but its config "
                               f"now pins {wanted}: start a new run (another run id) for another dataset")
        if pin["hash"] != newest:
            log.warning("run %s keeps its %s dataset %s@%s (the newest is %s)", ctx.run_id, split, name,
                        pin["hash"], newest)
        return pin["hash"]
    pins[split] = {"name": name, "hash": newest}
    ctx.store.put_json(key, pins)
    return newest


def load_split(ctx: RunContext, split: str) -> list[TaskInstance]:
    """The train or eval tasks of this run, with their instance images built.

    A task whose image cannot be built is reported and skipped, not fatal: one broken project
    must not take the run down.
    """
    from environments.images import ensure_images
    from environments.records import load_tasks

    d = ctx.cfg.data
    path = d.tasks_file if split == "train" else d.eval_tasks_file
    if path:
        report = load_tasks(_find_file(path))
        for err in report.errors:
            log.warning("skipping malformed task: %s", err)
        tasks = report.tasks
    else:
        from environments.curation.dataset import load_dataset

        name = d.train_dataset if split == "train" else d.eval_dataset
        tasks = load_dataset(ctx.store, name, pinned_dataset(ctx, split, name))
    tasks = select_tasks(tasks, d)
    ready = []
    for t in tasks:
        try:
            t.image = ensure_images([t], progress=log.info)[t.instance_id]
            ready.append(t)
        except Exception as e:  # noqa: BLE001 - reported, the rest of the set goes on
            log.error("skipping task %s: its image could not be built: %s", t.instance_id, e)
    if not ready:
        raise RuntimeError(f"no usable {split} tasks (of {len(tasks)})")
    return ready
