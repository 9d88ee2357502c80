"""Evaluation episodes as MLflow traces, read back from a real MLflow (SQLite) store."""

from __future__ import annotations

import uuid

import pytest
from mlflow import MlflowClient

from tasks.run_context import RunRef, open_run
from tasks.traces import MAX_CHARS, log_evaluation_traces, sample_episodes
from training.rollout import TrajectorySink
from training.trajectory import Trajectory, Turn

pytestmark = pytest.mark.integration


def episode(task: str, sample: int, status: str = "resolved") -> Trajectory:
    turns = [Turn([1, 2, 3], [-0.1] * 3, "```bash\ncat a.py\n```", "cat a.py", False, "def f(): ...", [4],
                  env_time_s=0.05, gen_time_s=0.4),
             Turn([5], [-0.2], "I think", None, True, "no command found" + "x" * (2 * MAX_CHARS), [6],
                  env_time_s=0.0, gen_time_s=0.1),
             Turn([7, 8], [-0.3] * 2, "```bash\nsubmit\n```", "submit", False, "submitted", [9], gen_time_s=0.2)]
    tests = {"FAIL_TO_PASS": {"success": ["t1"] if status == "resolved" else [], "failure": [] if status == "resolved" else ["t1"]}}
    return Trajectory(task, sample, "rft-0", [0], turns=turns, status=status, patch="diff --git a/a.py b/a.py\n",
                      reward=1.0 if status == "resolved" else 0.0, num_turns=3, exit_reason="submitted",
                      timings={"reset_s": 0.3, "grade_s": 1.5, "episode_s": 2.6},
                      meta={"grade": {"tests_status": tests}})


def test_sample_spreads_over_tasks_and_is_stable():
    eps = [episode(f"t{i}", s) for i in range(5) for s in range(4)]
    first = sample_episodes(eps, 6, seed=0)
    assert len(first) == 6 and len({e.task_id for e in first}) == 5
    assert [e.key for e in first] == [e.key for e in sample_episodes(list(reversed(eps)), 6, seed=0)]


def test_each_episode_is_a_trace_with_its_turns_and_grade(tmp_path, monkeypatch):
    monkeypatch.setenv("SWERL_STATE", str(tmp_path / "state"))
    ref = RunRef(preset="smoke", run_id=f"tr-{uuid.uuid4().hex[:8]}",
                 overrides=[f"storage.uri=file://{tmp_path}/store", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"])
    t = open_run(ref)
    sink = TrajectorySink(t.ctx.store, t.ctx.key("rollouts", "eval-rft", 0))
    for i in range(3):
        for s in range(2):
            sink.put(episode(f"task-{i}", s, "resolved" if i == 0 else "unresolved"))
    out = log_evaluation_traces(t, "rft", max_traces=4)
    assert out["traces"] == 4
    print(f"4 traces logged in {out['trace_log_s']:.2f}s")
    assert log_evaluation_traces(t, "rft", max_traces=4)["traces"] == 0, "a resume logs them once"
    assert "MLFLOW_EXPERIMENT_ID" not in __import__("os").environ

    client = MlflowClient(tracking_uri=t.tracker.tracking_uri)
    traces = client.search_traces(locations=[t.tracker.experiment_id], max_results=50)
    assert len(traces) == 4
    run_id = t.child("eval-rft")
    for tr in traces:
        assert tr.info.request_metadata.get("mlflow.sourceRun") == run_id
        assert tr.info.tags["swerl.eval_label"] == "rft" and tr.info.tags["swerl.policy"] == "rft-0"
        names = [s.name for s in tr.data.spans]
        assert names[0].startswith("rft: task-")
        assert names.count("turn 0") == names.count("turn 1") == names.count("turn 2") == 1
        assert {"policy", "tool: cat", "format error", "tool: submit", "grade"} <= set(names)
        spans = {s.name: s for s in tr.data.spans}
        assert spans["tool: cat"].inputs == {"command": "cat a.py"}
        assert spans["tool: cat"].outputs == {"observation": "def f(): ..."}
        assert len(spans["format error"].outputs["observation"]) < MAX_CHARS + 100, "texts are capped"
        grade = spans["grade"].outputs
        assert grade["status"] == tr.info.tags["swerl.status"] and "FAIL_TO_PASS" in grade["tests"]
        root = tr.data.spans[0]
        assert root.end_time_ns - root.start_time_ns == pytest.approx(2.6e9, rel=0.05), "laid out from the timings"
