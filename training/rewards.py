"""What an episode is paid: 1 if its patch resolves the task, minus the paper's turn penalty."""

from __future__ import annotations

from typing import Callable

from training.trajectory import Trajectory

RewardFn = Callable[[Trajectory], float]


def turn_penalty(turns: int, l_thr: int, t_max: int) -> float:
    """Zero up to ``l_thr`` turns, then linear down to -1 at the turn limit ``t_max``.

    Long episodes cost rollout time; the penalty steers towards solving in fewer turns without
    touching short episodes.
    """
    if turns <= l_thr:  # at l_thr the line starts at 0 (and l_thr == t_max would divide by 0)
        return 0.0
    return (l_thr - turns) / (t_max - l_thr)


def reward(resolved: bool, turns: int, l_thr: int, t_max: int) -> float:
    """1 plus the turn penalty for a resolved episode; an unresolved one is charged the full
    penalty, as if it had run to the turn limit.

    Why not the penalty at its own length: an episode can end early without a fix (its change
    makes the failing tests pass but breaks others, or the agent submits), and would then be paid
    more than an honest miss that kept trying, as much as a fix at the limit. Only fixed code
    earns more than the floor, and among fixes, the shorter earns more.
    """
    return 1.0 + turn_penalty(turns, l_thr, t_max) if resolved else turn_penalty(t_max, l_thr, t_max)


def resolved_reward(traj: Trajectory) -> float:
    return float(traj.status == "resolved")
