"""The whole pipeline on the smoke preset, embedded defaults, real containers and the real model."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("pipeline")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    out = subprocess.run([sys.executable, "-m", "flows.cli", "pipeline", "--preset", "smoke"], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=2400)
    (cwd / "pipeline.log").write_text(out.stdout + out.stderr)
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
    start = out.stdout.index("{\n")
    return cwd, json.loads(out.stdout[start:])


def test_every_stage_left_its_records(smoke_run):
    cwd, result = smoke_run
    run_dir = cwd / ".swerl" / "store" / "runs" / result["run_id"]
    for stage in ("eval-base", "difficulty", "rft", "dapo-s1", "eval-dapo"):
        assert list((run_dir / "rollouts" / stage).rglob("*.json")), f"no trajectories for {stage}"
    for label in ("base", "dapo-s1-0", "dapo"):  # eval.each_dapo_checkpoint: the first iteration's too
        report = json.loads((run_dir / "eval" / label / "report.json").read_text())
        assert report["n_runs"] == 2 and report["n_tasks"] == 2
        assert (run_dir / "eval" / label / "predictions-run0.jsonl").exists()
    assert (run_dir / "checkpoints" / "dapo-s1-0" / "_COMPLETE").exists()
    assert (run_dir / "checkpoints" / "dapo-s1-1" / "_COMPLETE").exists()
    rep = json.loads((run_dir / "report" / "report.json").read_text())
    assert set(rep["eval"]) >= {"base", "dapo-s1-0", "dapo"} and rep["wall_time_s"]["total"] > 0
    assert rep["eval"]["dapo-s1-0"]["policy"] == "dapo-s1-0" and rep["eval"]["dapo"]["policy"] == "dapo-s1-1"
    assert (run_dir / "report" / "pass1.png").stat().st_size > 1000


def test_mlflow_has_parent_children_metrics_inputs_and_a_registered_version(smoke_run):
    from mlflow import MlflowClient

    cwd, result = smoke_run
    uri = f"sqlite:///{cwd / '.swerl' / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    exp = client.get_experiment_by_name("swerl-smoke")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags
               and r.data.tags.get("swerl.run_id") == result["run_id"]]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(parents) == 1
    stages = {r.data.tags.get("swerl.stage") for r in children}
    assert {"eval-base", "difficulty", "dapo", "eval-dapo"} <= stages, stages
    assert parents[0].data.params["rollout.sampling.temperature"] == "1.0"
    assert parents[0].inputs.dataset_inputs, "datasets are logged as inputs"
    dapo = next(r for r in children if r.data.tags.get("swerl.stage") == "dapo")
    assert len(client.get_metric_history(dapo.info.run_id, "groups_dropped")) == 2
    version = client.get_model_version_by_alias("swerl-agent", "champion")
    assert version.tags["swerl.run_id"] == result["run_id"]


def test_a_rerun_resumes_and_redoes_nothing(smoke_run):
    cwd, result = smoke_run
    run_dir = cwd / ".swerl" / "store" / "runs" / result["run_id"]

    def written() -> dict[str, float]:
        files = list((run_dir / "rollouts").rglob("*.json")) + list((run_dir / "checkpoints").rglob("_COMPLETE"))
        return {str(p): p.stat().st_mtime_ns for p in files}

    before = written()
    out = subprocess.run([sys.executable, "-m", "flows.cli", "pipeline", "--preset", "smoke"], cwd=cwd,
                         capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    again = json.loads(out.stdout[out.stdout.index("{\n"):])
    assert again["run_id"] == result["run_id"]
    assert written() == before, "a resumed run rewrote finished episodes or checkpoints"


def test_a_champion_measured_on_another_eval_set_is_measured_again(smoke_run):
    """Curation refreshed the eval set (here: one task instead of two): the next run evaluates the
    champion again on its own set before the paired test, instead of calling them incomparable."""
    from mlflow import MlflowClient

    cwd, result = smoke_run
    uri = f"sqlite:///{cwd / '.swerl' / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    champion = client.get_model_version_by_alias("swerl-agent", "champion")
    assert champion.tags["swerl.run_id"] == result["run_id"]
    sets = ["eval.max_tasks=1", "rft.enabled=false", "dapo.enabled=false", "difficulty.enabled=false"]
    out = subprocess.run([sys.executable, "-m", "flows.cli", "pipeline", "--preset", "smoke", "--fresh",
                          *[a for s in sets for a in ("--set", s)]], cwd=cwd, capture_output=True, text=True,
                         timeout=1200)
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
    second = json.loads(out.stdout[out.stdout.index("{\n"):])
    assert second["run_id"] != result["run_id"]
    run_dir = cwd / ".swerl" / "store" / "runs" / second["run_id"]
    base = json.loads((run_dir / "eval" / "base" / "report.json").read_text())
    again = json.loads((run_dir / "eval" / f"champion-v{champion.version}" / "report.json").read_text())
    assert base["n_tasks"] == again["n_tasks"] == 1 and again["dataset_hash"] == base["dataset_hash"]
    assert again["policy"] == f"models:/swerl-agent/{champion.version}"
    assert again["dataset_hash"] != champion.tags["swerl.dataset_hash"]
    reason = second["promotion"]["reason"]
    assert f"champion v{champion.version} re-evaluated on this eval set" in reason, reason
    assert "not comparable" not in reason, second["promotion"]
