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


def _dynamic_ctx(tmp_path, min_kept: int, cap: int | None, per_iteration: int = 2, extra: int | None = None):
    from swerl.config import load_config
    from swerl.store import Store
    from training.run import RunContext

    sets = [f"dapo.stages=[{{problems_per_iteration: {per_iteration}, group_size: 2, max_turns: 3, l_thr: 3, "
            f"min_groups_kept: {min_kept}, max_problems_per_iteration: {'null' if cap is None else cap}, "
            f"problems_per_extra_draw: {'null' if extra is None else extra}}}]"]
    return RunContext(cfg=load_config("smoke", sets), store=Store(f"file://{tmp_path}/store"), run_id="r")


def _fake_rollouts(solved: dict[str, int], calls: list[list[str]]):
    """Stands in for stages.rollouts: task t's group of 2 has solved[t] resolved episodes."""
    from training.rollout import RolloutStats

    def fake(ctx, stage, iteration, tasks, samples, policy, **kw):
        calls.append([t.instance_id for t in tasks])
        trajs = [_traj(t.instance_id, i, "resolved" if i < solved[t.instance_id] else "unresolved")
                 for t in tasks for i in range(samples)]
        for tr in trajs:
            tr.reward = float(tr.status == "resolved")
        return RolloutStats(episodes=len(trajs), trajectories=trajs)
    return fake


def test_dynamic_sampling_draws_more_problems_until_enough_groups_carry_a_gradient(tmp_path, monkeypatch):
    from training import stages

    pool = [_task(x) for x in "abcdefgh"]
    solved = {"a": 0, "b": 2, "c": 0, "d": 0, "e": 1, "f": 0, "g": 1, "h": 1}  # mixed: e, g, h
    calls: list[list[str]] = []
    monkeypatch.setattr(stages, "rollouts", _fake_rollouts(solved, calls))
    ctx = _dynamic_ctx(tmp_path, min_kept=2, cap=8)
    order = [t.instance_id for t in stages.dapo_problems(ctx, pool, stages.dapo_plan(ctx.cfg)[0], 0)]
    drawn, stats, draws = stages.dapo_rollouts(ctx, stages.dapo_plan(ctx.cfg)[0], 0, pool, "base")
    # draws of 2 in the seeded order, stopping at the first draw that brings the mixed groups to 2
    mixed_after = [sum(solved[x] == 1 for x in order[:n]) for n in range(2, 9, 2)]
    want = next(i for i, m in enumerate(mixed_after) if m >= 2) + 1
    assert draws == want and calls == [order[2 * i: 2 * i + 2] for i in range(want)]
    assert [t.instance_id for t in drawn] == order[: 2 * want]
    assert len(stats.trajectories) == 4 * want and stats.episodes == 4 * want


def test_dynamic_sampling_stops_at_the_cap_and_is_off_by_default(tmp_path, monkeypatch):
    from training import stages

    pool = [_task(x) for x in "abcdef"]
    calls: list[list[str]] = []
    monkeypatch.setattr(stages, "rollouts", _fake_rollouts(dict.fromkeys("abcdef", 0), calls))
    ctx = _dynamic_ctx(tmp_path, 1, 5)
    drawn, _, draws = stages.dapo_rollouts(ctx, stages.dapo_plan(ctx.cfg)[0], 0, pool, "base")
    assert draws == 3 and [len(c) for c in calls] == [2, 2, 1] and len(drawn) == 5  # nothing mixed: up to the cap
    calls.clear()
    ctx = _dynamic_ctx(tmp_path, 0, None)
    drawn, _, draws = stages.dapo_rollouts(ctx, stages.dapo_plan(ctx.cfg)[0], 0, pool, "base")
    assert draws == 1 and len(drawn) == 2


def test_extra_draws_take_their_own_size_after_a_full_first_draw(tmp_path, monkeypatch):
    from training import stages

    pool = [_task(x) for x in "abcdefghij"]
    solved = {"a": 0, "b": 0, "c": 0, "d": 1, "e": 0, "f": 0, "g": 0, "h": 1, "i": 1, "j": 1}
    calls: list[list[str]] = []
    monkeypatch.setattr(stages, "rollouts", _fake_rollouts(solved, calls))
    ctx = _dynamic_ctx(tmp_path, min_kept=3, cap=9, per_iteration=4, extra=2)
    plan = stages.dapo_plan(ctx.cfg)[0]
    order = [t.instance_id for t in stages.dapo_problems(ctx, pool, plan, 0)]
    drawn, _, draws = stages.dapo_rollouts(ctx, plan, 0, pool, "base")
    sizes = [4, 2, 2, 1]  # the first draw is problems_per_iteration, the last one stops at the cap
    ends = [sum(sizes[: k + 1]) for k in range(len(sizes))]
    want = next((k + 1 for k, n in enumerate(ends) if sum(solved[x] for x in order[:n]) >= 3), len(sizes))
    assert draws == want and [len(c) for c in calls] == sizes[:want]
    assert [t.instance_id for t in drawn] == order[: ends[want - 1]]


