"""Registering evaluated checkpoints and promoting them, as functions and as Prefect tasks.

A registered version of `cfg.tracking.registered_model` is one evaluation of one policy: its
tags name the run, the policy, the checkpoint's store key and the evaluation report it was
registered with, so a promotion can re-read both reports and compare them task by task.

Promotion decisions are written three ways, because the registry keeps only the latest state:
tags on the version (`swerl.promotion.*`, what the MLflow UI shows), a JSON record per decision
in the version's MLflow run (`promotion/...json`, the history), and the log.
"""

from __future__ import annotations

import logging
import shutil
import time
from typing import Any

from mlflow.entities.model_registry import ModelVersion
from prefect import task

from tasks.retry import RETRYABLE_TASK
from tasks.run_context import RunRef, TrackedRun, open_run
from training.promotion import Decision, decide
from training.run import safe_name

log = logging.getLogger(__name__)

CHAMPION, CHALLENGER = "champion", "challenger"


# ---------------------------------------------------------------- registry reads
def latest_version(t: TrackedRun, run_id: str) -> str | None:
    """The newest version a pipeline run registered (None when it registered none)."""
    found = t.registry.find_versions(t.registry.model_name, {"swerl.run_id": run_id})
    return str(found[0].version) if found else None


def report_of_version(t: TrackedRun, version: str) -> dict[str, Any]:
    """The evaluation report a version was registered with (read back from the store)."""
    tags = t.registry.get_version_tags(t.registry.model_name, version)
    return t.ctx.store.get_json(tags["swerl.report_key"])


# ---------------------------------------------------------------- register
def _checkpoint_key(t: TrackedRun, policy: str) -> str | None:
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


def _version_tags(t: TrackedRun, policy: str, report: dict[str, Any], key: str | None,
                  report_key: str) -> dict[str, str]:
    """What a version says about itself: its run, policy, evaluation and where its weights are."""
    ctx = t.ctx
    tags = {"swerl.run_id": ctx.run_id, "swerl.policy": policy, "swerl.preset": ctx.cfg.preset,
            "swerl.eval_label": report["label"], "swerl.dataset_hash": str(report.get("dataset_hash")),
            "swerl.report": ctx.store.url(report_key), "swerl.report_key": report_key,
            "swerl.pass1": f"{report['pass@1']:.6f}", "swerl.sem": f"{report['sem']:.6f}",
            "swerl.n_tasks": str(report["n_tasks"]), "swerl.n_runs": str(report["n_runs"]),
            "swerl.errors": str(report.get("errors", 0)), "swerl.mlflow_parent_run": t.parent()}
    return tags | ({"swerl.checkpoint_key": key, "swerl.checkpoint": ctx.store.url(key)} if key else
                   {"swerl.base_model": ctx.cfg.rollout.model})


def register_version(t: TrackedRun, policy: str, report: dict[str, Any]) -> str:
    """A version for `policy`, tagged with its evaluation; the same evaluation of the same policy
    registers once (a run resumed with more DAPO iterations has a new "dapo" policy to register).

    The version is a real MLflow model (`tasks.mlflow_models`: the transformers flavor; a
    checkpoint's own store directory, made loadable in place); its tags also name the
    checkpoint in the store (`swerl.checkpoint_key`), which `tasks.model_uri` resolves.
    """
    ctx, name = t.ctx, t.registry.model_name
    label = report["label"]
    done = t.registry.find_versions(name, {"swerl.run_id": ctx.run_id, "swerl.eval_label": label,
                                           "swerl.policy": policy})
    if done:
        log.info("registry: evaluation %s of run %s is already version %s", label, ctx.run_id, done[0].version)
        return str(done[0].version)
    key = _checkpoint_key(t, policy)
    eval_run = t.child(f"eval-{label}")
    report_key = ctx.key("eval", label, "report.json")
    tags = _version_tags(t, policy, report, key, report_key)
    t.tracker.flush(timeout=t.tracker.retry_s)  # a logged (copied) model takes the run's metrics: send them first
    from tasks.mlflow_models import fluent_tracking

    with fluent_tracking(t.tracker.tracking_uri, t.tracker.experiment_id):
        source, model_id = _log_model(t, policy, report, eval_run, tags, key)
        # MLflow links a version to its LoggedModel only through a models:/ source; a checkpoint
        # registered in place names its LoggedModel in a tag instead
        linked = source.startswith("models:/")
        version = t.registry.register_model(source, run_id=eval_run, model_id=model_id if linked else None,
                                            tags=tags if linked else tags | {"swerl.logged_model": model_id})
    log.info("registry: %s -> %s version %s (pass@1 %.3f ± %.3f; MLflow model %s)", policy, name, version,
             report["pass@1"], report["sem"], source)
    return str(version)


def in_place(t: TrackedRun, key: str | None) -> bool:
    """Whether `key`'s checkpoint can be the version's source where it lies: it is in the store,
    and a tracking server does not refuse it (a server takes a local path as a source only
    inside MLflow's own artifact directories)."""
    remote = t.tracker.tracking_uri.startswith(("http://", "https://"))
    return key is not None and not (remote and t.ctx.store.url(key).startswith("file:"))


