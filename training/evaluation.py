"""SWE-bench-style scoring of evaluation rollouts, as the paper reports it.

Pass@1 is the mean over n independent runs of the resolved share, with the standard error of
that mean across runs; Pass@k uses the unbiased estimator over each task's n samples. Infra
errors are counted apart and are not failures of the agent.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable

from environments.records import TaskInstance
from training.trajectory import Trajectory


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def mean_sem(xs: list[float]) -> tuple[float, float]:
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
    per_run: list[float]
    per_task: dict[str, float]  # task -> resolve rate over runs
    by_project: dict[str, float]
    by_difficulty: dict[str, float]
    errors: int
    format_error_rate: float
    exit_reasons: dict[str, int]

    def to_dict(self) -> dict:
        return {"pass@1": self.pass1, "sem": self.sem, "n_tasks": self.n_tasks, "n_runs": self.n_runs,
                **{f"pass@{k}": v for k, v in self.pass_k.items()}, "per_run": self.per_run,
                "per_task": self.per_task, "by_project": self.by_project, "by_difficulty": self.by_difficulty,
                "errors": self.errors, "format_error_rate": self.format_error_rate,
                "exit_reasons": self.exit_reasons}


def summarize(trajs: Iterable[Trajectory], tasks: list[TaskInstance], runs: int, ks: list[int]) -> EvalSummary:
    """Score `runs` samples per task. `sample_index` is the run number."""
    trajs = list(trajs)
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by_task[t.task_id].append(t)
    ids = [t.instance_id for t in tasks]
    per_run = []
    for r in range(runs):
        graded = [t for t in trajs if t.sample_index == r and t.status != "error"]
        per_run.append(sum(t.status == "resolved" for t in graded) / max(len(ids), 1))
    pass1, sem = mean_sem(per_run)
    per_task = {}
    pass_k: dict[int, list[float]] = {k: [] for k in ks}
    for tid in ids:
        ts = [t for t in by_task.get(tid, []) if t.status != "error"]
        c = sum(t.status == "resolved" for t in ts)
        per_task[tid] = c / len(ts) if ts else 0.0
        for k in ks:
            if len(ts) >= k:
                pass_k[k].append(pass_at_k(len(ts), c, k))
    def breakdown(key) -> dict[str, float]:
        groups: dict[str, list[float]] = defaultdict(list)
        for task in tasks:
            groups[key(task)].append(per_task[task.instance_id])
        return {g: sum(v) / len(v) for g, v in sorted(groups.items())}
    turns = [turn for t in trajs for turn in t.turns]
    reasons: dict[str, int] = defaultdict(int)
    for t in trajs:
        reasons[t.exit_reason] += 1
    return EvalSummary(
        n_tasks=len(ids), n_runs=runs, pass1=pass1, sem=sem,
        pass_k={k: sum(v) / len(v) for k, v in pass_k.items() if v},
        per_run=per_run, per_task=per_task,
        by_project=breakdown(lambda t: t.project),
        by_difficulty=breakdown(lambda t: str(t.meta.get("difficulty", t.meta.get("hint_level", "n/a")))),
        errors=sum(t.status == "error" for t in trajs),
        format_error_rate=sum(t.format_error for t in turns) / max(len(turns), 1),
        exit_reasons=dict(reasons),
    )


def paired_permutation_test(a: dict[str, float], b: dict[str, float], n_perm: int = 20000, seed: int = 0) -> float:
    """One-sided p-value that `a` beats `b` over the tasks both were evaluated on.

    Per-task resolve rates are paired; under the null each task's difference is equally likely
    to have either sign. Exact enumeration when there are few non-zero differences.
    """
    diffs = [a[t] - b[t] for t in a.keys() & b.keys()]
    diffs = [d for d in diffs if d != 0.0]
    if not diffs:
        return 1.0
    observed = sum(diffs)
    if len(diffs) <= 16:
        hits = total = 0
        for mask in range(1 << len(diffs)):
            s = sum(d if (mask >> i) & 1 else -d for i, d in enumerate(diffs))
            hits += s >= observed - 1e-12
            total += 1
        return hits / total
    rng = random.Random(seed)
    hits = sum(sum(d if rng.random() < 0.5 else -d for d in diffs) >= observed - 1e-12 for _ in range(n_perm))
    return (hits + 1) / (n_perm + 1)


def predictions(trajs: Iterable[Trajectory], model_name: str, run: int) -> list[dict]:
    """SWE-bench's predictions format, one line per task of one run."""
    return [{"instance_id": t.task_id, "model_name_or_path": model_name, "model_patch": t.patch}
            for t in sorted(trajs, key=lambda t: t.task_id) if t.sample_index == run]
