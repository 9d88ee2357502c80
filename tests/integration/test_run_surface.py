"""Commands pointed at a run use that run's config: `swerl report RUN_ID`, `swerl evaluate --run
RUN_ID` and `swerl promote --run RUN_ID` of a cpu-demo-1turn run, with no --preset.

The run is planted where the pipeline leaves it (config.yaml, evaluations, sealed DAPO
checkpoints) in a tmp store with a SQLite MLflow; the commands are the real CLI in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from swerl.config import dump_config, load_config
from tasks import registry_tasks as reg
from tasks.run_config import config_key
from tasks.run_context import RunRef, open_run
from tests.integration.test_registry import plant_checkpoint, plant_eval

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
REFUSED = ("swerl: run {run} was made with preset 'cpu-demo-1turn', not 'smoke': drop --preset to use the run's own "
           "config (--set changes single values), or drop --run for a new run")


@pytest.fixture
def cpu_demo_run(tmp_path, monkeypatch):
    """A cpu-demo-1turn run (seed 1) with base and dapo evaluations and three of its four DAPO
    checkpoints, its config stored as the pipeline stores it."""
    monkeypatch.setenv("SWERL_STATE", str(tmp_path / "state"))
    where = [f"storage.uri=file://{tmp_path}/store", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
             "tracking.retry_s=5", "storage.retry_s=5"]
    ref = RunRef(preset="cpu-demo-1turn", overrides=[*where, "seed=1"], run_id=f"cpu-demo-1turn-{uuid.uuid4().hex[:8]}")
    t = open_run(ref)
    assert t.remember_config(overwrite=True)
    assert not t.remember_config(overwrite=True), "unchanged: not written twice"
    plant_eval(t.ctx, "base", "base", {"t00": 1})
    for it in range(3):
        plant_checkpoint(t.ctx, f"dapo-s1-{it}", tmp_path)
    dapo = plant_eval(t.ctx, "dapo", "dapo-s1-2", {f"t{i:02d}": 3 for i in range(6)})
    reg.register_version(t, "dapo-s1-2", dapo)
    t.tracker.close(timeout=5)
    return ref, where, tmp_path


def _swerl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_the_stored_config_is_the_runs_and_is_in_mlflow(cpu_demo_run):
    from mlflow import MlflowClient

    ref, where, tmp_path = cpu_demo_run
    t = open_run(ref)
    stored = t.ctx.store.get_text(config_key(ref.run_id))
    assert stored == dump_config(load_config("cpu-demo-1turn", ref.overrides))
    uri = t.tracker.tracking_uri
    logged = MlflowClient(tracking_uri=uri).download_artifacts(t.parent(), "config.yaml", str(tmp_path))
    assert Path(logged).read_text() == stored


def test_report_of_a_cpu_demo_run_uses_its_config(cpu_demo_run):
    ref, where, tmp_path = cpu_demo_run
    out = _swerl("report", ref.run_id, *(a for w in where for a in ("--set", w)), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "warning" not in out.stderr
    md = Path(out.stdout.strip().splitlines()[-1]).read_text()
    assert f"(preset `cpu-demo-1turn`)" in md
    rep = json.loads((Path(out.stdout.strip().splitlines()[-1]).parent / "report.json").read_text())
    # cpu-demo-1turn has 4 DAPO iterations: all 3 planted checkpoints are the run's (smoke's 2 would drop one)
    assert [r["checkpoint"] for r in rep["dapo_iterations"]] == ["dapo-s1-0", "dapo-s1-1", "dapo-s1-2"]
    assert rep["preset"] == "cpu-demo-1turn"

    # an explicit preset that is not the run's is refused in one line; the run's own is fine
    out = _swerl("report", ref.run_id, "--preset", "smoke", *(a for w in where for a in ("--set", w)), cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == REFUSED.format(run=ref.run_id) + "\n"
    out = _swerl("report", ref.run_id, "--preset", "cpu-demo-1turn", *(a for w in where for a in ("--set", w)), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    # ... with a notice of what the run's stored config pins against the preset file (seed 1)
    assert "differs from preset 'cpu-demo-1turn' in 1 value(s): seed: 1 (preset file: 0)" in out.stderr


def test_promote_and_evaluate_read_the_runs_preset(cpu_demo_run):
    ref, where, tmp_path = cpu_demo_run
    sets = [a for w in where for a in ("--set", w)]
    out = _swerl("promote", "--run", ref.run_id, *sets, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    decision = json.loads(out.stdout[out.stdout.index("{"):])
    assert decision["promoted"] and decision["reason"] == "no champion yet"

    # evaluate resolves the run's config before anything runs: a bad --model fails on cpu-demo-1turn's
    # config (its eval set and seed), not smoke's. Checked in process: the whole evaluation of
    # cpu-demo-1turn's 49 tasks is minutes of CPU.
    import argparse

    from flows.cli_runs import _run_config

    args = argparse.Namespace(run_id=ref.run_id, preset=None, set=list(where))
    cfg = _run_config(args)
    assert (cfg.preset, cfg.seed) == ("cpu-demo-1turn", 1) and args.preset is None
    assert cfg.data.eval_dataset == load_config("cpu-demo-1turn").data.eval_dataset
    args = argparse.Namespace(run_id=None, preset=None, set=list(where))
    assert _run_config(args).preset == "smoke" and args.preset == "smoke", "no run: the default preset"


def test_a_run_without_a_stored_config(tmp_path, monkeypatch):
    from swerl.config import ConfigError
    from tasks.run_config import choose_preset

    where = [f"storage.uri=file://{tmp_path}/store"]
    choice = choose_preset("cpu-demo-1turn-0123456789", None, where)
    assert choice.preset == "cpu-demo-1turn" and "has no stored config" in choice.warning
    with pytest.raises(ConfigError, match="run my-run has no stored config .*: pass --preset"):
        choose_preset("my-run", None, where)
    assert choose_preset("my-run", "smoke", where).preset == "smoke"


@pytest.fixture
def fake_evaluation(monkeypatch):
    """`swerl evaluate` in process, with everything real except the episodes: the eval split is
    three task records (no images built) and each rollout call returns one resolved episode per
    task and sample, so the evaluation's report is what the config makes of them (runs, k)."""
    from environments.records import TaskInstance
    from tasks import run_context
    from training import data, stages
    from training.rollout import RolloutStats
    from training.trajectory import Trajectory

    seen: list = []

    def load_split(ctx, split):
        return [TaskInstance(f"t{i}", "acme/x", "HEAD", f"bug {i}", "", "", [], []) for i in range(3)]

    def rollouts(ctx, batch, iteration, tasks, samples, policy, *, spec, sampling):
        seen.append(ctx.cfg)
        return RolloutStats(trajectories=[Trajectory(t.instance_id, i, policy, [], status="resolved", reward=1.0)
                                          for t in tasks for i in range(samples)])

    monkeypatch.setattr(data, "load_split", load_split)
    monkeypatch.setattr(stages, "rollouts", rollouts)
    monkeypatch.setattr(run_context, "_OPEN_RUNS", {})  # the fixture's cached run must not answer for the CLI
    return seen