def _log_model(t: TrackedRun, policy: str, report: dict[str, Any], eval_run: str, tags: dict[str, str],
               key: str | None) -> tuple[str, str]:
    """`policy` as an MLflow transformers model of the evaluation's run: (the version's source,
    its LoggedModel id). A checkpoint in the store gets the model's small files beside its
    weights and is the source itself; otherwise (the base model) MLflow logs a copy."""
    from tasks.mlflow_models import external_logged_model, log_checkpoint_model, write_model_files
    from training.run import model_dir

    ctx = t.ctx
    local = model_dir(ctx, policy)  # the local copy the evaluation loaded: nothing is downloaded
    name = f"swerl-{safe_name(policy)}"
    params = {"policy": policy, "run_id": ctx.run_id, "eval_label": report["label"],
              "pass1": f"{report['pass@1']:.6f}", "sem": f"{report['sem']:.6f}"}
    if not in_place(t, key):
        info = log_checkpoint_model(eval_run, local, name, params, tags)
        return info.model_uri, info.model_id
    out = ctx.work / "mlflow-model" / name
    shutil.rmtree(out, ignore_errors=True)
    for rel in write_model_files(local, out, ctx.store.url(key)):
        ctx.store.put_file(out / rel, f"{key}/{rel}")
    shutil.rmtree(out, ignore_errors=True)
    model = external_logged_model(eval_run, t.tracker.experiment_id, name, params, tags)
    return ctx.store.url(key), model.model_id


# ---------------------------------------------------------------- promote
def stale_champion(t: TrackedRun, version: str) -> str | None:
    """The champion version, when its registered evaluation is on another eval set than
    `version`'s (curation refreshed the set since): the paired test needs it evaluated again.
    Only a champion of this preset: another preset's may be another model family, which this
    run's inference backend cannot load."""
    name = t.registry.model_name
    champion = t.registry.get_version_by_alias(name, CHAMPION)
    if champion is None or champion == str(version):
        return None
    if report_of_version(t, champion).get("dataset_hash") == report_of_version(t, str(version)).get("dataset_hash"):
        return None
    preset = t.registry.get_version_tags(name, champion).get("swerl.preset")
    if preset != t.ctx.cfg.preset:
        log.info("registry: champion v%s is of preset %s, not %s: not evaluated again", champion, preset,
                 t.ctx.cfg.preset)
        return None
    return champion


def champion_label(version: str) -> str:
    """The evaluation label of a champion re-evaluated in this run."""
    return f"champion-v{version}"


def promote_version(t: TrackedRun, version: str, manual: bool = False, note: str = "",
                    champion_report: dict[str, Any] | None = None) -> Decision:
    """Challenger -> champion when significantly better on the same eval set (or forced).

    `champion_report`: the champion evaluated again on the challenger's eval set (see
    `stale_champion`), used instead of its registered evaluation. Deterministic given the two
    reports, so a retry after a crash between tagging and moving the alias reaches the same
    decision. A version that already is the champion is left as it is (its decision stays).
    """
    name = t.registry.model_name
    version = str(version)
    challenger = t.registry.get_version(name, version)  # fails clearly on an unknown version
    champion = t.registry.get_version_by_alias(name, CHAMPION)
    if champion == version:
        decision = Decision(False, "already the champion", manual=manual)
        _log_decision(t, challenger, decision, champion, champion, retag=False)
        return decision
    if champion_report is not None and champion_report.get("label") != champion_label(champion or ""):
        raise ValueError(f"the champion is version {champion}, but the report given for it is "
                         f"{champion_report.get('label')!r} ({champion_report.get('policy')})")
    t.registry.set_alias(name, CHALLENGER, version)
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
    champion_after = version if decision.promote else champion
    _log_decision(t, challenger, decision, champion, champion_after, retag=True)
    if decision.promote:
        t.registry.set_alias(name, CHAMPION, version)
    return decision


def _log_decision(t: TrackedRun, challenger: ModelVersion, decision: Decision, champion_before: str | None,
                  champion_after: str | None, retag: bool) -> None:
    """The decision in the log, as a JSON record in the challenger's MLflow run, and (`retag`)
    as tags on the challenger version."""
    name = t.registry.model_name
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    tags = challenger.tags or {}
    record = {"model": name, "version": str(challenger.version), **decision.to_dict(),
              "champion_before": champion_before, "champion_after": champion_after,
              "alpha": t.ctx.cfg.eval.significance, "decided_at": stamp,
              "policy": tags.get("swerl.policy"), "run_id": tags.get("swerl.run_id")}
    log.info("promotion of %s v%s: %s (%s)", name, challenger.version,
             "PROMOTED" if decision.promote else "not promoted", decision.reason)
    if retag:
        extra = {"swerl.promotion.decided_at": stamp, "swerl.promotion.champion_before": champion_before or ""}
        t.registry.set_version_tags(name, challenger.version, decision.tags() | extra)
    if challenger.run_id:
        t.tracker.log_dict(record, f"promotion/v{challenger.version}-{stamp}-{time.time_ns() % 10**6:06d}.json",
                           run_id=challenger.run_id)


# ---------------------------------------------------------------- Prefect tasks
@task(name="register", **RETRYABLE_TASK)
def register(ref: RunRef, policy: str, report: dict[str, Any]) -> str:
    return register_version(open_run(ref), policy, report)


@task(name="stale-champion", **RETRYABLE_TASK)
def find_stale_champion(ref: RunRef, version: str) -> str | None:
    return stale_champion(open_run(ref), version)


@task(name="promote", **RETRYABLE_TASK)
def promote(ref: RunRef, version: str, manual: bool = False, note: str = "",
            champion_report: dict[str, Any] | None = None) -> dict[str, Any]:
    d = promote_version(open_run(ref), version, manual=manual, note=note, champion_report=champion_report)
    print(f"promotion of version {version}: {'PROMOTED' if d.promote else 'not promoted'}: {d.reason}")
    return {"version": str(version), **d.to_dict()}
