import math

import pytest

from environments.records import TaskInstance
from training.evaluation import mean_sem, paired_permutation_test, pass_at_k, predictions, summarize
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
    assert s.per_run == [0.5, 0.5] and s.pass1 == 0.5 and s.sem == 0.0
    assert s.errors == 1
    assert s.per_task == {"a1": 0.5, "b1": 1.0}
    assert s.by_project == {"pa": 0.5, "pb": 1.0}
    assert s.pass_k[1] == pytest.approx(0.75)  # b1 has one graded sample: excluded from pass@2
    assert s.pass_k[2] == pytest.approx(1.0)
    assert [p["instance_id"] for p in predictions(trajs, "m", 1)] == ["a1", "b1"]


def test_paired_test_separates_better_from_tied():
    better = {f"t{i}": 0.8 for i in range(12)}
    worse = {f"t{i}": 0.1 for i in range(12)}
    assert paired_permutation_test(better, worse) == pytest.approx(1 / 4096)
    assert paired_permutation_test(worse, worse) == 1.0
    mixed_a = {"t0": 1.0, "t1": 0.0}
    mixed_b = {"t0": 0.0, "t1": 1.0}
    assert paired_permutation_test(mixed_a, mixed_b) == pytest.approx(0.75)
