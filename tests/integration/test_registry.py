"""The model registry end to end: real MLflow (SQLite file), real store (tmp dir), real Prefect flow.

Evaluations are planted in the store exactly where `training.stages.evaluate` leaves them
(episodes under rollouts/eval-{label}/0/, report.json under eval/{label}/), with per-task results
chosen so the paired test has a known answer.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from pathlib import Path

import pytest
from mlflow import MlflowClient

from environments.records import TaskInstance
from swerl.store import open_store
from tasks import registry_tasks as reg
from tasks.run_context import RunRef, open_run
from tests.conftest_model import tiny_model
from training.evaluation import summarize
from training.rollout import TrajectorySink
from training.run import RunContext
from training.trajectory import Trajectory

pytestmark = pytest.mark.integration

N_TASKS, RUNS = 12, 3
MODEL = "swerl-agent"


def _tiny(tmp_path: Path) -> Path:
    """One tiny real model per test (tests.conftest_model.tiny_model)."""
    d = tmp_path / "tiny-model"
    return d if d.is_dir() else tiny_model(d)


@pytest.fixture
def run_env(tmp_path, monkeypatch):
    """Preset + overrides pointing everything at tmp_path (the base model a tiny real one), and
    a fresh run id."""
    monkeypatch.setenv("SWERL_STATE", str(tmp_path / "state"))
    overrides = [f"storage.uri=file://{tmp_path}/store", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
                 "tracking.retry_s=5", "storage.retry_s=5", f"rollout.model={_tiny(tmp_path)}"]
    ref = RunRef(preset="smoke", overrides=overrides, run_id=f"reg-{uuid.uuid4().hex[:8]}")
    yield ref
    t = open_run(ref)
    t.tracker.close(timeout=5)
    assert not t.tracker.dropped, f"tracking data lost: {dict(t.tracker.dropped)}"


def reader(ref: RunRef) -> MlflowClient:
    uri = open_run(ref).tracker.tracking_uri
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def plant_eval(ctx: RunContext, label: str, policy: str, solved: dict[str, int], dataset: str = "evalset-1") -> dict:
    """An evaluation where task i is resolved in `solved[i]` of RUNS runs; returns its report."""
    tasks = [TaskInstance(f"t{i:02d}", "org/proj", "c", "p", "", "", [], [],
                          meta={"project": "even" if i % 2 == 0 else "odd"}) for i in range(N_TASKS)]
    sink = TrajectorySink(ctx.store, ctx.key("rollouts", f"eval-{label}", 0))
    trajs = []
    for task in tasks:
        for r in range(RUNS):
            status = "resolved" if r < solved.get(task.instance_id, 0) else "unresolved"
            traj = Trajectory(task.instance_id, r, policy, [1], status=status, patch="diff --git a/x b/x\n",
                              exit_reason="submitted", meta={"grade": {"tests_status": {}}})
            sink.put(traj)
            trajs.append(traj)
    report = {"label": label, "policy": policy, "run_id": ctx.run_id, "dataset_hash": dataset,
              **summarize(trajs, tasks, RUNS, [1, 2]).to_dict()}
    ctx.store.put_json(ctx.key("eval", label, "report.json"), report)
    return report


def plant_checkpoint(ctx: RunContext, name: str, tmp_path: Path) -> None:
    """A sealed checkpoint `name`: a tiny real HF model (registered versions are MLflow models)."""
    d = tmp_path / "ckpt" / name
    shutil.copytree(_tiny(tmp_path), d)
    metrics = {"reward_mean_all": 0.25, "resolved_rate": 0.5, "format_error_rate": 0.125, "mean_turns": 3.0}
    (d / "swerl.json").write_text(json.dumps({"version": name, "metrics": metrics}))
    ctx.store.put_dir(d, ctx.key("checkpoints", name))


def test_register_promote_and_record_every_decision(run_env, tmp_path, caplog):
    from flows.registry_flows import promote, report
    from swerl.model_cache import resolve_model

    caplog.set_level(logging.INFO, logger="tasks.registry_tasks")
    t = open_run(run_env)
    ctx = t.ctx
    weak = {f"t{i:02d}": 1 for i in range(0, N_TASKS, 3)}  # 4 tasks solved once each
    strong = {f"t{i:02d}": 3 for i in range(N_TASKS)}  # every task, every run
    reports = {"base": plant_eval(ctx, "base", "base", weak),
               "rft": plant_eval(ctx, "rft", "rft-0", strong),
               "dapo": plant_eval(ctx, "dapo", "dapo-s1-0", strong)}  # tied with rft
    plant_checkpoint(ctx, "rft-0", tmp_path)
    plant_checkpoint(ctx, "dapo-s1-0", tmp_path)

    v_base = reg.register_version(t, "base", reports["base"])
    d_base = reg.promote_version(t, v_base)
    v_rft = reg.register_version(t, "rft-0", reports["rft"])
    d_rft = reg.promote_version(t, v_rft)
    v_dapo = reg.register_version(t, "dapo-s1-0", reports["dapo"])
    d_dapo = reg.promote_version(t, v_dapo)

    assert d_base.promote and d_base.reason == "no champion yet"
    assert d_rft.promote and d_rft.p_value < 0.05 and d_rft.paired_tasks == N_TASKS
    assert not d_dapo.promote and d_dapo.p_value == 1.0 and d_dapo.reason.startswith("not better")
    # a resumed pipeline registers the same evaluation again: same version, nothing new
    assert reg.register_version(t, "dapo-s1-0", reports["dapo"]) == v_dapo
    assert reg.promote_version(t, v_rft).reason == "already the champion"

    client = reader(run_env)
    tags = {v: client.get_model_version(MODEL, v).tags for v in (v_base, v_rft, v_dapo)}
    assert [tags[v]["swerl.promotion.decision"] for v in (v_base, v_rft, v_dapo)] == ["promoted", "promoted",
                                                                                    "rejected"]
    assert float(tags[v_rft]["swerl.promotion.p_value"]) == pytest.approx(d_rft.p_value, rel=1e-5)
    assert tags[v_rft]["swerl.promotion.champion_before"] == v_base
    assert tags[v_dapo]["swerl.promotion.manual"] == "false"
    assert tags[v_rft]["swerl.checkpoint_key"] == ctx.key("checkpoints", "rft-0")
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == v_rft
    assert str(client.get_model_version_by_alias(MODEL, "challenger").version) == v_dapo

    # manual override through the Prefect flow, recorded as manual
    result = promote(preset=run_env.preset, overrides=run_env.overrides, run_id=run_env.run_id,
                     manual=True, note="operator test")
    assert result["version"] == v_dapo and result["promoted"] and result["manual"]
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == v_dapo
    dapo_tags = client.get_model_version(MODEL, v_dapo).tags
    assert dapo_tags["swerl.promotion.manual"] == "true" and dapo_tags["swerl.promotion.decision"] == "promoted"
    assert dapo_tags["swerl.promotion.reason"].startswith("manual override")
    assert "[operator test]" in dapo_tags["swerl.promotion.reason"]

    # every decision is in the log and in its version's MLflow run
    decided = [r.getMessage() for r in caplog.records
               if r.name == "tasks.registry_tasks" and r.getMessage().startswith("promotion of")]
    assert len(decided) == 5
    records = []
    for v in (v_base, v_rft, v_dapo):
        mv = client.get_model_version(MODEL, v)
        for f in client.list_artifacts(mv.run_id, "promotion"):
            records.append(json.loads(Path(client.download_artifacts(mv.run_id, f.path, str(tmp_path))).read_text()))
    assert sorted((r["version"], r["promoted"], r["manual"]) for r in records) == sorted(
        [(v_base, True, False), (v_rft, True, False), (v_rft, False, False), (v_dapo, False, False),
         (v_dapo, True, True)])

    # the base version resolves to the model it was evaluated with
    assert resolve_model(f"models:/{MODEL}/{v_base}") == resolve_model(ctx.cfg.rollout.model)

    # the run's report, rebuilt from the store
    md, warning = report(run_env.run_id, run_env.preset, run_env.overrides)
    assert warning == ""
    text = md.read_text()
    for label, r in reports.items():
        assert f"| {label} | {r['policy']} | {r['pass@1']:.3f} | {r['sem']:.3f} |" in text
    assert f"| {v_dapo} | dapo-s1-0 | dapo | promoted |" in text
    assert "| 1 | 0.25 | 0.5 | 0.125 | 3 | - |" in text  # the DAPO iteration from dapo-s1-0's swerl.json
    store = open_store(ctx.cfg.storage)
    for name in ("report.json", "report.md", "pass1.png", "projects.png", "iterations.png"):
        assert store.exists(ctx.key("report", name))
    for label in reports:
        for name in ("report.md", "pass1.png", "projects.png", "report-run0.json", f"report-run{RUNS - 1}.json"):
            assert store.exists(ctx.key("eval", label, name)), (label, name)
    sb = store.get_json(ctx.key("eval", "base", "report-run0.json"))
    assert sb["resolved_ids"] == sorted(weak) and sb["total_instances"] == N_TASKS
    parent = t.parent()
    assert {f.path for f in client.list_artifacts(parent, "report")} >= {"report/report.md", "report/pass1.png"}
    assert {f.path for f in client.list_artifacts(t.child("eval-rft"), "eval/rft")} >= {"eval/rft/report.md"}

    # resumed with more DAPO iterations: "dapo" now names another policy, a version of its own
    plant_checkpoint(ctx, "dapo-s1-1", tmp_path)
    v_dapo2 = reg.register_version(t, "dapo-s1-1", plant_eval(ctx, "dapo", "dapo-s1-1", strong))
    assert int(v_dapo2) > int(v_dapo)
    assert reader(run_env).get_model_version(MODEL, v_dapo2).tags["swerl.policy"] == "dapo-s1-1"


def test_a_champion_from_another_eval_set_is_compared_on_its_new_evaluation(run_env, tmp_path):
    t = open_run(run_env)
    ctx = t.ctx
    weak = {f"t{i:02d}": 1 for i in range(0, N_TASKS, 3)}
    strong = {f"t{i:02d}": 3 for i in range(N_TASKS)}
    plant_checkpoint(ctx, "rft-0", tmp_path)
    plant_checkpoint(ctx, "dapo-s1-0", tmp_path)
    v_old = reg.register_version(t, "rft-0", plant_eval(ctx, "rft", "rft-0", strong, dataset="evalset-1"))
    assert reg.promote_version(t, v_old).promote
    v_new = reg.register_version(t, "dapo-s1-0", plant_eval(ctx, "dapo", "dapo-s1-0", strong, dataset="evalset-2"))
    assert reg.stale_champion(t, v_new) == v_old
    assert reg.stale_champion(t, v_old) is None  # the champion itself
    t.registry.set_version_tags(MODEL, v_old, {"swerl.preset": "gpu-7b"})  # maybe a model we cannot load
    assert reg.stale_champion(t, v_new) is None
    t.registry.set_version_tags(MODEL, v_old, {"swerl.preset": ctx.cfg.preset})

    wrong = plant_eval(ctx, "base", "base", weak, dataset="evalset-2")
    with pytest.raises(ValueError, match=f"the champion is version {v_old}"):
        reg.promote_version(t, v_new, champion_report=wrong)
    again = plant_eval(ctx, reg.champion_label(v_old), f"models:/{MODEL}/{v_old}", weak, dataset="evalset-2")
    d = reg.promote_version(t, v_new, champion_report=again)
    assert d.promote and d.paired_tasks == N_TASKS and d.p_value < 0.05
    assert f"champion v{v_old} re-evaluated on this eval set" in d.reason
    assert str(reader(run_env).get_model_version_by_alias(MODEL, "champion").version) == v_new
    assert reg.stale_champion(t, v_new) is None


def test_champion_uri_loads_into_hf_backend_and_generates(run_env, tmp_path):
    from swerl.model_cache import ensure_default_model, resolve_model
    from tasks import model_uri
    from training.checkpoint import COMPLETE, save_checkpoint
    from training.inference.base import SamplingParams
    from training.inference.hf import HFBackend
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    # a tiny model with SmolLM2's tokenizer and architecture: loads and generates in a second
    default = ensure_default_model(progress=lambda msg: None)
    config = AutoConfig.from_pretrained(default)
    config.update({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16})
    model = AutoModelForCausalLM.from_config(config)
    tok = AutoTokenizer.from_pretrained(default)
    local = save_checkpoint(model, tok, tmp_path / "rft-0", {"stage": "rft", "iteration": 0, "version": "rft-0"})
    # training.checkpoint seals with `_COMPLETE`, a name put_dir reserves for its own marker:
    # publish a copy without it (what stages.publish_checkpoint needs until the names differ)
    upload = tmp_path / "upload"
    shutil.copytree(local, upload, ignore=shutil.ignore_patterns(COMPLETE))

    t = open_run(run_env)
    ctx = t.ctx
    ctx.store.put_dir(upload, ctx.key("checkpoints", "rft-0"))
    report = plant_eval(ctx, "rft", "rft-0", {"t00": 2})
    version = reg.register_version(t, "rft-0", report)
    assert reg.promote_version(t, version).promote

    model_uri.install(ctx.cfg)
    path = resolve_model(f"models:/{MODEL}@champion")
    assert Path(path).is_dir() and Path(path) != local
    assert resolve_model(f"models:/{MODEL}@champion") == path  # cached: no second download
    assert resolve_model(f"models:/{MODEL}/{version}") == path

    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    prompt = [int(x) for x in (prompt["input_ids"] if hasattr(prompt, "keys") else prompt)]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    from_registry = HFBackend(path, seed=0)
    original = HFBackend(str(local), seed=0)
    try:
        out = from_registry.generate([prompt], greedy)[0]
        assert len(out.token_ids) >= 1 and len(out.logprobs) == len(out.token_ids)
        assert out.token_ids == original.generate([prompt], greedy)[0].token_ids
        assert from_registry.policy_version == "rft-0"
    finally:
        from_registry.close()
        original.close()

    with pytest.raises(Exception, match="no version of 'swerl-agent' has the alias 'nobody'"):
        resolve_model(f"models:/{MODEL}@nobody")


@pytest.mark.slow
def test_registration_is_accepted_by_an_mlflow_server(tmp_path, monkeypatch):
    """An MLflow server refuses local paths as version sources; a file:// store and the base
    model must still register, and the champion must still resolve."""
    from swerl.model_cache import resolve_model
    from tasks import model_uri
    from tests.mlflow_server import mlflow_server

    monkeypatch.setenv("SWERL_STATE", str(tmp_path / "state"))
    with mlflow_server(tmp_path / "mlflow") as srv:
        ref = RunRef(preset="smoke", run_id=f"reg-{uuid.uuid4().hex[:8]}",
                     overrides=[f"storage.uri=file://{tmp_path}/store", f"tracking.uri={srv.url}",
                                "tracking.retry_s=5", "storage.retry_s=5", f"rollout.model={_tiny(tmp_path)}"])
        t = open_run(ref)
        ctx = t.ctx
        plant_checkpoint(ctx, "rft-0", tmp_path)
        v_base = reg.register_version(t, "base", plant_eval(ctx, "base", "base", {}))
        strong = {f"t{i:02d}": 3 for i in range(N_TASKS)}
        v_rft = reg.register_version(t, "rft-0", plant_eval(ctx, "rft", "rft-0", strong))
        assert reg.promote_version(t, v_base).promote and reg.promote_version(t, v_rft).promote
        model_uri.install(ctx.cfg)
        path = Path(resolve_model(f"models:/{MODEL}@champion"))
        assert json.loads((path / "swerl.json").read_text())["version"] == "rft-0"
        t.tracker.close(timeout=5)
        assert not t.tracker.dropped


FRESH_PROCESS = """
import sys, mlflow, mlflow.transformers
mlflow.set_tracking_uri(sys.argv[1])
pipe = mlflow.transformers.load_model("models:/swerl-agent@champion")
out = pipe([{"role": "user", "content": "hi"}], max_new_tokens=6, do_sample=False)
print("GENERATED", repr(out[0]["generated_text"][-1]["content"]))
ours = sorted(m for m in sys.modules if m.split(".")[0] in ("swerl", "tasks", "training", "environments", "flows"))
print("SWERL_MODULES", ours)
"""


def test_champion_is_an_mlflow_model_a_fresh_process_loads(run_env, tmp_path):
    """`mlflow.transformers.load_model("models:/swerl-agent@champion")` in a process that imports
    only mlflow (and transformers through it), from a directory outside the checkout."""
    import subprocess
    import sys

    t = open_run(run_env)
    plant_checkpoint(t.ctx, "rft-0", tmp_path)
    version = reg.register_version(t, "rft-0", plant_eval(t.ctx, "rft", "rft-0", {"t00": 2}))
    assert reg.promote_version(t, version).promote
    client = reader(run_env)
    mv = client.get_model_version(MODEL, version)
    key = t.ctx.key("checkpoints", "rft-0")
    assert mv.source == t.ctx.store.url(key), "the version is the store's checkpoint itself"
    logged = client.get_logged_model(mv.tags["swerl.logged_model"])
    assert logged.source_run_id == mv.run_id and logged.params["policy"] == "rft-0"
    assert logged.experiment_id == t.tracker.experiment_id, "in the run's experiment, not Default"
    assert logged.tags["swerl.checkpoint_key"] == key
    assert "transformers" in mlflow_flavors(mv.source, tmp_path)
    weights = [k for k in t.ctx.store.ls("") if k.endswith(".safetensors")]
    assert weights == [f"{key}/model.safetensors"], f"one copy of the weights, the checkpoint's: {weights}"
    assert t.ctx.store.get_dir(key, tmp_path / "resumed").joinpath("model.safetensors").is_file(), \
        "the checkpoint is still swerl's: sealed, its hash unchanged"

    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    assert not {"MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "MLFLOW_EXPERIMENT_ID"} & set(env), "no global left"
    out = subprocess.run([sys.executable, "-c", FRESH_PROCESS, t.tracker.tracking_uri], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    print(out.stdout)
    assert "GENERATED '" in out.stdout and "SWERL_MODULES []" in out.stdout


def mlflow_flavors(location: str, tmp_path: Path) -> set[str]:
    import yaml

    from mlflow.artifacts import download_artifacts

    path = download_artifacts(artifact_uri=f"{location}/MLmodel", dst_path=str(tmp_path / "mlmodel"))
    return set(yaml.safe_load(Path(path).read_text())["flavors"])