def test_prompt_groups_follow_the_draw_order_not_the_finish_order():
    from training.stages import prompt_groups

    finished = [_traj("b", 0, "resolved"), _traj("a", 0, "unresolved"), _traj("b", 1, "unresolved"),
                _traj("c", 0, "resolved"), _traj("a", 1, "resolved")]
    assert [g[0].task_id for g in prompt_groups(finished)] == ["b", "a", "c"]
    drawn = [_task("c"), _task("a"), _task("b")]
    assert [[(t.task_id, t.sample_index) for t in g] for g in prompt_groups(finished, drawn)] == [
        [("c", 0)], [("a", 0), ("a", 1)], [("b", 0), ("b", 1)]]


def test_dynamic_sampling_needs_a_cap_at_least_one_draw():
    from swerl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="min_groups_kept needs max_problems_per_iteration"):
        load_config("smoke", ["dapo.stages=[{min_groups_kept: 2, max_turns: 3, l_thr: 3}]"])
    with pytest.raises(ConfigError, match="below problems_per_iteration"):
        load_config("smoke", ["dapo.stages=[{problems_per_iteration: 4, max_problems_per_iteration: 2, "
                              "max_turns: 3, l_thr: 3}]"])
    with pytest.raises(ConfigError, match="max_groups_kept .3. is below min_groups_kept .4."):
        load_config("smoke", ["dapo.stages=[{min_groups_kept: 4, max_groups_kept: 3, max_problems_per_iteration: 16, "
                              "max_turns: 3, l_thr: 3}]"])
    with pytest.raises(ConfigError, match="problems_per_extra_draw needs min_groups_kept"):
        load_config("smoke", ["dapo.stages=[{problems_per_extra_draw: 2, max_problems_per_iteration: 8, "
                              "max_turns: 3, l_thr: 3}]"])


def test_the_stage2_rule_sees_earlier_iterations_only_so_a_resumed_iteration_draws_the_same(tmp_path):
    from training import stages

    ctx = _dynamic_ctx(tmp_path, min_kept=1, cap=4)
    ctx.cfg.dapo.stages[0].filter_solved_share = 1.0
    pool = [_task(x) for x in "abcdef"]

    def store(iteration: int, task: str) -> None:
        for i in range(2):
            ctx.store.put_text(ctx.key("rollouts", f"dapo-s1/{iteration}", f"{task}__{i}.json"),
                               _traj(task, i, "resolved").to_json())

    store(0, "a")  # iteration 0 solved a every time
    before = [t.instance_id for t in stages.dapo_problems(ctx, pool, stages.dapo_plan(ctx.cfg)[0], 1)]
    assert "a" not in before and len(before) == 5
    store(1, "b")  # iteration 1's own episodes, as a resume finds them
    store(2, "c")
    assert [t.instance_id for t in stages.dapo_problems(ctx, pool, stages.dapo_plan(ctx.cfg)[0], 1)] == before
    assert {t.instance_id for t in stages.dapo_problems(ctx, pool, stages.dapo_plan(ctx.cfg)[0], 2)} == set("cdef")


def test_a_reused_dapo_checkpoint_sends_its_metrics_again(tmp_path, monkeypatch):
    """A run killed between sealing a checkpoint and flushing MLflow must not lose the metrics."""
    import json

    from training import stages
    from training.checkpoint import COMPLETE, INFO
    from training.run import publish_checkpoint

    monkeypatch.setenv("SWERL_STATE", str(tmp_path / "state"))
    ctx = _dynamic_ctx(tmp_path, min_kept=1, cap=4)
    local = tmp_path / "ckpt"
    local.mkdir()
    (local / INFO).write_text(json.dumps({"metrics": {"loss": 0.5, "groups_kept": 3.0}}))
    (local / COMPLETE).write_text("")
    publish_checkpoint(ctx, local, "dapo-s1-1")
    sent = []
    ctx.on_missing_metrics = lambda stage, metrics, step: sent.append((stage, metrics, step))
    ctx.on_metrics = lambda *a: pytest.fail("a reused iteration's metrics must go through on_missing_metrics")
    monkeypatch.setattr(stages, "dapo_rollouts", lambda *a, **k: pytest.fail("a sealed iteration reran"))
    name, metrics = stages.dapo_iteration(ctx, stages.dapo_plan(ctx.cfg)[0], 1, [], "dapo-s1-0")
    assert name == "dapo-s1-1" and metrics == {"loss": 0.5, "groups_kept": 3.0}
    assert sent == [("dapo", metrics, 1)]
