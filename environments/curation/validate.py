"""Validate tasks the way they will be used: real instance images, graded by `grading.grade`.

A task is valid when, in fresh sandboxes of its instance image,
- the gold patch resolves it (every FAIL_TO_PASS and PASS_TO_PASS test passes),
- the empty patch does not, and every FAIL_TO_PASS test fails before the fix.
An infrastructure problem (image build, sandbox, timeout) is reported as such, never as an
invalid task: a task is only dropped for what it is, not for what happened to the machine.
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Callable

from environments.base_image import ImageBuildError
from environments.grading import grade
from environments.images import ensure_images
from environments.records import GradeResult, TaskInstance
from swerl.config import EnvironmentConfig

Progress = Callable[[str], None]


@dataclass
class TaskCheck:
    instance_id: str
    project: str
    ok: bool
    reason: str = ""  # why not ok ("" when ok)
    infra: bool = False  # the reason is the machine's, not the task's
    gold_status: str = ""
    empty_status: str = ""
    seconds: float = 0.0


@dataclass
class ValidationReport:
    checks: list[TaskCheck] = field(default_factory=list)

    @property
    def ok_ids(self) -> list[str]:
        return [c.instance_id for c in self.checks if c.ok]

    @property
    def failed(self) -> dict[str, str]:
        return {c.instance_id: c.reason for c in self.checks if not c.ok}

    def summary(self) -> dict:
        by_project: dict[str, Counter] = {}
        for c in self.checks:
            by_project.setdefault(c.project, Counter())["ok" if c.ok else "failed"] += 1
        return {
            "total": len(self.checks),
            "ok": len(self.ok_ids),
            "failed": len(self.checks) - len(self.ok_ids),
            "infra_errors": sum(c.infra for c in self.checks),
            "gold_resolved": sum(c.gold_status == "resolved" for c in self.checks),
            "empty_resolved": sum(c.empty_status == "resolved" for c in self.checks),
            "reasons": dict(Counter(c.reason.split(":", 1)[0] for c in self.checks if not c.ok)),
            "by_project": {k: dict(v) for k, v in sorted(by_project.items())},
        }

    def to_dict(self) -> dict:
        return {"summary": self.summary(), "checks": [asdict(c) for c in self.checks]}


def judge_grades(task: TaskInstance, gold: GradeResult, empty: GradeResult) -> tuple[str, bool]:
    """(reason, infra) for a pair of verdicts; reason "" means valid."""
    for name, res in (("gold", gold), ("empty", empty)):
        if res.status == "error":
            return f"{name} patch: grading error: {res.error_reason[:300]}", True
    if not gold.resolved:
        failed = gold.tests_status.get("FAIL_TO_PASS", {}).get("failure", []) + \
            gold.tests_status.get("PASS_TO_PASS", {}).get("failure", [])
        return f"gold patch does not resolve: {len(failed)} tests fail, e.g. {failed[:3]}", False
    if empty.resolved:
        return "empty patch resolves: the bug is not visible to the tests", False
    still_pass = empty.tests_status.get("FAIL_TO_PASS", {}).get("success", [])
    if still_pass:
        return f"FAIL_TO_PASS passes before the fix: {still_pass[:3]}", False
    return "", False


def check_task(task: TaskInstance, env_cfg: EnvironmentConfig, image: str) -> TaskCheck:
    t0 = time.monotonic()
    project = task.project
    if not task.FAIL_TO_PASS:
        return TaskCheck(task.instance_id, project, False, "no FAIL_TO_PASS tests")
    gold = grade(task, task.patch, env_cfg, image)
    empty = grade(task, "", env_cfg, image)
    reason, infra = judge_grades(task, gold, empty)
    return TaskCheck(task.instance_id, project, not reason, reason, infra, gold.status, empty.status,
                     round(time.monotonic() - t0, 1))


def validate_tasks(tasks: list[TaskInstance], env_cfg: EnvironmentConfig, workers: int = 2,
                   progress: Progress = print, images: dict[str, str] | None = None) -> ValidationReport:
    """Build (or reuse) every task's instance image, then grade the gold and the empty patch;
    `workers` tasks at a time, each building its own image first (a task whose image cannot be
    built is reported, not fatal)."""
    images = dict(images or {})
    report = ValidationReport()

    def one(task: TaskInstance) -> TaskCheck:
        image = images.get(task.instance_id) or task.image
        try:
            if not image:
                image = ensure_images([task], progress=lambda s: None, workers=1)[task.instance_id]
            return check_task(task, env_cfg, image)
        except ImageBuildError as e:
            return TaskCheck(task.instance_id, task.project, False, f"image build failed: {str(e)[-300:]}",
                             infra=True)
        except Exception as e:  # one broken task must not hide the verdicts of the others
            return TaskCheck(task.instance_id, task.project, False, f"{type(e).__name__}: {e}", infra=True)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for i, check in enumerate(pool.map(one, tasks), 1):
            report.checks.append(check)
            if not check.ok:
                progress(f"[validate] {check.instance_id}: {check.reason}")
            if i % 20 == 0 or i == len(tasks):
                progress(f"[validate] {i}/{len(tasks)} checked, {len(report.ok_ids)} valid")
    return report
