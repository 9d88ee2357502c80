"""The paper's filters on imported tasks (SWE-rebench / SWE-Gym / SWE-bench rows), each with its
reason, counted in the curation report:

- `statement`: the problem statement is not empty;
- `size`: the gold patch touches at most 7 files and changes fewer than 500 lines;
- `validation`: in fresh sandboxes of the task's image the gold patch resolves and the empty
  patch does not (`validate.judge_grades`);
- `deterministic`: FAIL_TO_PASS and PASS_TO_PASS outcomes are the same over reruns;
- `environment`: the failing tests do not fail only by ImportError or another environment
  error (a missing module, a fixture that does not exist): then the task tests the machine.

The first two need no container and run first; a task whose image cannot be had, or whose
grading hits an infra error, is dropped as `image` / `infra`, never counted as a bad task.
A pytest INTERNALERROR is the test run's verdict (unresolved), not an infra error.
"""

from __future__ import annotations

import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from environments.curation.validate import judge_grades
from environments.grading import grade, patch_files
from environments.images import build_images
from environments.records import GradeResult, TaskInstance
from swerl.config import EnvironmentConfig

MAX_FILES = 7
MAX_CHANGED_LINES = 500  # exclusive: fewer than this
FILTERS = ("statement", "size", "image", "infra", "validation", "deterministic", "environment")
ENV_ERRORS = ("ImportError", "ModuleNotFoundError")
_SUMMARY = re.compile(r"^(FAILED|ERROR) (\S+?)(?: - (.*))?$", re.M)
_FIXTURE = re.compile(r"fixture '[^']+' not found")

Progress = Callable[[str], None]


@dataclass
class FilterReport:
    """Kept tasks, and for each filter the tasks it dropped with their reasons."""

    kept: list[TaskInstance] = field(default_factory=list)
    dropped: dict[str, dict[str, str]] = field(default_factory=lambda: {f: {} for f in FILTERS})

    def drop(self, name: str, task: TaskInstance, reason: str) -> None:
        self.dropped[name][task.instance_id] = reason

    def summary(self) -> dict:
        return {"kept": len(self.kept), "dropped": sum(len(v) for v in self.dropped.values()),
                "dropped_by": {k: len(v) for k, v in self.dropped.items()},
                "reasons": {k: v for k, v in self.dropped.items() if v}}


def changed_lines(patch: str) -> int:
    return sum(1 for line in patch.splitlines()
               if line[:1] in "+-" and not line.startswith(("+++ ", "--- ")))


def static_reason(task: TaskInstance) -> tuple[str, str] | None:
    """(filter, reason) when a record fails a filter that needs no container, else None."""
    if not task.problem_statement.strip():
        return "statement", "empty problem statement"
    files, lines = len(patch_files(task.patch)), changed_lines(task.patch)
    if files > MAX_FILES or lines >= MAX_CHANGED_LINES:
        return "size", f"gold patch touches {files} files and changes {lines} lines (limits: {MAX_FILES}, <{MAX_CHANGED_LINES})"
    return None


def environment_only(task: TaskInstance, empty: GradeResult) -> str:
    """Why the FAIL_TO_PASS tests fail only by environment errors before the fix, or ""."""
    failing = set(empty.tests_status.get("FAIL_TO_PASS", {}).get("failure", []))
    if not failing:
        return ""
    causes = {m.group(2): (m.group(3) or "") for m in _SUMMARY.finditer(empty.log) if m.group(2) in failing}
    if len(causes) < len(failing):
        return ""  # some failure has no one-line cause: not provably the environment's
    env = [t for t, why in causes.items() if why.startswith(ENV_ERRORS) or _FIXTURE.search(why)]
    if len(env) == len(failing):
        return f"every FAIL_TO_PASS test fails by an environment error, e.g. {causes[env[0]][:200]}"
    return ""


def _outcomes(res: GradeResult, task: TaskInstance) -> dict[str, str]:
    return {t: res.test_results.get(t, "MISSING") for t in task.FAIL_TO_PASS + task.PASS_TO_PASS}


def judge_task(task: TaskInstance, image: str, env_cfg: EnvironmentConfig, reruns: int) -> tuple[str, str] | None:
    """(filter, reason) for the first container filter the task fails, else None."""
    runs = [(grade(task, task.patch, env_cfg, image), grade(task, "", env_cfg, image)) for _ in range(1 + reruns)]
    for gold, empty in runs:
        reason, infra = judge_grades(task, gold, empty)
        if infra:
            return "infra", reason
    gold, empty = runs[0]
    reason, _ = judge_grades(task, gold, empty)
    if reason:
        return "validation", reason
    for i, (g, e) in enumerate(runs[1:], 2):
        for label, first, again in (("gold", gold, g), ("empty", empty, e)):
            a, b = _outcomes(first, task), _outcomes(again, task)
            flipped = sorted(t for t in a if a[t] != b[t])
            if flipped:
                return "deterministic", f"{label} run {i} differs from run 1 on {len(flipped)} tests, e.g. {flipped[0]}: {a[flipped[0]]} -> {b[flipped[0]]}"
    why = environment_only(task, empty)
    return ("environment", why) if why else None


def filter_tasks(tasks: list[TaskInstance], env_cfg: EnvironmentConfig, reruns: int = 1, workers: int = 2,
                 progress: Progress = print) -> FilterReport:
    """Every filter, cheap ones first; each dropped task is counted under the filter that dropped it."""
    report = FilterReport()
    todo = []
    for t in tasks:
        hit = static_reason(t)
        if hit:
            report.drop(hit[0], t, hit[1])
        else:
            todo.append(t)
    got = build_images(todo, progress, workers=1)
    for iid, why in got.errors.items():
        report.drop("image", next(t for t in todo if t.instance_id == iid), why)
    todo = [t for t in todo if t.instance_id in got.images]

    def one(t: TaskInstance) -> tuple[TaskInstance, tuple[str, str] | None]:
        try:
            return t, judge_task(t, got.images[t.instance_id], env_cfg, reruns)
        except Exception as e:  # one broken task must not hide the verdicts of the others
            return t, ("infra", f"{type(e).__name__}: {e}")

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for t, hit in pool.map(one, todo):
            if hit:
                report.drop(hit[0], t, hit[1])
                progress(f"[filter] {t.instance_id}: dropped by {hit[0]}: {hit[1][:200]}")
            else:
                t.meta = {**t.meta, "image_route": got.routes[t.instance_id],
                          "validation": {"reruns": reruns, "gold": "resolved", "empty": "unresolved"}}
                report.kept.append(t)
    return report


def counts_line(report: FilterReport) -> str:
    c = Counter({k: len(v) for k, v in report.dropped.items()})
    return f"kept {len(report.kept)}; dropped " + ", ".join(f"{k} {c[k]}" for k in FILTERS)
