"""The Prefect flows: each pipeline stage alone, and `pipeline`, which chains them from a preset.

A flow run with the same preset and overrides resumes the same run (`run_id` is derived from the
resolved config unless given): every stage finds its finished work in the store and continues at
the first unfinished stage or iteration.
"""

from __future__ import annotations

import logging
from typing import Any

from prefect import Task, flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows.run_params import PipelineParams
from swerl.config import SwerlConfig
from tasks import registry_tasks as reg
from tasks import stage_tasks as st
from tasks.curate_tasks import curate_task
from tasks.progress import FlowProgress
from tasks.reports import final_report
from tasks.retry import retry_delays
from tasks.run_context import RunRef, open_run
from training.stages import dapo_plan

# the DAPO metrics shown per iteration in the flow run's table artifact
DAPO_TABLE_KEYS = ("reward_mean", "resolved_rate", "problems", "groups_kept", "groups_dropped", "groups_over_batch",
                   "loss", "clip_frac_high", "mismatch/kl_k3", "mean_turns")


def _ref(preset: str | None, overrides: list[str] | None, run_id: str | None) -> RunRef:
    """The run a flow works on: run `run_id` with the config it stored (an explicit preset that
    is not the run's is refused), else the preset's (smoke when none is named)."""
    logging.getLogger("training").setLevel(logging.INFO)
    logging.getLogger("environments").setLevel(logging.INFO)
    ref, warning = RunRef.for_run(run_id, preset, overrides)
    if warning:
        get_run_logger().warning(warning)
    return ref


def _run(task: Task, ref: RunRef, *args: Any, **kwargs: Any) -> Any:
    """Run one of tasks/' Prefect tasks for this run, with the run's `orchestration.retries` and
    `retry_delay_s` (the first retry's delay; later ones back off exponentially from it)."""
    orch = open_run(ref).ctx.cfg.orchestration
    return task.with_options(retries=orch.retries, retry_delay_seconds=retry_delays(orch.retry_delay_s))(
        ref, *args, **kwargs)


def _eval_table(reports: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"model": label, "pass@1": round(r["pass@1"], 4), "sem": round(r["sem"], 4),
             "n_tasks": r["n_tasks"], "n_runs": r["n_runs"], "errors": r["errors"]}
            for label, r in reports.items()]


@flow(name="evaluate", log_prints=True)
def evaluate(preset: str | None = None, overrides: list[str] = [], run_id: str | None = None,  # noqa: B006
             policy: str = "base", label: str | None = None) -> dict[str, Any]:
    """Evaluate one policy of a run (`base` or a checkpoint name) on the eval set; `preset`
    defaults to the run's own (its stored config), else smoke."""
    ref = _ref(preset, overrides, run_id)
    open_run(ref).remember_config(overwrite=False)
    eval_tasks = _run(st.load_tasks, ref, "eval")
    report = _run(st.evaluate, ref, label or policy, policy, eval_tasks)
    create_table_artifact(_eval_table({label or policy: report}), key="swerl-eval",
                          description=f"evaluation of {policy} in run {ref.run_id}")
    return report


@flow(name="difficulty-filter", log_prints=True)
def difficulty_filter(preset: str | None = None, overrides: list[str] = [], run_id: str | None = None,  # noqa: B006
                      ) -> list[str]:
    ref = _ref(preset, overrides, run_id)
    open_run(ref).remember_config(overwrite=False)
    train = _run(st.load_tasks, ref, "train")
    kept = _run(st.difficulty_filter, ref, train)
    return [t["instance_id"] for t in kept]


@flow(name="rft", log_prints=True)
def rft(preset: str | None = None, overrides: list[str] = [], run_id: str | None = None) -> str:  # noqa: B006
    ref = _ref(preset, overrides, run_id)
    open_run(ref).remember_config(overwrite=False)
    train = _run(st.load_tasks, ref, "train")
    return _run(st.rft, ref, train)


@flow(name="dapo", log_prints=True)
def dapo(preset: str | None = None, overrides: list[str] = [], run_id: str | None = None,  # noqa: B006
         policy: str = "base", iterations: int | None = None) -> str:
    """DAPO stages from `policy`; `iterations` caps the total number of iterations run."""
    ref = _ref(preset, overrides, run_id)
    open_run(ref).remember_config(overwrite=False)
    train = _run(st.load_tasks, ref, "train")
    return _run_dapo(ref, train, policy, iterations)


