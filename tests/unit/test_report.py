"""Evaluation outputs: SWE-bench-shaped reports per run, Markdown, and plots that are real images."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from environments.records import TaskInstance
from training.evaluation import summarize
from training.report import write_eval_outputs, write_report
from training.trajectory import Trajectory, Turn

pytestmark = pytest.mark.unit

PROJECTS = {"attrs": 0.6, "more-itertools": 0.35, "python-slugify": 0.15, "tomli": 0.05}


def eval_tasks(per_project: int = 5) -> list[TaskInstance]:
    return [TaskInstance(f"{p}-{i}", f"org/{p}", "c0", "fix it", "", "", [], [], meta={"project": p})
            for p in PROJECTS for i in range(per_project)]


def eval_trajectories(tasks: list[TaskInstance], runs: int, skill: float, seed: int,
                      error_ids: tuple[str, ...] = ()) -> list[Trajectory]:
    """Episodes whose success depends on the task's project and the policy's `skill`."""
    rng = random.Random(seed)
    out = []
    for r in range(runs):
        for t in tasks:
            p = min(1.0, PROJECTS[t.meta["project"]] * skill)
            status = "error" if t.instance_id in error_ids else ("resolved" if rng.random() < p else "unresolved")
            turn = Turn([1, 2], [-0.1, -0.2], "ls", "ls", r == 0 and t.instance_id.endswith("-0"), "out", [3])
            tests = {"FAIL_TO_PASS": {"success": ["t1"] if status == "resolved" else [], "failure": []}}
            out.append(Trajectory(t.instance_id, r, "v", [0], turns=[turn], status=status,
                                  patch=f"diff --git a/{t.instance_id}.py\n", num_turns=1,
                                  exit_reason="submitted" if status != "error" else "error",
                                  error_reason="sandbox: container died" if status == "error" else "",
                                  meta={} if status == "error" else {"grade": {"tests_status": tests}}))
    return out


def eval_report(label: str, policy: str, skill: float, seed: int, runs: int = 5,
                error_ids: tuple[str, ...] = ()) -> tuple[dict, list[Trajectory]]:
    tasks = eval_tasks()
    trajs = eval_trajectories(tasks, runs, skill, seed, error_ids)
    summary = summarize(trajs, tasks, runs, [1, 2, 5])
    return {"label": label, "policy": policy, "run_id": "smoke-abc", "dataset_hash": "h1",
            **summary.to_dict()}, trajs


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG header: proves the file is a PNG, not just bytes."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_eval_outputs_are_swebench_shaped_and_complete(tmp_path):
    report, trajs = eval_report("rft", "rft-0", 1.0, seed=1, runs=3, error_ids=("tomli-4",))
    files = write_eval_outputs(tmp_path, report, trajs)
    assert sorted(f.name for f in files) == ["pass1.png", "projects.png", "report-run0.json", "report-run1.json",
                                             "report-run2.json", "report.md", "turns.png"]
    for r in range(3):
        sb = json.loads((tmp_path / f"report-run{r}.json").read_text())
        mine = [t for t in trajs if t.sample_index == r]
        assert sb["total_instances"] == 20 and sb["submitted_instances"] == 20
        assert sb["resolved_ids"] == sorted(t.task_id for t in mine if t.status == "resolved")
        assert sb["error_ids"] == ["tomli-4"] and sb["error_instances"] == 1
        assert sb["resolved_instances"] + sb["unresolved_instances"] + sb["error_instances"] == 20
        # the run's share in our report is resolved / graded
        assert report["per_run"][r] == pytest.approx(sb["resolved_instances"] / 19)
    md = (tmp_path / "report.md").read_text()
    assert f"**Pass@1 {report['pass@1']:.3f} ± {report['sem']:.3f}**" in md
    assert "infra errors 3" in md and "ungraded tasks: tomli-4" in md
    assert "![pass1](pass1.png)" in md
    for png in ("pass1.png", "projects.png"):
        w, h = png_size(tmp_path / png)
        assert w >= 500 and h >= 250


def test_run_report_has_every_eval_and_decision(tmp_path):
    evals = {label: eval_report(label, policy, skill, seed)[0]
             for label, policy, skill, seed in [("base", "base", 0.5, 1), ("rft", "rft-0", 1.0, 2),
                                                ("dapo", "dapo-s1-2", 1.4, 3)]}
    iterations = [{"reward_mean_all": 0.1 * i, "resolved_rate": 0.1 * i, "format_error_rate": 0.3 / i,
                   "mean_turns": 10 - i} for i in range(1, 4)]
    registry = [{"version": "3", "policy": "dapo-s1-2", "label": "dapo", "decision": "promoted",
                 "p_value": "0.0123", "reason": "better"}]
    rep = write_report(tmp_path, "cpu-demo-1turn", "cpu-demo-1turn-1", evals, iterations, {"rft": 10.0, "dapo": 30.0}, registry)
    assert list(rep["eval"]) == ["base", "rft", "dapo"]
    assert rep["eval"]["dapo"]["pass@1"] == evals["dapo"]["pass@1"]
    assert rep["eval"]["rft"]["pass@5"] == evals["rft"]["pass@5"]
    assert rep["wall_time_s"]["total"] == 40.0
    assert json.loads((tmp_path / "report.json").read_text()) == rep
    md = (tmp_path / "report.md").read_text()
    for label, r in evals.items():
        assert f"| {label} | {r['policy']} | {r['pass@1']:.3f} | {r['sem']:.3f} |" in md
    assert "| 3 | dapo-s1-2 | dapo | promoted | 0.0123 | better |" in md
    for png in ("pass1.png", "projects.png", "iterations.png"):
        png_size(tmp_path / png)
        assert f"({png})" in md


def test_publish_eval_rebuilds_from_the_store(tmp_path, monkeypatch):
    from swerl.store import Store
    from training.report import publish_eval
    from training.rollout import TrajectorySink
    from training.run import RunContext

    monkeypatch.setenv("SWERL_STATE", str(tmp_path / "state"))
    ctx = RunContext(cfg=None, store=Store(f"file://{tmp_path}/store"), run_id="r1")
    report, trajs = eval_report("rft", "rft-0", 1.0, seed=4, runs=2)
    report["run_id"] = "r1"
    # written by the evaluation itself, before its report.json
    before = publish_eval(ctx, "rft", trajs, report)
    assert not ctx.store.exists(ctx.key("eval", "rft", "report.json"))
    ctx.store.put_json(ctx.key("eval", "rft", "report.json"), report)
    sink = TrajectorySink(ctx.store, ctx.key("rollouts", "eval-rft", 0))
    for t in trajs:
        sink.put(t)
    sink_other = TrajectorySink(ctx.store, ctx.key("rollouts", "eval-rft2", 0))  # a label sharing the prefix
    sink_other.put(Trajectory("attrs-0", 0, "v", [0], status="error"))
    first = {f.name: ctx.store.get_bytes(ctx.key("eval", "rft", f.name)) for f in before}
    # rebuilt later from the store alone: the same SWE-bench reports and Markdown
    after = publish_eval(ctx, "rft")
    assert [f.name for f in after] == [f.name for f in before]
    for name in ("report-run0.json", "report-run1.json", "report.md"):
        assert ctx.store.get_bytes(ctx.key("eval", "rft", name)) == first[name]


def test_eval_text_has_pass_at_k_verdicts_and_every_breakdown():
    from training.report import eval_text

    report, _ = eval_report("base", "base", 1.0, seed=5, runs=2, error_ids=("tomli-4",))
    report["by_modifier"], report["modifier_sizes"] = {"flip_compare": 0.25}, {"flip_compare": 4}
    text = eval_text(report, ks=[1, 2, 5])
    assert f"Pass@1  {report['pass@1']:.3f} ± {report['sem']:.3f}" in text
    assert f"Pass@2  {report['pass@2']:.3f}" in text
    assert "Pass@5  n/a (needs 5 graded runs of a task)" in text  # 2 runs: no unbiased pass@5
    counts = report["statuses"]
    assert f"episodes 40: resolved {counts['resolved']}, unresolved {counts['unresolved']}, error 2" in text
    assert "ungraded tasks: tomli-4" in text
    for project, rate in report["by_project"].items():
        assert any(line.split() == [project, f"{rate:.3f}", str(report["project_sizes"][project])]
                   for line in text.splitlines()), project
    assert "by modifier" in text and "by difficulty" not in text  # these tasks carry no hint level


def test_a_label_evaluated_for_another_policy_is_set_aside_and_evaluated_again(tmp_path, monkeypatch):
    """A finished run resumed with more DAPO iterations has a new final policy: the stored "dapo"
    report (and its episodes) are of the old one and must not be returned for the new one."""
    from swerl.config import load_config
    from swerl.store import Store
    from training import stages
    from training.rollout import RolloutStats, TrajectorySink
    from training.run import RunContext

    monkeypatch.setenv("SWERL_STATE", str(tmp_path / "state"))
    ctx = RunContext(cfg=load_config("smoke", ["eval.runs=1"]), store=Store(f"file://{tmp_path}/store"),
                     run_id="r1")
    ctx.store.put_json(ctx.key("eval", "dapo", "report.json"), {"label": "dapo", "policy": "dapo-s1-2"})
    TrajectorySink(ctx.store, ctx.key("rollouts", "eval-dapo", 0)).put(Trajectory("a-1", 0, "dapo-s1-2", [0]))
    TrajectorySink(ctx.store, ctx.key("rollouts", "eval-dapo2", 0)).put(Trajectory("b-1", 0, "x", [0]))
    seen = []

    def fake_rollouts(ctx_, stage, iteration, tasks, samples, policy, **kw):
        seen.append((stage, policy, ctx_.store.ls(ctx_.key("rollouts", stage))))
        return RolloutStats(trajectories=[Trajectory(t.instance_id, 0, policy, [0], status="resolved") for t in tasks])

    monkeypatch.setattr(stages, "rollouts", fake_rollouts)
    tasks = [TaskInstance("a-1", "r", "c", "p", "", "", [], [])]
    assert stages.evaluate(ctx, "dapo", "dapo-s1-2", tasks)["policy"] == "dapo-s1-2" and not seen  # reused
    report = stages.evaluate(ctx, "dapo", "dapo-s1-4", tasks)
    assert report["policy"] == "dapo-s1-4" and report["pass@1"] == 1.0
    assert seen == [("eval-dapo", "dapo-s1-4", [])]  # none of the old policy's episodes left to reuse
    assert ctx.store.get_json(ctx.key("eval", "dapo@dapo-s1-2", "report.json"))["policy"] == "dapo-s1-2"
    assert len(ctx.store.ls(ctx.key("rollouts", "eval-dapo@dapo-s1-2"))) == 1
    assert len(ctx.store.ls(ctx.key("rollouts", "eval-dapo2"))) == 1  # a label sharing the prefix is untouched
