"""Registering evaluated checkpoints, promoting them, and the reports people read.

A registered version of `cfg.tracking.registered_model` is one evaluation of one policy: its
tags name the run, the policy, the checkpoint's store key and the evaluation report it was
registered with, so a promotion can re-read both reports and compare them task by task.

Promotion decisions are written three ways, because the registry keeps only the latest state:
tags on the version (`swerl.promotion.*`, what the MLflow UI shows), a JSON record per decision
in the version's MLflow run (`promotion/...json`, the history), and the log.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from prefect import task

from tasks.run_context import RunRef, Tracked, tracked
from tasks.stage_tasks import UNIT
from training import stages
from training.run import checkpoint_name, has_checkpoint
from training.promotion import Decision, decide

log = logging.getLogger(__name__)

CHAMPION, CHALLENGER = "champion", "challenger"
KNOWN_EVAL_ORDER = ("base", "rft", "dapo")


# ---------------------------------------------------------------- registry reads
def _model_version(t: Tracked, version: str) -> Any:
    """The full ModelVersion (tags and the MLflow run it was registered from)."""
    name = t.ctx.cfg.tracking.registered_model
    client = t.tracker.client
    return t.tracker._call(f"get {name} v{version}", lambda: client.get_model_version(name, str(version)))


def find_versions(t: Tracked, **tags: str) -> list[Any]:
    """Versions of the registered model carrying all `tags` (keys with dots are fine), newest first."""
    name = t.ctx.cfg.tracking.registered_model
    if any("'" in str(v) for v in (name, *tags.values())):
        raise ValueError(f"registry search: quotes are not allowed in {name!r} / {tags}")
    where = " and ".join([f"name = '{name}'", *(f"tags.`{k}` = '{v}'" for k, v in tags.items())])
    client = t.tracker.client
    found = t.tracker._call(f"search {name} versions", lambda: client.search_model_versions(where))
    return sorted(found, key=lambda mv: int(mv.version), reverse=True)


def latest_version(t: Tracked, run_id: str) -> str | None:
    """The newest version a pipeline run registered (None when it registered none)."""
    found = find_versions(t, **{"swerl.run_id": run_id})
    return str(found[0].version) if found else None


def report_of_version(t: Tracked, version: str) -> dict[str, Any]:
    """The evaluation report a version was registered with (read back from the store)."""
    tags = t.tracker.get_version_tags(t.ctx.cfg.tracking.registered_model, version)
    return t.ctx.store.get_json(tags["swerl.report_key"])


# ---------------------------------------------------------------- register
def _checkpoint_key(t: Tracked, policy: str) -> str | None:
    """Where `policy`'s weights live in the store: a checkpoint name of this run or a store key
    of a sealed directory; None for the base model."""
    if policy == "base":
        return None
    ctx = t.ctx
    for key in (ctx.key("checkpoints", policy), policy.strip("/")):
        if ctx.store.dir_complete(key):
            return key
    raise FileNotFoundError(f"cannot register {policy!r}: no complete checkpoint at "
                            f"{ctx.store.url(ctx.key('checkpoints', policy))} nor at that store key")


def register_version(t: Tracked, policy: str, report: dict[str, Any]) -> str:
    """A version for `policy`, tagged with its evaluation; the same evaluation of the same policy
    registers once (a run resumed with more DAPO iterations has a new "dapo" policy to register).

    MLflow's `source` is a small pointer artifact in the evaluation's MLflow run (an MLflow
    server refuses local paths as sources); the checkpoint itself stays in the store, named by
    the `swerl.checkpoint_key` tag that `tasks.model_uri` resolves.
    """
    ctx = t.ctx
    label = report["label"]
    done = find_versions(t, **{"swerl.run_id": ctx.run_id, "swerl.eval_label": label, "swerl.policy": policy})
    if done:
        log.info("registry: evaluation %s of run %s is already version %s", label, ctx.run_id, done[0].version)
        return str(done[0].version)
    key = _checkpoint_key(t, policy)
    eval_run = t.child(f"eval-{label}")
    report_key = ctx.key("eval", label, "report.json")
    pointer = {"policy": policy, "run_id": ctx.run_id, "checkpoint_key": key,
               "checkpoint": ctx.store.url(key) if key else None,
               "base_model": ctx.cfg.rollout.model if key is None else None,
               "manifest_hash": ctx.store.dir_manifest(key)["hash"] if key else None,
               "report": ctx.store.url(report_key)}
    t.tracker.log_dict(pointer, "checkpoint/swerl-checkpoint.json", run_id=eval_run)
    tags = {"swerl.run_id": ctx.run_id, "swerl.policy": policy, "swerl.preset": ctx.cfg.preset,
            "swerl.eval_label": label, "swerl.dataset_hash": str(report.get("dataset_hash")),
            "swerl.report": ctx.store.url(report_key), "swerl.report_key": report_key,
            "swerl.pass1": f"{report['pass@1']:.6f}", "swerl.sem": f"{report['sem']:.6f}",
            "swerl.n_tasks": str(report["n_tasks"]), "swerl.n_runs": str(report["n_runs"]),
            "swerl.errors": str(report.get("errors", 0)), "swerl.mlflow_parent_run": t.parent()}
    tags |= {"swerl.checkpoint_key": key, "swerl.checkpoint": ctx.store.url(key)} if key else \
        {"swerl.base_model": ctx.cfg.rollout.model}
    version = t.tracker.register_model(f"runs:/{eval_run}/checkpoint", run_id=eval_run, tags=tags)
    log.info("registry: %s -> %s version %s (pass@1 %.3f ± %.3f)", policy,
             ctx.cfg.tracking.registered_model, version, report["pass@1"], report["sem"])
    return str(version)


# ---------------------------------------------------------------- promote
def stale_champion(t: Tracked, version: str) -> str | None:
    """The champion version, when its registered evaluation is on another eval set than
    `version`'s (curation refreshed the set since): the paired test needs it evaluated again.
    Only a champion of this preset: another preset's may be another model family, which this
    run's inference backend cannot load."""
    name = t.ctx.cfg.tracking.registered_model
    champion = t.tracker.get_version_by_alias(name, CHAMPION)
    if champion is None or champion == str(version):
        return None
    if report_of_version(t, champion).get("dataset_hash") == report_of_version(t, str(version)).get("dataset_hash"):
        return None
    preset = t.tracker.get_version_tags(name, champion).get("swerl.preset")
    if preset != t.ctx.cfg.preset:
        log.info("registry: champion v%s is of preset %s, not %s: not evaluated again", champion, preset,
                 t.ctx.cfg.preset)
        return None
    return champion