def _run_dapo(ref: RunRef, pool: list[dict[str, Any]], policy: str, cap: int | None,
              checkpoints: list[str] | None = None) -> str:
    """Every DAPO stage's iterations from `policy` (at most `cap` in all); each new checkpoint's
    name is appended to `checkpoints`. Returns the last policy."""
    logger = get_run_logger()
    rows, done = [], 0
    plan = dapo_plan(open_run(ref).ctx.cfg)
    total = sum(p.cfg.iterations for p in plan)
    progress = FlowProgress("swerl-dapo-progress", f"DAPO iterations of run {ref.run_id}",
                            total if cap is None else min(cap, total))
    for dapo_stage in plan:
        for it in range(dapo_stage.cfg.iterations):
            if cap is not None and done >= cap:
                return policy
            policy, metrics = _run(st.dapo_iteration, ref, dapo_stage, it, pool, policy)
            if checkpoints is not None:
                checkpoints.append(policy)
            done += 1
            progress.step(policy)
            rows.append({"checkpoint": policy,
                         **{k: round(v, 4) for k, v in metrics.items() if k in DAPO_TABLE_KEYS}})
            logger.info("DAPO %s: %s", policy, rows[-1])
            create_table_artifact(rows, key="swerl-dapo-iterations",
                                  description=f"DAPO iterations of run {ref.run_id}")
    return policy


def _train_and_evaluate(ref: RunRef, cfg: SwerlConfig, train: list[dict[str, Any]],
                        eval_tasks: list[dict[str, Any]]) -> tuple[str, dict[str, dict[str, Any]]]:
    """base eval -> difficulty filter -> RFT -> eval -> DAPO -> eval; the final policy and every
    evaluation report, the final policy's last."""
    reports: dict[str, dict[str, Any]] = {}
    reports["base"] = _run(st.evaluate, ref, "base", "base", eval_tasks)
    pool = _run(st.difficulty_filter, ref, train) if cfg.difficulty.enabled else train
    policy = "base"
    if cfg.rft.enabled:
        policy = _run(st.rft, ref, pool, policy)
        # an RFT without resolved trajectories leaves the policy as it was: no second evaluation
        reports["rft"] = reports["base"] if policy == "base" else _run(st.evaluate, ref, "rft", policy, eval_tasks)
    if cfg.dapo.enabled:
        checkpoints: list[str] = []
        policy = _run_dapo(ref, pool, policy, None, checkpoints)
        # the final policy first: a run cut short during the curve's evaluations still has the
        # number it was run for (and a resume finds it in the store)
        final = _run(st.evaluate, ref, "dapo", policy, eval_tasks)
        for name in checkpoints[:-1] if cfg.eval.each_dapo_checkpoint else []:
            reports[name] = _run(st.evaluate, ref, name, name, eval_tasks)
        reports["dapo"] = final  # last: the report's table and the registered version read it there
    return policy, reports


def _register_and_promote(ref: RunRef, cfg: SwerlConfig, policy: str, report: dict[str, Any],
                          eval_tasks: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """Register `policy` with its evaluation `report` and put it up for promotion; a champion
    measured on another eval set is evaluated again on this one first."""
    version = _run(reg.register, ref, policy, report)
    champion_report = None
    stale = _run(reg.find_stale_champion, ref, version) if cfg.eval.rebaseline_champion else None
    if stale is not None:
        model = f"models:/{cfg.tracking.registered_model}/{stale}"
        try:
            champion_report = _run(st.evaluate, ref, reg.champion_label(stale), model, eval_tasks)
        except Exception as e:  # e.g. its checkpoint was deleted: no comparison, but the run's work stands
            get_run_logger().warning("champion v%s could not be evaluated again (%s: %s); it stays not comparable",
                                     stale, type(e).__name__, e)
    decision = _run(reg.promote, ref, version, champion_report=champion_report)
    return version, decision


@flow(name="pipeline", log_prints=True, validate_parameters=True)
def pipeline(params: PipelineParams = PipelineParams()) -> dict[str, Any]:  # noqa: B008
    """curate -> base eval -> difficulty filter -> RFT -> eval -> DAPO -> eval -> register/promote."""
    logging.getLogger("training").setLevel(logging.INFO)
    logging.getLogger("environments").setLevel(logging.INFO)
    ref = RunRef.create(params.base, params.all_overrides(), params.run_id)
    t = open_run(ref)
    cfg = t.ctx.cfg
    get_run_logger().info("run %s (preset %s): store %s", ref.run_id, cfg.preset, t.ctx.store.url(t.ctx.key()))
    parent = t.parent()
    t.remember_config(overwrite=True)
    create_markdown_artifact(f"MLflow parent run `{parent}` (experiment `{cfg.experiment_name}`), "
                             f"store `{t.ctx.store.url(t.ctx.key())}`", key="swerl-run")
    if not (cfg.data.tasks_file and cfg.data.eval_tasks_file):
        _run(curate_task, ref)
    train = _run(st.load_tasks, ref, "train")
    eval_tasks = _run(st.load_tasks, ref, "eval")
    policy, reports = _train_and_evaluate(ref, cfg, train, eval_tasks)
    create_table_artifact(_eval_table(reports), key="swerl-eval", description=f"evaluations of run {ref.run_id}")
    version, decision = _register_and_promote(ref, cfg, policy, reports[list(reports)[-1]], eval_tasks)
    summary = _run(final_report, ref, reports)
    t.finish("FINISHED")
    return {"run_id": ref.run_id, "policy": policy, "registered_version": version, "promotion": decision,
            **summary}
