"""Rewards, turn penalty, group advantages and dynamic sampling, by hand."""

import math

import pytest

from training.dapo import dynamic_sampling, group_advantages, samples_from_groups
from training.rewards import reward, turn_penalty
from bench.synthetic import make_trajectory

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("turns,expected", [
    (0, 0.0), (9, 0.0),    # below l_thr: no penalty
    (10, 0.0),             # at l_thr: (10-10)/30 = 0
    (25, -0.5),            # (10-25)/(40-10) = -15/30
    (40, -1.0),            # the turn limit: -1
])
def test_turn_penalty(turns, expected):
    assert turn_penalty(turns, l_thr=10, t_max=40) == pytest.approx(expected)


def test_reward():
    assert reward(True, 5, 10, 40) == 1.0
    assert reward(True, 25, 10, 40) == pytest.approx(0.5)    # 1 - 0.5
    assert reward(True, 40, 10, 40) == pytest.approx(0.0)    # solved at the limit: 1 - 1


@pytest.mark.parametrize("turns", [1, 10, 25, 40])
def test_unresolved_pays_the_floor_at_any_length(turns):
    """Stopping early without a fix must not beat an honest miss that kept trying (seen in
    DAPO: a change that passed the failing tests but broke others ended at turn 2 and got 0
    against the others' -1)."""
    assert reward(False, turns, 10, 40) == pytest.approx(-1.0)
    assert reward(False, 2, 2, 3) == reward(False, 3, 2, 3) == pytest.approx(-1.0)
    assert reward(True, 3, 2, 3) > reward(False, 2, 2, 3)


def test_unresolved_without_a_penalty_range_pays_zero():
    assert reward(False, 1, 1, 1) == 0.0


def test_group_advantages_population_std():
    # mean 0.5, population std 0.5 -> +-1 (sample std 0.577 would give +-0.866)
    assert group_advantages([1.0, 0.0, 0.0, 1.0], 0.0) == pytest.approx([1.0, -1.0, -1.0, 1.0])
    # mean 0.25; var = (0.75^2 + 3 * 0.25^2) / 4 = 0.1875; std = 0.4330127
    # -> 0.75/0.4330127 = 1.7320508 (= sqrt 3), -0.25/0.4330127 = -0.5773503 (= -1/sqrt 3)
    s3 = math.sqrt(3.0)
    assert group_advantages([1.0, 0.0, 0.0, 0.0], 0.0) == pytest.approx([s3, -1 / s3, -1 / s3, -1 / s3])
    # delta adds to the std: rewards 2, 0 -> mean 1, std 1, (+-1)/(1+1) = +-0.5
    assert group_advantages([2.0, 0.0], 1.0) == pytest.approx([0.5, -0.5])


def test_group_advantages_all_equal_are_zero():
    assert group_advantages([0.5, 0.5, 0.5], 1e-6) == [0.0, 0.0, 0.0]


def test_dynamic_sampling_on_rewards():
    groups = [[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.5, 0.5, 0.25]]
    kept, dropped = dynamic_sampling(groups)
    assert kept == [[1.0, 0.0], [0.5, 0.5, 0.25]]
    assert dropped == 2


def test_samples_from_groups_drops_errors_and_flat_groups():
    def traj(status, r, i, task):
        return make_trajectory(prompt=[1, 2], turns=[([3, 4], False, [5])], status=status,
                               reward=r, task_id=task, sample_index=i)

    groups = [
        [traj("resolved", 1.0, 0, "a"), traj("unresolved", 0.0, 1, "a"), traj("error", 0.0, 2, "a")],
        [traj("unresolved", 0.0, 0, "b"), traj("unresolved", 0.0, 1, "b")],   # flat: dropped
        [traj("resolved", 1.0, 0, "c"), traj("error", 0.0, 1, "c")],          # one left: flat
    ]
    samples, stats = samples_from_groups(groups, delta=0.0)
    # group a without its error: rewards 1, 0 -> advantages +1, -1
    assert [s.advantage for s in samples] == pytest.approx([1.0, -1.0])
    assert stats["groups_kept"] == 1 and stats["groups_dropped"] == 2
    assert stats["trajectories_errored"] == 2
    assert stats["reward_mean"] == pytest.approx(2 / 5)  # rewards 1,0,0,0,1 of the 5 non-errors
    assert stats["resolved_share"] == pytest.approx(2 / 5)


def test_a_batch_cap_keeps_the_first_groups_with_a_gradient():
    def group(task, rewards):
        return [make_trajectory(prompt=[1, 2], turns=[([3, 4], False, [5])], status="resolved" if r else "unresolved",
                                reward=r, task_id=task, sample_index=i) for i, r in enumerate(rewards)]

    groups = [group("a", [0.0, 0.0]), group("b", [1.0, 0.0]), group("c", [0.0, 1.0]), group("d", [1.0, 0.0])]
    samples, stats = samples_from_groups(groups, delta=0.0, max_groups=2)
    assert [s.advantage for s in samples] == pytest.approx([1.0, -1.0, -1.0, 1.0])  # b, then c; d set aside
    assert (stats["groups_kept"], stats["groups_dropped"], stats["groups_over_batch"]) == (2, 1, 1)
    assert stats["reward_mean"] == pytest.approx(3 / 8)  # the rollouts' reward: every group counts
    _, uncapped = samples_from_groups(groups, delta=0.0)
    assert (uncapped["groups_kept"], uncapped["groups_over_batch"]) == (3, 0)


def test_l_thr_at_the_turn_limit_penalises_nothing():
    """A one-turn curriculum (max_turns 1) sets l_thr = max_turns: no episode is penalised."""
    from swerl.config import DAPOStage

    assert turn_penalty(1, l_thr=1, t_max=1) == 0.0 and reward(True, 1, 1, 1) == 1.0
    DAPOStage(max_turns=1, l_thr=1)
    with pytest.raises(ValueError, match="must not exceed max_turns"):
        DAPOStage(max_turns=1, l_thr=2)


def test_format_error_turns_get_loss_only_where_pushed_down():
    """A format error is never reinforced, and is pushed down in an episode that lost."""
    def traj(status, r, i):
        return make_trajectory(prompt=[1, 2], turns=[([3, 4], True, [5]), ([6], False, [])], status=status,
                               reward=r, task_id="a", sample_index=i)

    samples, _ = samples_from_groups([[traj("resolved", 1.0, 0), traj("unresolved", -1.0, 1)]], delta=0.0)
    won, lost = samples
    assert won.advantage > 0 and lost.advantage < 0
    #                         p  p  err   o  ok
    assert won.loss_mask == [0, 0, 0, 0, 0, 1]
    assert lost.loss_mask == [0, 0, 1, 1, 0, 1]