def champion_label(version: str) -> str:
    """The evaluation label of a champion re-evaluated in this run."""
    return f"champion-v{version}"


def promote_version(t: Tracked, version: str, manual: bool = False, note: str = "",
                    champion_report: dict[str, Any] | None = None) -> Decision:
    """Challenger -> champion when significantly better on the same eval set (or forced).

    `champion_report`: the champion evaluated again on the challenger's eval set (see
    `stale_champion`), used instead of its registered evaluation. Deterministic given the two
    reports, so a retry after a crash between tagging and moving the alias reaches the same
    decision. A version that already is the champion is left as it is (its decision stays).
    """
    name = t.ctx.cfg.tracking.registered_model
    version = str(version)
    mv = _model_version(t, version)  # fails clearly on an unknown version
    champion = t.tracker.get_version_by_alias(name, CHAMPION)
    if champion == version:
        decision = Decision(False, "already the champion", manual=manual)
        _log_decision(t, mv, decision, champion, champion, retag=False)
        return decision
    if champion_report is not None and champion_report.get("label") != champion_label(champion or ""):
        raise ValueError(f"the champion is version {champion}, but the report given for it is "
                         f"{champion_report.get('label')!r} ({champion_report.get('policy')})")
    t.tracker.set_alias(name, CHALLENGER, version)
    challenger_report = report_of_version(t, version)
    if champion is None:
        champion_report = None
    elif champion_report is None:
        champion_report = report_of_version(t, champion)
    else:
        note = "; ".join(filter(None, [f"champion v{champion} re-evaluated on this eval set "
                                       f"({champion_report['label']} of run {champion_report.get('run_id')})", note]))
    decision = decide(challenger_report, champion_report, t.ctx.cfg.eval.significance, manual=manual)
    if note:
        decision.reason = f"{decision.reason} [{note}]"
    after = version if decision.promote else champion
    _log_decision(t, mv, decision, champion, after, retag=True)
    if decision.promote:
        t.tracker.set_alias(name, CHAMPION, version)
    return decision


def _log_decision(t: Tracked, mv: Any, decision: Decision, before: str | None, after: str | None,
                  retag: bool) -> None:
    name = t.ctx.cfg.tracking.registered_model
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    record = {"model": name, "version": str(mv.version), **decision.to_dict(), "champion_before": before,
              "champion_after": after, "alpha": t.ctx.cfg.eval.significance, "decided_at": stamp,
              "policy": (mv.tags or {}).get("swerl.policy"), "run_id": (mv.tags or {}).get("swerl.run_id")}
    log.info("promotion of %s v%s: %s (%s)", name, mv.version,
             "PROMOTED" if decision.promote else "not promoted", decision.reason)
    if retag:
        extra = {"swerl.promotion.decided_at": stamp, "swerl.promotion.champion_before": before or ""}
        t.tracker.set_version_tags(name, mv.version, decision.tags() | extra)
    if mv.run_id:
        t.tracker.log_dict(record, f"promotion/v{mv.version}-{stamp}-{time.time_ns() % 10**6:06d}.json",
                           run_id=mv.run_id)


