import json
import math

import pytest

from environments.records import TaskInstance
from training.evaluation import (mean_sem, paired_permutation_test, pass_at_k, predictions, summarize,
                                 swebench_report)
from training.trajectory import Trajectory

pytestmark = pytest.mark.unit


def test_pass_at_k_by_hand():
    assert pass_at_k(10, 0, 1) == 0.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    # 1 - C(2,2)/C(4,2) = 1 - 1/6
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)
    assert pass_at_k(4, 3, 2) == 1.0


def test_mean_sem_by_hand():
    m, s = mean_sem([0.2, 0.4, 0.6])
    assert m == pytest.approx(0.4)
    assert s == pytest.approx(math.sqrt(0.04 / 3))


def _t(i):
    return TaskInstance(i, "r", "c", "p", "", "", [], [], meta={"project": "p" + i[0]})


def test_summarize_counts_errors_apart():
    tasks = [_t("a1"), _t("b1")]
    trajs = [Trajectory("a1", 0, "v", [], status="resolved"), Trajectory("b1", 0, "v", [], status="error"),
             Trajectory("a1", 1, "v", [], status="unresolved"), Trajectory("b1", 1, "v", [], status="resolved")]
    s = summarize(trajs, tasks, runs=2, ks=[1, 2])
    # run 0 graded only a1 (resolved): the infra error is not a failure of the agent
    assert s.per_run == [1.0, 0.5] and s.pass1 == 0.75 and s.sem == pytest.approx(0.25)
    assert s.errors == 1 and s.episodes == 4
    assert s.per_task == {"a1": 0.5, "b1": 1.0} and s.ungraded == []
    assert s.by_project == {"pa": 0.5, "pb": 1.0} and s.project_sizes == {"pa": 1, "pb": 1}
    assert s.pass_k[1] == pytest.approx(0.75)  # b1 has one graded sample: excluded from pass@2
    assert s.pass_k[2] == pytest.approx(1.0)
    assert [p["instance_id"] for p in predictions(trajs, "m", 1)] == ["a1", "b1"]


def test_a_task_lost_to_errors_is_ungraded_not_zero():
    tasks = [_t("a1"), _t("b1")]
    trajs = [Trajectory("a1", r, "v", [], status="resolved") for r in range(3)]
    trajs += [Trajectory("b1", r, "v", [], status="error") for r in range(3)]
    s = summarize(trajs, tasks, runs=3, ks=[1])
    assert s.per_task == {"a1": 1.0} and s.ungraded == ["b1"]
    assert s.pass1 == 1.0 and s.errors == 3
    assert "pb" not in s.by_project


def test_report_dict_keeps_run_mean_as_pass1():
    """pass@1 in the report is the mean over runs, not the per-task estimator of pass_k[1]."""
    tasks = [_t("a1"), _t("b1"), _t("c1")]
    trajs = [Trajectory("a1", 0, "v", [], status="resolved"), Trajectory("b1", 0, "v", [], status="unresolved"),
             Trajectory("c1", 0, "v", [], status="unresolved"), Trajectory("a1", 1, "v", [], status="resolved"),
             Trajectory("b1", 1, "v", [], status="error"), Trajectory("c1", 1, "v", [], status="error")]
    d = summarize(trajs, tasks, runs=2, ks=[1, 2]).to_dict()
    assert d["pass@1"] == pytest.approx((1 / 3 + 1.0) / 2)
    assert d["pass@2"] == pytest.approx(1.0)  # only a1 has 2 graded samples
    assert d["n_tasks"] == 3 and d["n_runs"] == 2 and "pass1" not in d
    json.dumps(d)  # report.json must serialise


def test_swebench_report_per_run():
    tasks = [_t("a1"), _t("b1"), _t("c1")]
    trajs = [Trajectory("a1", 0, "v", [], status="resolved", patch="diff a"),
             Trajectory("b1", 0, "v", [], status="error", patch="", error_reason="sandbox: died"),
             Trajectory("a1", 1, "v", [], status="unresolved", patch="diff a2")]
    r0 = swebench_report(trajs, [t.instance_id for t in tasks], "m", 0)
    assert r0["resolved_ids"] == ["a1"] and r0["error_ids"] == ["b1"] and r0["empty_patch_ids"] == ["b1"]
    assert r0["incomplete_ids"] == ["c1"] and r0["total_instances"] == 3 and r0["submitted_instances"] == 2
    assert r0["instances"]["b1"]["error_reason"] == "sandbox: died"
    r1 = swebench_report(trajs, [t.instance_id for t in tasks], "m", 1)
    assert r1["resolved_instances"] == 0 and r1["unresolved_ids"] == ["a1"] and r1["run"] == 1


def test_paired_test_separates_better_from_tied():
    better = {f"t{i}": 0.8 for i in range(12)}
    worse = {f"t{i}": 0.1 for i in range(12)}
    assert paired_permutation_test(better, worse) == pytest.approx(1 / 4096)
    assert paired_permutation_test(worse, worse) == 1.0
    mixed_a = {"t0": 1.0, "t1": 0.0}
    mixed_b = {"t0": 0.0, "t1": 1.0}
    assert paired_permutation_test(mixed_a, mixed_b) == pytest.approx(0.75)


def test_paired_test_monte_carlo_agrees_with_exact():
    """Above 16 non-zero differences the test samples; it must land near the exact value."""
    import itertools

    a = {f"t{i}": 0.6 if i % 3 else 0.2 for i in range(17)}
    b = {f"t{i}": 0.4 for i in range(17)}
    diffs = [a[t] - b[t] for t in a]
    observed = sum(diffs) - 1e-12
    exact = sum(sum(s * d for s, d in zip(signs, diffs)) >= observed
                for signs in itertools.product((1, -1), repeat=17)) / 2 ** 17
    assert paired_permutation_test(a, b, n_perm=20000) == pytest.approx(exact, abs=0.01)
    assert paired_permutation_test(b, a) > 0.9


def test_breakdowns_by_modifier_and_hint_level_and_verdict_counts():
    tasks = [TaskInstance(i, "r", "c", "p", "", "", [], [], meta={"project": "p", "modifier": m, "hint_level": h})
             for i, m, h in (("a", "flip_compare", 1), ("b", "flip_compare", 2), ("c", "drop_branch", 2))]
    trajs = [Trajectory("a", 0, "v", [], status="resolved", patch="diff --git a/x b/x\n"),
             Trajectory("b", 0, "v", [], status="unresolved", patch=""),
             Trajectory("c", 0, "v", [], status="error", patch="")]
    s = summarize(trajs, tasks, runs=1, ks=[1])
    # c has no graded sample: it is in no group at all rather than a 0 in drop_branch
    assert s.by_modifier == {"flip_compare": 0.5} and s.modifier_sizes == {"flip_compare": 2}
    assert s.by_difficulty == {"1": 1.0, "2": 0.0} and s.difficulty_sizes == {"1": 1, "2": 1}
    assert s.statuses == {"resolved": 1, "unresolved": 1, "error": 1} and s.empty_patches == 2
