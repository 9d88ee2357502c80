"""The Prefect flows: each stage alone, and `pipeline`, which chains them from a preset.

A flow run with the same preset and overrides resumes the same run (`run_id` is derived from the
resolved config unless given): every stage finds its finished work in the store and continues at
the first unfinished stage or iteration.
"""

from __future__ import annotations

import logging
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from tasks import stage_tasks as st
from tasks.run_context import RunRef, tracked
from training.stages import dapo_plan


def _ref(preset: str, overrides: list[str] | None, run_id: str | None) -> RunRef:
    logging.getLogger("training").setLevel(logging.INFO)
    logging.getLogger("environments").setLevel(logging.INFO)
    return RunRef.create(preset, overrides, run_id)


def _opts(ref: RunRef) -> dict[str, Any]:
    o = tracked(ref).ctx.cfg.orchestration
    return {"retries": o.retries}


def _eval_table(reports: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"model": label, "pass@1": round(r["pass@1"], 4), "sem": round(r["sem"], 4),
             "n_tasks": r["n_tasks"], "n_runs": r["n_runs"], "errors": r["errors"]}
            for label, r in reports.items()]


@flow(name="evaluate", log_prints=True)
def evaluate(preset: str = "smoke", overrides: list[str] = [], run_id: str | None = None,  # noqa: B006
             policy: str = "base", label: str | None = None) -> dict[str, Any]:
    """Evaluate one policy of a run (`base` or a checkpoint name) on the eval set."""
    ref = _ref(preset, overrides, run_id)
    eval_tasks = st.load_tasks.with_options(**_opts(ref))(ref, "eval")
    report = st.evaluate.with_options(**_opts(ref))(ref, label or policy, policy, eval_tasks)
    create_table_artifact(_eval_table({label or policy: report}), key="swerl-eval",
                          description=f"evaluation of {policy} in run {ref.run_id}")
    return report


@flow(name="difficulty-filter", log_prints=True)
def difficulty_filter(preset: str = "smoke", overrides: list[str] = [], run_id: str | None = None,  # noqa: B006
                      ) -> list[str]:
    ref = _ref(preset, overrides, run_id)
    train = st.load_tasks.with_options(**_opts(ref))(ref, "train")
    kept = st.difficulty_filter.with_options(**_opts(ref))(ref, train)
    return [t["instance_id"] for t in kept]


@flow(name="rft", log_prints=True)
def rft(preset: str = "smoke", overrides: list[str] = [], run_id: str | None = None) -> str:  # noqa: B006
    ref = _ref(preset, overrides, run_id)
    train = st.load_tasks.with_options(**_opts(ref))(ref, "train")
    return st.rft.with_options(**_opts(ref))(ref, train)


@flow(name="dapo", log_prints=True)
def dapo(preset: str = "smoke", overrides: list[str] = [], run_id: str | None = None,  # noqa: B006
         policy: str = "base", iterations: int | None = None) -> str:
    """DAPO stages from `policy`; `iterations` caps the total number of iterations run."""
    ref = _ref(preset, overrides, run_id)
    train = st.load_tasks.with_options(**_opts(ref))(ref, "train")
    return _dapo_stages(ref, train, policy, iterations)


def _dapo_stages(ref: RunRef, pool: list[dict[str, Any]], policy: str, cap: int | None,
                 checkpoints: list[str] | None = None) -> str:
    """Run the DAPO iterations from `policy`; each new checkpoint's name is appended to `checkpoints`."""
    logger = get_run_logger()
    cfg = tracked(ref).ctx.cfg
    rows, done = [], 0
    for stage in dapo_plan(cfg):
        for it in range(stage.cfg.iterations):
            if cap is not None and done >= cap:
                return policy
            policy, metrics = st.dapo_iteration.with_options(**_opts(ref))(ref, stage, it, pool, policy)
            if checkpoints is not None:
                checkpoints.append(policy)
            done += 1
            rows.append({"checkpoint": policy, **{k: round(v, 4) for k, v in metrics.items()
                                                   if k in ("reward_mean", "resolved_rate", "problems", "groups_kept",
                                                            "groups_dropped", "loss", "clip_frac_high",
                                                            "mismatch/kl_k3", "mean_turns")}})
            logger.info("DAPO %s: %s", policy, rows[-1])
            create_table_artifact(rows, key="swerl-dapo-iterations",
                                  description=f"DAPO iterations of run {ref.run_id}")
    return policy