def test_evaluate_of_a_cpu_demo_run_runs_with_its_config(cpu_demo_run, fake_evaluation, capsys, monkeypatch):
    """`swerl evaluate --run RUN_ID` with no --preset evaluates with cpu-demo-1turn's eval.runs (3)
    and k ([1, 3]), not smoke's (2, [1, 2]); an explicit --preset smoke is refused before anything runs."""
    from prefect.testing.utilities import prefect_test_harness

    from flows.cli import main
    from tasks import run_context

    ref, where, tmp_path = cpu_demo_run
    demo, smoke = load_config("cpu-demo-1turn").eval, load_config("smoke").eval
    assert (demo.runs, demo.k) != (smoke.runs, smoke.k), "the test tells the presets apart by these"
    sets = [a for w in where for a in ("--set", w)]
    with prefect_test_harness(server_startup_timeout=180):
        assert main(["evaluate", "--run", ref.run_id, "--label", "cli", *sets]) == 0
        out = capsys.readouterr()
        assert "warning" not in out.err
        assert [(c.preset, c.seed, c.eval.runs, c.eval.k) for c in fake_evaluation] == [("cpu-demo-1turn", 1, 3, [1, 3])]
        assert f"evaluation `cli` of base (run {ref.run_id}): 3 tasks x 3 runs" in out.out
        assert "Pass@3  1.000" in out.out

        monkeypatch.setattr(run_context, "_OPEN_RUNS", {})
        assert main(["evaluate", "--run", ref.run_id, "--label", "cli-smoke", "--preset", "smoke", *sets]) == 2
        out = capsys.readouterr()
    assert out.err == REFUSED.format(run=ref.run_id) + "\n" and out.out == ""
    assert len(fake_evaluation) == 1, "refused before the evaluation ran"


def test_a_preset_named_with_its_run_says_where_the_stored_config_differs(cpu_demo_run):
    """`--preset P --run R` runs R's stored config; a value pinned there by an earlier --set (here
    seed 1) is named, and a --set that agrees with it leaves nothing to say."""
    from tasks.run_config import choose_preset

    ref, where, _ = cpu_demo_run
    choice = choose_preset(ref.run_id, "cpu-demo-1turn", list(where))
    assert choice.from_run and choice.preset.endswith("config.yaml")
    assert "differs from preset 'cpu-demo-1turn' in 1 value(s): seed: 1 (preset file: 0)" in choice.warning
    assert choose_preset(ref.run_id, "cpu-demo-1turn", [*where, "seed=1"]).warning == ""
    assert choose_preset(ref.run_id, None, list(where)).warning == "", "no preset named: nothing to compare"
