"""Registering evaluated checkpoints, promoting them, and the end-of-run report."""

from __future__ import annotations

from typing import Any

from prefect import task

from tasks.run_context import RunRef, tracked
from tasks.stage_tasks import UNIT
from training import stages
from training.promotion import Decision, decide


def register_version(t: Any, policy: str, report: dict[str, Any]) -> str:
    """A version of the registered model for `policy`, tagged with its evaluation."""
    ctx = t.ctx
    source = (ctx.store.url(ctx.key("checkpoints", policy)) if policy != "base"
              else stages.model_dir(ctx, "base"))
    report_key = ctx.key("eval", report["label"], "report.json")
    tags = {"swerl.run_id": ctx.run_id, "swerl.policy": policy, "swerl.preset": ctx.cfg.preset,
            "swerl.dataset_hash": str(report.get("dataset_hash")), "swerl.report": ctx.store.url(report_key), "swerl.report_key": report_key,
            "swerl.pass1": f"{report['pass@1']:.6f}", "swerl.sem": f"{report['sem']:.6f}",
            "swerl.n_tasks": str(report["n_tasks"]), "swerl.n_runs": str(report["n_runs"]),
            "swerl.mlflow_parent_run": t.parent()}
    version = t.tracker.register_model(source, run_id=t.child(f"eval-{report['label']}"), tags=tags)
    return str(version)


def report_of_version(t: Any, version: str) -> dict[str, Any]:
    """The evaluation report a version was registered with (read back from the store)."""
    tags = t.tracker.get_version_tags(t.ctx.cfg.tracking.registered_model, version)
    return t.ctx.store.get_json(tags["swerl.report_key"])


def promote_version(t: Any, version: str, manual: bool = False) -> Decision:
    """Challenger -> champion when significantly better on the same eval set (or forced)."""
    name = t.ctx.cfg.tracking.registered_model
    t.tracker.set_alias(name, "challenger", version)
    champion = t.tracker.get_version_by_alias(name, "champion")
    if manual:
        decision = Decision(True, "manual override", manual=True)
    elif champion is not None and str(champion) == str(version):
        decision = Decision(False, "already the champion")
    else:
        champ_report = report_of_version(t, str(champion)) if champion is not None else None
        decision = decide(report_of_version(t, version), champ_report, t.ctx.cfg.eval.significance)
    t.tracker.set_version_tags(name, version, decision.tags() | (
        {"swerl.promotion.previous_champion": str(champion)} if champion is not None else {}))
    if decision.promote:
        t.tracker.set_alias(name, "champion", version)
    return decision


@task(name="register", **UNIT)
def register(ref: RunRef, policy: str, report: dict[str, Any]) -> str:
    return register_version(tracked(ref), policy, report)


@task(name="promote", **UNIT)
def promote(ref: RunRef, version: str) -> dict[str, Any]:
    d = promote_version(tracked(ref), version)
    print(f"promotion of version {version}: {'PROMOTED' if d.promote else 'not promoted'}: {d.reason}")
    return {"promoted": d.promote, "reason": d.reason, "p_value": d.p_value}


@task(name="final-report", **UNIT)
def final_report(ref: RunRef, evals: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """report.json + Markdown + PNG plots, in the store and in MLflow."""
    from training.checkpoint import read_info
    from training.report import write_report

    t = tracked(ref)
    ctx = t.ctx
    iterations = []
    for s, stage in enumerate(ctx.cfg.dapo.stages):
        for it in range(stage.iterations):
            name = stages.checkpoint_name(f"dapo-s{s + 1}", it)
            if stages.has_checkpoint(ctx, name):
                iterations.append({"checkpoint": name, **(read_info(stages.model_dir(ctx, name)).get("metrics") or {})})
    wall_key = ctx.key("wall_time.json")
    wall = ctx.store.get_json(wall_key) if ctx.store.exists(wall_key) else {}
    out = ctx.work / "report"
    rep = write_report(out, ctx.cfg.preset, ctx.run_id, evals, iterations, wall)
    for f in out.iterdir():
        ctx.store.put_file(f, ctx.key("report", f.name))
        t.tracker.log_artifact(f, "report", run_id=t.parent())
    print((out / "report.md").read_text())
    return {"report": ctx.store.url(ctx.key("report", "report.json")), "eval": rep["eval"],
            "wall_time_s": rep["wall_time_s"]}
