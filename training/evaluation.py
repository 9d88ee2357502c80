"""SWE-bench-style scoring of evaluation rollouts, as the paper reports it.

Pass@1 is the mean over n independent runs of each run's resolved share, with the standard error
of that mean across runs; Pass@k uses the unbiased estimator over each task's n samples.

Infra errors (a dead sandbox, a lost verdict) say nothing about the agent, so they are counted
apart and left out of every rate: a run's share is resolved / graded episodes, a task's rate is
over its graded samples, and a task with no graded sample at all is listed as `ungraded` instead
of being scored 0. The error count travels with every summary so a rate over few graded
episodes is visible as such.
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from environments.records import TaskInstance
from training.trajectory import Trajectory


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def mean_sem(xs: list[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (sample std / sqrt(n)); SEM is 0 for one value."""
    if not xs:
        return 0.0, 0.0
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, 0.0
    var = sum((x - m) ** 2 for x in xs) / (len(xs) - 1)
    return m, math.sqrt(var / len(xs))


@dataclass
class EvalSummary:
    n_tasks: int
    n_runs: int
    pass1: float
    sem: float
    pass_k: dict[int, float]
    per_run: list[float]  # resolved / graded, per run that had a graded episode
    per_task: dict[str, float]  # task -> resolve rate over its graded samples
    ungraded: list[str]  # tasks whose every sample was an infra error: no rate at all
    by_project: dict[str, float]
    by_difficulty: dict[str, float]
    by_modifier: dict[str, float]  # synthetic tasks: which kind of injected bug
    project_sizes: dict[str, int]  # graded tasks per group, to read each breakdown against
    difficulty_sizes: dict[str, int]
    modifier_sizes: dict[str, int]
    episodes: int
    errors: int
    statuses: dict[str, int]  # episodes per verdict: resolved / unresolved / error
    empty_patches: int  # episodes that ended with no change at all (graded, never resolved)
    format_error_rate: float
    exit_reasons: dict[str, int]
    # multi-turn: resolved episodes by the turn they ended at ("1", "2", ...), their mean turns
    # (None when nothing was resolved), and the format-error rate of each turn index
    resolved_by_turn: dict[str, int]
    mean_turns_resolved: float | None
    format_errors_by_turn: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("pass1"), d.pop("pass_k")
        return {"pass@1": self.pass1, **{f"pass@{k}": v for k, v in self.pass_k.items() if k != 1}, **d}


def _breakdown(tasks: list[TaskInstance], per_task: Mapping[str, float],
               key: Callable[[TaskInstance], str]) -> tuple[dict[str, float], dict[str, int]]:
    """Mean task rate per group (graded tasks only) and the group sizes."""
    groups: dict[str, list[float]] = defaultdict(list)
    for task in tasks:
        if task.instance_id in per_task:
            groups[key(task)].append(per_task[task.instance_id])
    return ({g: sum(v) / len(v) for g, v in sorted(groups.items())},
            {g: len(v) for g, v in sorted(groups.items())})


def difficulty_of(task: TaskInstance) -> str:
    return str(task.meta.get("difficulty", task.meta.get("hint_level", "n/a")))


def modifier_of(task: TaskInstance) -> str:
    """The mutation that made a synthetic task's bug; imported tasks have none."""
    return str(task.meta.get("modifier", "n/a"))


def turn_breakdown(trajs: list[Trajectory]) -> tuple[dict[str, int], float | None, dict[str, float]]:
    """Resolved episodes per ending turn, their mean turns, and format errors per turn index."""
    ends = [t.num_turns for t in trajs if t.status == "resolved"]
    by_turn = {str(n): c for n, c in sorted(Counter(ends).items())}
    errors: dict[int, list[bool]] = defaultdict(list)
    for t in trajs:
        for i, turn in enumerate(t.turns, start=1):
            errors[i].append(turn.format_error)
    fmt = {str(i): sum(v) / len(v) for i, v in sorted(errors.items())}
    return by_turn, (sum(ends) / len(ends) if ends else None), fmt