# ---------------------------------------------------------------- reports
def publish_evaluation(t: Tracked, label: str, trajectories: list | None = None,
                       report: dict[str, Any] | None = None) -> list[Path]:
    """One evaluation's Markdown, plots and SWE-bench run reports: next to its report.json in the
    store, and in its MLflow run under `eval/` (see training.report.publish_eval)."""
    from training.report import publish_eval

    files = publish_eval(t.ctx, label, trajectories, report)
    run = t.child(f"eval-{label}")
    for f in files:
        t.tracker.log_artifact(f, f"eval/{label}", run_id=run)
    return files


def stored_evals(t: Tracked) -> dict[str, dict[str, Any]]:
    """Every evaluation report of the run in the store; base, rft, dapo first."""
    ctx = t.ctx
    prefix = ctx.key("eval") + "/"
    labels = [k[len(prefix):-len("/report.json")] for k in ctx.store.ls(ctx.key("eval"))
              if k.endswith("/report.json") and k.count("/") == prefix.count("/") + 1]
    order = sorted(labels, key=lambda x: (KNOWN_EVAL_ORDER.index(x) if x in KNOWN_EVAL_ORDER else 99, x))
    return {label: ctx.store.get_json(f"{prefix}{label}/report.json") for label in order}


def _iterations(t: Tracked) -> list[dict[str, Any]]:
    """DAPO metrics from each complete checkpoint's swerl.json (read alone, not the weights)."""
    ctx = t.ctx
    out = []
    for stage in stages.dapo_plan(ctx.cfg):
        for it in range(stage.cfg.iterations):
            name = checkpoint_name(stage.name, it)
            if has_checkpoint(ctx, name):
                info = ctx.store.get_json(ctx.key("checkpoints", name, "swerl.json"))
                out.append({"checkpoint": name, **(info.get("metrics") or {})})
    return out


def _registry_rows(t: Tracked) -> list[dict[str, Any]]:
    rows = []
    for mv in reversed(find_versions(t, **{"swerl.run_id": t.ctx.run_id})):
        tags = mv.tags or {}
        rows.append({"version": str(mv.version), "policy": tags.get("swerl.policy"),
                     "label": tags.get("swerl.eval_label"), "decision": tags.get("swerl.promotion.decision"),
                     "p_value": tags.get("swerl.promotion.p_value"), "reason": tags.get("swerl.promotion.reason", "")})
    return rows


def build_run_report(t: Tracked, evals: dict[str, dict[str, Any]] | None = None) -> Path:
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
    write_report(out, ctx.cfg.preset, ctx.run_id, evals, _iterations(t), wall, _registry_rows(t))
    parent = t.parent()
    for f in sorted(out.iterdir()):
        ctx.store.put_file(f, ctx.key("report", f.name))
        t.tracker.log_artifact(f, "report", run_id=parent)
    return out / "report.md"


# ---------------------------------------------------------------- Prefect tasks
@task(name="register", **UNIT)
def register(ref: RunRef, policy: str, report: dict[str, Any]) -> str:
    return register_version(tracked(ref), policy, report)


@task(name="stale-champion", **UNIT)
def find_stale_champion(ref: RunRef, version: str) -> str | None:
    return stale_champion(tracked(ref), version)


@task(name="promote", **UNIT)
def promote(ref: RunRef, version: str, manual: bool = False, note: str = "",
            champion_report: dict[str, Any] | None = None) -> dict[str, Any]:
    d = promote_version(tracked(ref), version, manual=manual, note=note, champion_report=champion_report)
    print(f"promotion of version {version}: {'PROMOTED' if d.promote else 'not promoted'}: {d.reason}")
    return {"version": str(version), **d.to_dict()}


@task(name="final-report", **UNIT)
def final_report(ref: RunRef, evals: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """report.json + Markdown + PNG plots, in the store and in MLflow."""
    t = tracked(ref)
    md = build_run_report(t, evals)
    print(md.read_text())
    rep = t.ctx.store.get_json(t.ctx.key("report", "report.json"))
    return {"report": t.ctx.store.url(t.ctx.key("report", "report.json")), "eval": rep["eval"],
            "wall_time_s": rep["wall_time_s"]}
