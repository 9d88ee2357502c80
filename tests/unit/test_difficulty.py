import pytest

from environments.records import TaskInstance
from training.difficulty import filter_band, pass_rates, stage2_filter
from training.trajectory import Trajectory

pytestmark = pytest.mark.unit


def _task(i: str) -> TaskInstance:
    return TaskInstance(i, "r", "c", "p", "", "", [], [])


def _traj(task: str, idx: int, status: str) -> Trajectory:
    return Trajectory(task, idx, "v0", [], status=status)


def test_pass_rates_ignore_infra_errors():
    rates = pass_rates([_traj("a", 0, "resolved"), _traj("a", 1, "unresolved"), _traj("a", 2, "error")])
    assert (rates["a"].attempts, rates["a"].solved, rates["a"].rate) == (2, 1, 0.5)


def test_band_filter():
    tasks = [_task(x) for x in "abcd"]
    hist = [_traj("a", 0, "resolved"), _traj("a", 1, "resolved"),
            _traj("b", 0, "resolved"), _traj("b", 1, "unresolved"),
            _traj("c", 0, "unresolved"), _traj("c", 1, "unresolved")]
    rates = pass_rates(hist)
    assert [t.instance_id for t in filter_band(tasks, rates, 0.1, 0.9)] == ["b"]
    # d was never measured: kept only when the band admits a zero pass rate
    assert [t.instance_id for t in filter_band(tasks, rates, 0.0, 0.6)] == ["b", "c", "d"]


def test_stage2_rule_uses_history():
    tasks = [_task(x) for x in "abc"]
    hist = ([_traj("a", i, "resolved") for i in range(2)] + [_traj("a", 2, "unresolved")]  # 2/3 solved
            + [_traj("b", 0, "resolved"), _traj("b", 1, "unresolved"), _traj("b", 2, "unresolved")]
            + [_traj("c", i, "unresolved") for i in range(3)])
    kept, dropped = stage2_filter(tasks, hist, solved_share=2 / 3, drop_never_solved=True)
    assert [t.instance_id for t in kept] == ["b"]
    assert dropped == {"mostly_solved": 1, "never_solved": 1}