def summarize(trajs: Iterable[Trajectory], tasks: list[TaskInstance], runs: int, ks: list[int]) -> EvalSummary:
    """Score `runs` samples per task; `sample_index` is the run number."""
    trajs = list(trajs)
    graded = [t for t in trajs if t.status != "error"]
    per_run = []
    for r in range(runs):
        in_run = [t for t in graded if t.sample_index == r]
        if in_run:
            per_run.append(sum(t.status == "resolved" for t in in_run) / len(in_run))
    pass1, sem = mean_sem(per_run)

    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in graded:
        by_task[t.task_id].append(t)
    per_task: dict[str, float] = {}
    pass_k: dict[int, list[float]] = {k: [] for k in ks}
    for task in tasks:
        ts = by_task.get(task.instance_id, [])
        if not ts:
            continue
        c = sum(t.status == "resolved" for t in ts)
        per_task[task.instance_id] = c / len(ts)
        for k in ks:
            if len(ts) >= k:
                pass_k[k].append(pass_at_k(len(ts), c, k))

    by_project, sizes = _breakdown(tasks, per_task, lambda t: t.project)
    by_difficulty, difficulty_sizes = _breakdown(tasks, per_task, difficulty_of)
    by_modifier, modifier_sizes = _breakdown(tasks, per_task, modifier_of)
    turns = [turn for t in trajs for turn in t.turns]
    reasons: dict[str, int] = defaultdict(int)
    statuses = dict.fromkeys(("resolved", "unresolved", "error"), 0)
    for t in trajs:
        reasons[t.exit_reason] += 1
        statuses[t.status] = statuses.get(t.status, 0) + 1
    by_turn, mean_turns, fmt_by_turn = turn_breakdown(graded)
    return EvalSummary(
        n_tasks=len(tasks), n_runs=runs, pass1=pass1, sem=sem,
        pass_k={k: sum(v) / len(v) for k, v in pass_k.items() if v},
        per_run=per_run, per_task=per_task,
        ungraded=[t.instance_id for t in tasks if t.instance_id not in per_task],
        by_project=by_project, by_difficulty=by_difficulty, by_modifier=by_modifier, project_sizes=sizes,
        difficulty_sizes=difficulty_sizes, modifier_sizes=modifier_sizes,
        episodes=len(trajs), errors=len(trajs) - len(graded), statuses=statuses,
        empty_patches=sum(not (t.patch or "").strip() for t in trajs),
        format_error_rate=sum(t.format_error for t in turns) / max(len(turns), 1),
        exit_reasons=dict(sorted(reasons.items())),
        resolved_by_turn=by_turn, mean_turns_resolved=mean_turns, format_errors_by_turn=fmt_by_turn,
    )


def paired_permutation_test(a: Mapping[str, float], b: Mapping[str, float], n_perm: int = 20000,
                            seed: int = 0) -> float:
    """One-sided p-value that `a` beats `b` over the tasks both were evaluated on.

    Per-task resolve rates are paired; under the null each task's difference is equally likely
    to have either sign. Exact enumeration when there are few non-zero differences, else a
    seeded Monte Carlo estimate (add-one, so never 0).
    """
    diffs = [a[t] - b[t] for t in sorted(a.keys() & b.keys())]
    diffs = [d for d in diffs if d != 0.0]
    if not diffs:
        return 1.0
    observed = sum(diffs) - 1e-12
    if len(diffs) <= 16:
        hits = sum(sum(d if (mask >> i) & 1 else -d for i, d in enumerate(diffs)) >= observed
                   for mask in range(1 << len(diffs)))
        return hits / (1 << len(diffs))
    rng = random.Random(seed)
    hits = sum(sum(d if rng.random() < 0.5 else -d for d in diffs) >= observed for _ in range(n_perm))
    return (hits + 1) / (n_perm + 1)


def predictions(trajs: Iterable[Trajectory], model_name: str, run: int) -> list[dict[str, str]]:
    """SWE-bench's predictions format, one line per task of one run."""
    return [{"instance_id": t.task_id, "model_name_or_path": model_name, "model_patch": t.patch}
            for t in sorted(trajs, key=lambda t: t.task_id) if t.sample_index == run]


def swebench_report(trajs: Iterable[Trajectory], task_ids: Iterable[str], model_name: str,
                    run: int) -> dict[str, Any]:
    """One run's verdicts as SWE-bench's run report (`resolved_ids`, `error_ids`, ...).

    Built from the verdicts the rollouts already hold instead of grading the predictions again.
    A trajectory does not record whether its patch applied; a verdict that got as far as test
    results is counted as applied.
    """
    from environments.grading import run_report
    from environments.records import GradeResult

    mine = [t for t in trajs if t.sample_index == run]
    results = []
    for t in mine:
        tests_status = (t.meta.get("grade") or {}).get("tests_status") or {}
        results.append(GradeResult(t.task_id, t.status, t.status == "resolved", bool(tests_status),
                                   tests_status=tests_status, error_reason=t.error_reason,
                                   duration_s=t.timings.get("grade_s", 0.0)))
    # run_report reads only the ids of its task mapping
    report = run_report(dict.fromkeys(task_ids), predictions(mine, model_name, run), results)  # type: ignore[arg-type]
    return {**report, "run": run}
