"""The reports people read: each evaluation's outputs and the run's final report, written to the
store and logged to the run's MLflow runs (the writing itself is `training.report`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task

from tasks.retry import RETRYABLE_TASK
from tasks.run_context import RunRef, TrackedRun, open_run
from training.run import checkpoint_name, has_checkpoint
from training.stages import dapo_plan

KNOWN_EVAL_ORDER = ("base", "rft", "dapo")


def publish_evaluation(t: TrackedRun, label: str, trajectories: list | None = None,
                       report: dict[str, Any] | None = None) -> list[Path]:
    """One evaluation's Markdown, plots and SWE-bench run reports: next to its report.json in the
    store, and in its MLflow run under `eval/` (see training.report.publish_eval)."""
    from training.report import publish_eval

    files = publish_eval(t.ctx, label, trajectories, report)
    run = t.child(f"eval-{label}")
    for f in files:
        t.tracker.log_artifact(f, f"eval/{label}", run_id=run)
    return files


def stored_evals(t: TrackedRun) -> dict[str, dict[str, Any]]:
    """Every evaluation report of the run in the store; base, rft, dapo first."""
    ctx = t.ctx
    prefix = ctx.key("eval") + "/"
    labels = [k[len(prefix):-len("/report.json")] for k in ctx.store.ls(ctx.key("eval"))
              if k.endswith("/report.json") and k.count("/") == prefix.count("/") + 1]
    order = sorted(labels, key=lambda x: (KNOWN_EVAL_ORDER.index(x) if x in KNOWN_EVAL_ORDER else 99, x))
    return {label: ctx.store.get_json(f"{prefix}{label}/report.json") for label in order}


def _dapo_iteration_metrics(t: TrackedRun) -> list[dict[str, Any]]:
    """DAPO metrics from each complete checkpoint's swerl.json (read alone, not the weights)."""
    ctx = t.ctx
    out = []
    for dapo_stage in dapo_plan(ctx.cfg):
        for it in range(dapo_stage.cfg.iterations):
            name = checkpoint_name(dapo_stage.name, it)
            if has_checkpoint(ctx, name):
                info = ctx.store.get_json(ctx.key("checkpoints", name, "swerl.json"))
                out.append({"checkpoint": name, **(info.get("metrics") or {})})
    return out


def _registry_rows(t: TrackedRun) -> list[dict[str, Any]]:
    """The run's registered versions, oldest first, with their promotion decisions."""
    rows = []
    for version in reversed(t.registry.find_versions(t.registry.model_name, {"swerl.run_id": t.ctx.run_id})):
        tags = version.tags or {}
        rows.append({"version": str(version.version), "policy": tags.get("swerl.policy"),
                     "label": tags.get("swerl.eval_label"), "decision": tags.get("swerl.promotion.decision"),
                     "p_value": tags.get("swerl.promotion.p_value"), "reason": tags.get("swerl.promotion.reason", "")})
    return rows


def build_run_report(t: TrackedRun, evals: dict[str, dict[str, Any]] | None = None) -> Path:
    """The run's report.json, report.md and plots: into the store (`runs/{id}/report/`) and the
    MLflow parent run. Each evaluation's own outputs are written too where missing. Returns the
    local report.md."""
    from training.report import write_report

    ctx = t.ctx
    evals = evals if evals is not None else stored_evals(t)
    for label, r in evals.items():
        if not ctx.store.exists(ctx.key("eval", r.get("label", label), "report.md")):
            publish_evaluation(t, r.get("label", label))
    wall_key = ctx.key("wall_time.json")
    wall = ctx.store.get_json(wall_key) if ctx.store.exists(wall_key) else {}
    out = ctx.work / "report"
    write_report(out, ctx.cfg.preset, ctx.run_id, evals, _dapo_iteration_metrics(t), wall, _registry_rows(t))
    parent = t.parent()
    for f in sorted(out.iterdir()):
        ctx.store.put_file(f, ctx.key("report", f.name))
        t.tracker.log_artifact(f, "report", run_id=parent)
    return out / "report.md"


@task(name="final-report", **RETRYABLE_TASK)
def final_report(ref: RunRef, evals: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """report.json + Markdown + PNG plots, in the store and in MLflow."""
    t = open_run(ref)
    md = build_run_report(t, evals)
    print(md.read_text())
    rep = t.ctx.store.get_json(t.ctx.key("report", "report.json"))
    return {"report": t.ctx.store.url(t.ctx.key("report", "report.json")), "eval": rep["eval"],
            "wall_time_s": rep["wall_time_s"]}
