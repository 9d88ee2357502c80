"""Difficulty filtering from stored trajectories, never from memory.

Tasks that are always or never solved give zero-advantage groups (all rewards equal), which DAPO
drops anyway; filtering them before sampling saves the rollouts. Stage 2 of the paper keeps only
tasks solved in fewer than 2/3 of their attempts over the whole training history and at least once.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable

from environments.records import TaskInstance
from training.trajectory import Trajectory


@dataclass
class PassRate:
    attempts: int  # graded attempts; infra errors are not attempts
    solved: int

    @property
    def rate(self) -> float:
        return self.solved / self.attempts if self.attempts else 0.0


def pass_rates(trajectories: Iterable[Trajectory]) -> dict[str, PassRate]:
    stats: dict[str, PassRate] = defaultdict(lambda: PassRate(0, 0))
    for t in trajectories:
        if t.status == "error":
            continue
        s = stats[t.task_id]
        s.attempts += 1
        s.solved += t.status == "resolved"
    return dict(stats)


def filter_band(tasks: list[TaskInstance], rates: dict[str, PassRate], lo: float, hi: float) -> list[TaskInstance]:
    """Keep tasks whose estimated pass rate lies in [lo, hi]; unmeasured tasks are kept only if
    the band admits 0 (we know nothing against them)."""
    kept = []
    for t in tasks:
        r = rates.get(t.instance_id)
        rate = r.rate if r and r.attempts else None
        if rate is None:
            if lo <= 0.0:
                kept.append(t)
        elif lo <= rate <= hi:
            kept.append(t)
    return kept


def stage2_filter(tasks: list[TaskInstance], history: Iterable[Trajectory], solved_share: float | None,
                  drop_never_solved: bool) -> tuple[list[TaskInstance], dict[str, int]]:
    """The paper's stage-2 rule over every stored trajectory of the run so far."""
    rates = pass_rates(history)
    kept, dropped = [], {"mostly_solved": 0, "never_solved": 0}
    for t in tasks:
        r = rates.get(t.instance_id, PassRate(0, 0))
        if solved_share is not None and r.attempts and r.rate >= solved_share:
            dropped["mostly_solved"] += 1
        elif drop_never_solved and r.attempts and r.solved == 0:
            dropped["never_solved"] += 1
        else:
            kept.append(t)
    return kept, dropped
