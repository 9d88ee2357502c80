"""Bring a project's cached synthesis result of an older pipeline version up to the current one,
without searching for mutants again (the expensive part of synthesis: minutes per project).

In one sandbox per project (`restate_project`):
1. one traced run of the suite finds the timing-dependent tests; they leave PASS_TO_PASS and
   FAIL_TO_PASS (a task left with no FAIL_TO_PASS is dropped), and so do ids that run does not
   have (ids a random PYTHONHASHSEED gave: the grader would never find them);
2. each task's bug is applied from its `bug_patch` and its FAIL_TO_PASS tests run once: the
   run is judged like a fresh mutant (all must still fail, not only ImportError-like) and its
   failures become the task's evidence, from which `describe` writes the statements.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from environments.curation.projects import Project
from environments.curation.runner import ProjectRunner, RunnerError
from environments.curation.synth import (
    Interrupted, Progress, ProjectResult, SynthOptions, describe, evidence, evidence_files, judge,
)
from environments.records import TaskInstance
from environments.sandbox import open_sandbox
from swerl.config import EnvironmentConfig

UPGRADABLE = ("2",)  # SYNTH_VERSIONs whose results `restate` can bring up to date


def restate_project(project: Project, saved: ProjectResult, env_image: str, env_cfg: EnvironmentConfig,
                    opts: SynthOptions, progress: Progress = print, stop: threading.Event | None = None
                    ) -> ProjectResult:
    """`saved`'s tasks as the current pipeline would write them (some may be dropped)."""
    stop = stop or threading.Event()
    t0 = time.monotonic()
    with open_sandbox(env_image, env_cfg) as sb:
        runner = ProjectRunner(sb, project.pytest_cmd, list(project.test_paths))
        suite_s = float(saved.stats.get("suite_s") or 60.0)
        trace = runner.trace(None, max(env_cfg.test_timeout_s, 10 * suite_s + 30))
        timing = {t for t, kinds in trace.timing.items() if kinds}
        absent = {t for task in saved.tasks for t in task.FAIL_TO_PASS + task.PASS_TO_PASS
                  if t not in trace.durations}
        progress(f"[{project.key}] restate: {len(timing)} timing-dependent tests, {len(absent)} named "
                 f"tests not found ({time.monotonic() - t0:.0f} s)")
        unusable = timing | absent  # a task may name neither
        reasons: Counter = Counter()
        tasks: list[TaskInstance] = []
        found: dict[str, dict] = {}
        sources: dict[str, str] = {}
        for i, task in enumerate(saved.tasks, 1):
            if stop.is_set():
                raise Interrupted(f"{project.key}: stopped while restating")
            reason, ev = _recheck(runner, task, unusable, suite_s, opts)
            reasons[reason] += 1
            if reason == "ok":
                for path in evidence_files(ev, task.FAIL_TO_PASS) - set(sources):
                    try:
                        sources[path] = runner.read(path)
                    except (FileNotFoundError, UnicodeDecodeError):
                        pass
                found[task.instance_id] = ev
                tasks.append(describe(task, ev, sources))
            else:
                progress(f"[{project.key}] restate: dropped {task.instance_id}: {reason}")
            if i % 10 == 0:
                progress(f"[{project.key}] restate: {i}/{len(saved.tasks)} ({time.monotonic() - t0:.0f} s)")
    stats = {**saved.stats, "kept": len(tasks), "timing_tests": len(timing),
             "kept_by_modifier": dict(Counter(t.meta["modifier"] for t in tasks)),
             "restated": {"from": len(saved.tasks), "reasons": dict(reasons),
                          "seconds": round(time.monotonic() - t0, 1)}}
    progress(f"[{project.key}] restated {len(tasks)} of {len(saved.tasks)} tasks in "
             f"{time.monotonic() - t0:.0f} s")
    return ProjectResult(saved.project, tasks, stats, found, sources)


def _recheck(runner: ProjectRunner, task: TaskInstance, unusable: set[str], suite_s: float,
             opts: SynthOptions) -> tuple[str, dict]:
    """("ok", evidence) after narrowing the task's tests, else (why it is dropped, {})."""
    f2p = [t for t in task.FAIL_TO_PASS if t not in unusable]
    if not f2p:
        return "no_usable_fail_to_pass", {}  # all timing-dependent or not found
    try:
        new = runner.patched_sources(task.meta["bug_patch"])
        run = runner.try_mutant(new, f2p, max(20.0, 3 * suite_s + 10), verbose=True)
    except RunnerError as e:
        return f"runner_error: {str(e)[:200]}", {}
    if run.gold_patch.strip() != task.patch.strip():
        return "patch_mismatch", {}
    suite = len(task.FAIL_TO_PASS) + len(task.PASS_TO_PASS)
    reason, failing = judge(run, f2p, suite, opts)
    if reason != "ok":
        return reason, {}
    if failing != set(f2p):
        return "flaky", {}
    task.FAIL_TO_PASS = f2p
    task.PASS_TO_PASS = [t for t in task.PASS_TO_PASS if t not in unusable]
    task.meta["validation"] = {**task.meta.get("validation", {}), "suite_size": len(f2p) + len(task.PASS_TO_PASS)}
    return "ok", evidence(run, f2p)