@flow(name="pipeline", log_prints=True)
def pipeline(preset: str = "smoke", overrides: list[str] = [], run_id: str | None = None,  # noqa: B006
             ) -> dict[str, Any]:
    """curate -> base eval -> difficulty filter -> RFT -> eval -> DAPO -> eval -> register/promote."""
    from tasks import registry_tasks as reg

    ref = _ref(preset, overrides, run_id)
    t = tracked(ref)
    cfg = t.ctx.cfg
    logger = get_run_logger()
    logger.info("run %s (preset %s): store %s", ref.run_id, preset, t.ctx.store.url(t.ctx.key()))
    parent = t.parent()
    create_markdown_artifact(f"MLflow parent run `{parent}` (experiment `{cfg.experiment_name}`), "
                             f"store `{t.ctx.store.url(t.ctx.key())}`", key="swerl-run")
    if not (cfg.data.tasks_file and cfg.data.eval_tasks_file):
        from flows.curate import curate_task

        curate_task.with_options(**_opts(ref))(ref)
    train = st.load_tasks.with_options(**_opts(ref))(ref, "train")
    eval_tasks = st.load_tasks.with_options(**_opts(ref))(ref, "eval")
    reports: dict[str, dict[str, Any]] = {}
    reports["base"] = st.evaluate.with_options(**_opts(ref))(ref, "base", "base", eval_tasks)
    pool = st.difficulty_filter.with_options(**_opts(ref))(ref, train) if cfg.difficulty.enabled else train
    policy = "base"
    if cfg.rft.enabled:
        policy = st.rft.with_options(**_opts(ref))(ref, pool, policy)
        # an RFT without resolved trajectories leaves the policy as it was: no second evaluation
        reports["rft"] = (reports["base"] if policy == "base"
                          else st.evaluate.with_options(**_opts(ref))(ref, "rft", policy, eval_tasks))
    if cfg.dapo.enabled:
        checkpoints: list[str] = []
        policy = _dapo_stages(ref, pool, policy, None, checkpoints)
        # the final policy first: a run cut short during the curve's evaluations still has the
        # number it was run for (and a resume finds it in the store)
        final = st.evaluate.with_options(**_opts(ref))(ref, "dapo", policy, eval_tasks)
        for name in checkpoints[:-1] if cfg.eval.each_dapo_checkpoint else []:
            reports[name] = st.evaluate.with_options(**_opts(ref))(ref, name, name, eval_tasks)
        reports["dapo"] = final  # last: the report's table and the registered version read it there
    create_table_artifact(_eval_table(reports), key="swerl-eval", description=f"evaluations of run {ref.run_id}")
    version = reg.register.with_options(**_opts(ref))(ref, policy, reports[list(reports)[-1]])
    champion_report = None
    stale = reg.find_stale_champion.with_options(**_opts(ref))(ref, version) if cfg.eval.rebaseline_champion else None
    if stale is not None:  # the eval set changed since the champion was measured: measure it again
        model = f"models:/{cfg.tracking.registered_model}/{stale}"
        try:
            champion_report = st.evaluate.with_options(**_opts(ref))(ref, reg.champion_label(stale), model, eval_tasks)
        except Exception as e:  # e.g. its checkpoint was deleted: no comparison, but the run's work stands
            logger.warning("champion v%s could not be evaluated again (%s: %s); it stays not comparable",
                           stale, type(e).__name__, e)
    decision = reg.promote.with_options(**_opts(ref))(ref, version, champion_report=champion_report)
    summary = reg.final_report.with_options(**_opts(ref))(ref, reports)
    t.finish("FINISHED")
    return {"run_id": ref.run_id, "policy": policy, "registered_version": version, "promotion": decision,
            **summary}
