"""Multi-turn bookkeeping: per-turn evaluation numbers, their report table and plot, test-feedback
rendering, the feedback demo, and the refusal of feedback for hidden tests."""

from __future__ import annotations

import json

import pytest

from environments import prompts
from environments.feedback import PASSED_NOTE, check_command, feedback_unavailable, first_failure
from environments.records import TaskInstance
from swerl.config import ConfigError, load_config
from training.evaluation import summarize
from training.report import turn_table, write_eval_outputs, write_report
from training.stages import refuse_unchecked
from training.trajectory import Trajectory, Turn

pytestmark = pytest.mark.unit

LOG = """.F.                                                                      [100%]
=================================== FAILURES ===================================
_________________________________ test_parse[x] ________________________________
tests/test_p.py:9: in test_parse
    assert parse("x") == 2
E   assert 1 == 2
_________________________________ test_other ___________________________________
tests/test_p.py:20: in test_other
    assert False
E   assert False
2 failed, 1 passed in 0.05s
"""


def _task(tid: str = "t1", **kw) -> TaskInstance:
    return TaskInstance(tid, "org/p", "c0", "fix it", "", kw.pop("test_patch", ""), kw.pop("f2p", ["tests/test_p.py::test_a[1 2]"]),
                        [], test_cmd=kw.pop("test_cmd", "python3 -m pytest tests"), **kw)


def _traj(tid: str, run: int, status: str, fmt: list[bool]) -> Trajectory:
    turns = [Turn([1], [-0.1], "x", None if f else "x", f, "obs", []) for f in fmt]
    return Trajectory(tid, run, "v", [0], turns=turns, status=status, num_turns=len(turns))


def test_first_failure_keeps_the_first_traceback_and_the_tally():
    out = first_failure(LOG)
    assert out.splitlines() == ["___ test_parse[x] ___", "tests/test_p.py:9: in test_parse",
                                '    assert parse("x") == 2', "E   assert 1 == 2", "2 failed, 1 passed in 0.05s"]
    crash = first_failure("ImportError while loading conftest\nE   ModuleNotFoundError: No module named 'q'\n")
    assert "ModuleNotFoundError" in crash


def test_the_check_runs_the_failing_tests_by_id_with_the_tasks_interpreter():
    cmd = check_command(_task(), "/testbed", 20)
    assert "python3 -m pytest" in cmd and "'tests/test_p.py::test_a[1 2]'" in cmd and "timeout -k 5 20s" in cmd
    assert "python -m pytest" in check_command(_task(test_cmd="bash run.sh"), "/testbed", 20)


def test_feedback_is_refused_where_it_would_leak_the_grader():
    assert feedback_unavailable(_task()) is None
    assert "hidden" in feedback_unavailable(_task(test_patch="diff --git a/t b/t\n"))
    assert "no failing tests" in feedback_unavailable(_task(f2p=[]))
    with pytest.raises(ConfigError, match="1 of 2 tasks"):
        refuse_unchecked([_task(), _task("t2", test_patch="diff")], "tests")
    refuse_unchecked([_task("t2", test_patch="diff")], "none")  # no feedback: nothing to refuse


def test_summaries_count_resolved_episodes_by_their_last_turn():
    tasks = [_task("a"), _task("b")]
    trajs = [_traj("a", 0, "resolved", [False]), _traj("b", 0, "resolved", [True, False, False]),
             _traj("a", 1, "resolved", [False, False]), _traj("b", 1, "unresolved", [True, True, False]),
             _traj("a", 2, "error", [True])]
    s = summarize(trajs, tasks, runs=2, ks=[1]).to_dict()
    assert s["resolved_by_turn"] == {"1": 1, "2": 1, "3": 1}
    assert s["mean_turns_resolved"] == pytest.approx(2.0)
    # graded episodes only: the infra error's format error is not the agent's
    assert s["format_errors_by_turn"] == {"1": pytest.approx(0.5), "2": pytest.approx(1 / 3), "3": 0.0}
    none = summarize([_traj("a", 0, "unresolved", [False])], tasks, runs=1, ks=[1]).to_dict()
    assert none["resolved_by_turn"] == {} and none["mean_turns_resolved"] is None


def test_reports_carry_the_turn_table_and_plot(tmp_path):
    tasks = [_task("a"), _task("b")]
    evals = {}
    for label, turns in (("base", [1]), ("dapo", [2, 2, 1])):
        trajs = [_traj("a", r, "resolved", [False] * n) for r, n in enumerate(turns)]
        evals[label] = {"label": label, "policy": label, "run_id": "r", **summarize(trajs, tasks, len(turns), [1]).to_dict()}
        files = write_eval_outputs(tmp_path / label, evals[label], trajs)
        assert (tmp_path / label / "turns.png") in files
    rep = write_report(tmp_path / "run", "cpu-demo-multiturn", "r", evals, [], {"eval": 1.0})
    assert rep["eval"]["dapo"]["resolved_by_turn"] == {"1": 1, "2": 2}
    assert rep["eval"]["dapo"]["mean_turns_resolved"] == pytest.approx(5 / 3)
    assert json.loads((tmp_path / "run" / "report.json").read_text())["eval"]["base"]["mean_turns_resolved"] == 1.0
    assert turn_table(evals)[2] == "| base | 1 | 0 | 1.00 |"
    assert "resolved at turn 2" in (tmp_path / "run" / "report.md").read_text()
    assert (tmp_path / "run" / "turns.png").stat().st_size > 1000


def test_the_feedback_demo_shows_a_wrong_try_its_test_output_and_the_right_try():
    msgs = prompts.one_shot_demo("tools+file", "line", show_source=True, line_hint=True, feedback=True)
    assert [m["role"] for m in msgs[:4]] == ["user", "assistant", "user", "assistant"]
    assert "height * height" in msgs[1]["content"] and "width * height" in msgs[3]["content"]
    assert "E   assert 9 == 6" in msgs[2]["content"] and "undone" in msgs[2]["content"]
    assert "submit" not in prompts.system_prompt("tools+file", 100, "line", feedback=True)
    assert PASSED_NOTE not in msgs[2]["content"]


def test_the_multiturn_preset_pays_the_turn_penalty_within_its_turn_limit():
    cfg = load_config("cpu-demo-multiturn")
    assert cfg.rollout.feedback == "tests" and cfg.rollout.max_turns == 3
    assert all(s.l_thr < s.max_turns for s in cfg.dapo.stages)
