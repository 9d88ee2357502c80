"""Synthesise validated bug-fix tasks from a real project (SWE-smith style), one project at a time.

Inside ONE long-lived sandbox of the project's environment image: find the tests that pass every
time, trace which project functions each calls, mutate those functions (`mutators`), keep a
mutant only when the tests it breaks fail the same way every time, and write the task: the gold
patch reverts the mutant, statements at every hint level come from the failures (`describe`).
The steps in detail: `ProjectSynth`.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Callable

from environments.curation.mutators import Mutation, apply_mutations, find_mutations, still_parses
from environments.curation.projects import Project
from environments.curation.pytest_output import failure_report, failures_by_test, parse_failures
from environments.curation.runner import (
    Baseline, ProjectRunner, RunnerError, SuiteRun, Trace, baseline, is_test_file,
)
from environments.curation.statements import FailedTest, statements
from environments.records import TaskInstance
from environments.sandbox import open_sandbox
from swerl.config import DataConfig, EnvironmentConfig

Progress = Callable[[str], None]
TRIVIAL_ERRORS = {"ImportError", "ModuleNotFoundError", "AttributeError", "NameError", "UnboundLocalError"}
TRIVIAL_SHARE = 0.8  # this share of trivial failures makes a mutant trivial (`is_trivial`)
OUTSIDE_TESTS = ("<import>", "<between>")
PYTEST_DONE = (0, 1)  # pytest's exit codes for "ran everything" (all passed / some failed)
MAX_RUNNER_ERRORS = 5  # consecutive unreadable runs before the project is given up
MAX_EVIDENCE_TESTS = 10  # failures kept per task to write its statement from
SYNTH_VERSION = "4"  # bump when the pipeline's output for the same inputs changes (4: PYTHONHASHSEED=0)


@dataclass
class SynthOptions:
    """The curation settings that decide a project's tasks (they key the cache)."""

    max_tasks: int = 60
    determinism_runs: int = 3
    max_failing_share: float = 0.5
    max_patch_files: int = 7
    max_patch_lines: int = 500
    hint_level: int = 1
    seed: int = 0
    candidates_per_task: int = 8  # give up on a project after max_tasks * this many tries
    max_per_function: int = 2  # spread tasks over the code instead of one hot function
    full_suite_check: bool = True  # exact F2P/P2P from one full run per kept bug
    bugs_per_task: int = 1  # > 1: each task combines this many bugs in different functions
    time_budget_s: float = 1800.0  # per project

    @classmethod
    def from_config(cls, data: DataConfig, **overrides) -> "SynthOptions":
        """`data.hint_level` is not among them: every level's statement is stored and the run
        picks one when it loads the tasks, so a curriculum change is not a new dataset."""
        fields = dict(max_tasks=data.max_tasks_per_project, determinism_runs=data.determinism_runs,
                      max_failing_share=data.max_failing_share, max_patch_files=data.max_patch_files,
                      max_patch_lines=data.max_patch_lines, seed=data.seed,
                      time_budget_s=data.synth_time_budget_s, full_suite_check=data.full_suite_check)
        return cls(**(fields | overrides))

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ProjectResult:
    project: str  # name==version
    tasks: list[TaskInstance]
    stats: dict = field(default_factory=dict)
    evidence: dict[str, dict] = field(default_factory=dict)  # instance id -> evidence()
    test_sources: dict[str, str] = field(default_factory=dict)  # test file -> source, for statements


def evidence(run: SuiteRun, failing: list[str]) -> dict:
    """What a task's statement is written from: pytest's report of (the first few of) its
    failing tests, and their parameters."""
    shown = failing[:MAX_EVIDENCE_TESTS]
    return {"log": failure_report(run.log, shown), "params": {t: run.params[t] for t in shown if t in run.params}}


def evidence_files(ev: dict, tests: list[str]) -> set[str]:
    """The test files a statement may read: those of the failing tests, and test files their
    tracebacks went through (a mixin class's module, a helper's)."""
    paths = {t.split("::", 1)[0] for t in tests[:MAX_EVIDENCE_TESTS]}
    for failure in parse_failures(ev.get("log", "")).values():
        paths |= {f.path for f in failure.frames if not f.path.startswith(("/", "<")) and is_test_file(f.path)}
    return paths


def describe(task: TaskInstance, ev: dict, test_sources: dict[str, str]) -> TaskInstance:
    """Write the task's statements (every hint level) from its evidence. Pure: a better
    statement writer applies to cached tasks without running their tests again."""
    details = failures_by_test(ev.get("log", ""), task.FAIL_TO_PASS)
    params = ev.get("params", {})
    failed = [FailedTest(t, details.get(t), test_sources.get(t.split("::", 1)[0]), params.get(t, {}), test_sources)
              for t in task.FAIL_TO_PASS]
    seed = int(hashlib.sha256(task.instance_id.encode()).hexdigest()[:8], 16)
    where = [(m["path"], m["function"]) for m in task.meta["mutations"]]
    texts = statements(task.meta["project"], task.version, failed, where, seed=seed)
    task.problem_statement = texts[task.meta["hint_level"]]
    task.meta["statements"] = {str(k): v for k, v in texts.items()}
    task.meta["failure_types"] = sorted({d.exc_type for d in details.values() if d.exc_type})
    return task


# ---------------------------------------------------------------------------- candidates


@dataclass
class Candidate:
    mutations: list[Mutation]
    tests: list[str]  # kept tests that call the mutated function(s)

    @property
    def kind(self) -> str:
        return "+".join(sorted({m.kind for m in self.mutations}))

    @property
    def key(self) -> str:
        return hashlib.sha256("|".join(m.key for m in self.mutations).encode()).hexdigest()[:10]

    @property
    def files(self) -> list[str]:
        return sorted({m.path for m in self.mutations})


def callers_by_function(calls: dict[str, list[tuple[str, int]]], kept: set[str]) -> dict[tuple[str, int], set[str]]:
    """(file, first line) -> kept tests calling it, without functions also called outside tests."""
    outside = {tuple(k) for name in OUTSIDE_TESTS for k in calls.get(name, [])}
    callers: dict[tuple[str, int], set[str]] = defaultdict(set)
    for test, keys in calls.items():
        if test in kept:
            for key in keys:
                if tuple(key) not in outside:
                    callers[tuple(key)].add(test)
    return callers


def combine(singles: list[Candidate], k: int, seed: int) -> list[Candidate]:
    """Multi-bug candidates: `k` single mutations in different functions, preferring different
    files, as many combinations as there are singles (seeded). Their tests are the union."""
    if k <= 1:
        return singles
    rng = random.Random(seed)
    by_fn: dict[tuple[str, int], list[Candidate]] = defaultdict(list)
    for c in singles:
        by_fn[(c.mutations[0].path, c.mutations[0].func_line)].append(c)
    fns = sorted(by_fn)
    if len(fns) < k:
        return []
    out, seen = [], set()
    for _ in range(len(singles)):
        chosen = rng.sample(fns, k)
        for _retry in range(3):  # prefer bugs spread over different files
            if len({path for path, _ in chosen}) == k:
                break
            chosen = rng.sample(fns, k)
        parts = [rng.choice(by_fn[fn]) for fn in chosen]
        combo = Candidate([m for c in parts for m in c.mutations], sorted({t for c in parts for t in c.tests}))
        if combo.key not in seen:
            seen.add(combo.key)
            out.append(combo)
    return out


def order_candidates(cands: list[Candidate], seed: int) -> list[Candidate]:
    """Seeded shuffle, then round-robin over functions: the first N candidates touch N
    different functions before any function gets a second try."""
    rng = random.Random(seed)
    cands = list(cands)
    rng.shuffle(cands)
    seen: Counter = Counter()
    ranked = []
    for c in cands:
        fn = (c.mutations[0].path, c.mutations[0].func_line)
        ranked.append((seen[fn], c))
        seen[fn] += 1
    return [c for _, c in sorted(ranked, key=lambda x: x[0])]


def propose(runner: ProjectRunner, callers: dict[tuple[str, int], set[str]],
            sources: dict[str, str]) -> list[Candidate]:
    """Single-mutation candidates in every traced library function."""
    lines_by_file: dict[str, set[int]] = defaultdict(set)
    for path, line in callers:
        if path.endswith(".py") and not is_test_file(path):
            lines_by_file[path].add(line)
    out = []
    for path, lines in sorted(lines_by_file.items()):
        if path not in sources:
            try:
                sources[path] = runner.read(path)
            except (FileNotFoundError, UnicodeDecodeError):
                continue
        for m in find_mutations(sources[path], path, only_lines=lines):
            tests = callers.get((path, m.func_line))
            if tests:
                out.append(Candidate([m], sorted(tests)))
    return out


# ---------------------------------------------------------------------------- judging a mutant


def judge(run: SuiteRun, tests: list[str], n_kept: int, opts: SynthOptions) -> tuple[str, set[str]]:
    """("ok", failing) or (reject reason, failing) for one run of a mutant."""
    if run.timed_out:
        return "timeout", set()
    if run.exit_code not in PYTEST_DONE:  # interrupted, internal error, crashed interpreter...
        return "runner_crash", set()
    if run.collection_errors:
        return "collection_error", set()
    failing = run.failing(tests)
    if not failing:
        return "no_failure", failing
    if len(failing) > opts.max_failing_share * n_kept:
        return "too_many_failures", failing
    if is_trivial(run, failing):
        return "trivial_error", failing
    return "ok", failing


def is_trivial(run: SuiteRun, failing: set[str]) -> bool:
    """The failures are (nearly all) ImportError-like at their root: a broken name, not a
    wrong behaviour, and the error message says where the fix is. "Nearly": one test that
    asserts on a mock's call must not make a ModuleNotFoundError mutant a behaviour bug.
    Failures whose type cannot be read do not count either way."""
    details = failures_by_test(run.log, sorted(failing))
    causes = [d.cause_type for d in details.values() if d.cause_type]
    return bool(causes) and sum(c in TRIVIAL_ERRORS for c in causes) >= TRIVIAL_SHARE * len(causes)


def patch_size(patch: str) -> tuple[int, int]:
    files = sum(1 for line in patch.splitlines() if line.startswith("diff --git "))
    return files, len(patch.splitlines())


# ---------------------------------------------------------------------------- one project


class Interrupted(RuntimeError):
    """The caller asked synthesis to stop (Ctrl-C / SIGTERM in the main thread)."""


class ProjectSynth:
    """The state of synthesising one project inside its sandbox.

    For one project at a pinned version, inside ONE long-lived sandbox of its environment image:

    1. run the whole suite `determinism_runs` times; only tests that pass every time may be named
       by a task (tests needing the network fail here: the sandbox has none);
    2. run it once more under a profile hook (`trace_plugin`): which project functions each test
       calls. Functions called at import/collection time are left alone (a bug there would change
       every test), the others are mutation targets and their callers are the tests to run. Tests
       the hook saw opening sockets, starting threads or subprocesses, or sleeping are not named
       either: they pass on a quiet machine and can fail on a loaded one, under the gold patch;
    3. propose mutants of those functions (`mutators`) in a seeded order that spreads over
       functions, and for each: apply, clear bytecode, run the calling tests with a timeout,
       revert. Keep it only when some test fails, no more than `max_failing_share` of the suite
       fails, the failures are not (nearly all) ImportError/AttributeError/NameError, nothing fails to
       collect, and the same tests fail in every rerun; then run the whole suite once with the bug
       so FAIL_TO_PASS / PASS_TO_PASS are exact;
    4. write the task: gold patch = the revert diff, `meta["bug_patch"]` = the bug (the instance
       image applies it and resets history), statements at every hint level, and the commit hash
       the instance image will have. The failures the statement is written from are kept as the
       task's evidence (with the test files), so `describe` can rewrite statements later without
       running anything.
    """

    def __init__(self, project: Project, runner: ProjectRunner, opts: SynthOptions, progress: Progress,
                 stop: threading.Event | None = None):
        self.project, self.runner, self.opts, self.progress = project, runner, opts, progress
        self.stop = stop or threading.Event()
        self.sources: dict[str, str] = {}
        self.test_sources: dict[str, str | None] = {}
        self.evidence: dict[str, dict] = {}
        self.reasons: Counter = Counter()
        self.base: Baseline | None = None
        self.trace: Trace | None = None
        self.runner_messages: list[str] = []

    def timeout_for(self, tests: list[str] | None) -> float:
        """A mutant that loops forever must cost seconds, not the whole suite's time: bound the
        run by what these tests took under the tracer (itself slower than a plain run)."""
        full = self.base.duration_s if self.base else 60.0
        if tests is None or self.trace is None:
            return max(20.0, 3 * full + 10)
        return min(max(10.0, 2 * self.trace.run_time(tests) + 5), max(20.0, 3 * full + 10))

    def setup(self, suite_timeout: float) -> dict[tuple[str, int], set[str]]:
        t0 = time.monotonic()
        base = baseline(self.runner, self.opts.determinism_runs, suite_timeout)
        if not base.tests:
            raise RunnerError(f"{self.project.key}: no test passes deterministically; {base.cause}")
        self.trace = self.runner.trace(None, max(suite_timeout, 10 * base.duration_s + 30))
        self.base = base.without_timing(self.trace)
        self.progress(f"[{self.project.key}] baseline: {len(self.base.tests)} deterministic passes, "
                      f"{len(self.base.timing)} timing-dependent, {len(self.base.flaky)} flaky, "
                      f"{len(self.base.failing)} failing ({self.base.duration_s:.1f} s per run)")
        callers = callers_by_function(self.trace.calls, set(self.base.tests))
        self.progress(f"[{self.project.key}] traced {len(callers)} functions called by tests "
                      f"in {time.monotonic() - t0:.0f} s")
        return callers

    def evaluate(self, cand: Candidate) -> tuple[str, SuiteRun | None, set[str]]:
        """Decide one candidate; returns (reason, the full-suite run with the bug, FAIL_TO_PASS)."""
        assert self.base is not None
        by_file: dict[str, list[Mutation]] = defaultdict(list)
        for m in cand.mutations:
            by_file[m.path].append(m)
        new = {}
        for path, ms in by_file.items():
            if not still_parses(self.sources[path], ms):
                return "syntax", None, set()
            new[path] = apply_mutations(self.sources[path], ms)
        n_kept = len(self.base.tests)
        first = self.runner.try_mutant(new, cand.tests, self.timeout_for(cand.tests))
        reason, failing = judge(first, cand.tests, n_kept, self.opts)
        if reason != "ok":
            return reason, None, failing
        files, lines = patch_size(first.gold_patch)
        if files > self.opts.max_patch_files or lines >= self.opts.max_patch_lines or not files:
            return "patch_too_large", None, failing
        # Determinism: N runs in all; with full_suite_check the last one is the whole suite,
        # which also makes FAIL_TO_PASS / PASS_TO_PASS exact.
        final = first
        reruns = max(self.opts.determinism_runs - 1, 1 if self.opts.full_suite_check else 0)
        for i in range(reruns):
            full = self.opts.full_suite_check and i == reruns - 1
            tests = None if full else cand.tests
            final = self.runner.try_mutant(new, tests, self.timeout_for(tests), verbose=i == reruns - 1)
            again, failing2 = judge(final, self.base.tests if full else cand.tests, n_kept, self.opts)
            if again != "ok":
                return ("full_suite_" if full else "rerun_") + again, None, failing2
            if (failing2 & set(cand.tests)) != failing:
                return "flaky", None, failing2
            if full:
                failing = failing2  # may add tests outside the traced callers
        return "ok", final, failing

    def test_source(self, path: str) -> str | None:
        if path not in self.test_sources:
            try:
                self.test_sources[path] = self.runner.read(path)
            except (FileNotFoundError, UnicodeDecodeError):
                self.test_sources[path] = None
        return self.test_sources[path]

    def make_task(self, cand: Candidate, run: SuiteRun, f2p: set[str]) -> TaskInstance:
        assert self.base is not None
        p, opts = self.project, self.opts
        failing = sorted(f2p)
        iid = f"{p.name}__{p.version}__{cand.kind}__{cand.key}"
        self.evidence[iid] = evidence(run, failing)
        for path in evidence_files(self.evidence[iid], failing):
            self.test_source(path)
        spec = p.env_spec()
        task = TaskInstance(
            instance_id=iid,
            repo=f"pypi/{p.name}",
            base_commit=run.head,
            problem_statement="",
            patch=run.gold_patch,
            test_patch="",
            FAIL_TO_PASS=failing,
            PASS_TO_PASS=[t for t in self.base.tests if t not in f2p],
            version=p.version,
            test_cmd=p.test_cmd,
            log_parser="pytest",
            source=f"synth:pypi:{p.key}",
            split=p.split,
            meta={
                "project": p.name,
                "env_spec": spec.to_dict(),
                "bug_patch": run.bug_patch,
                "modifier": cand.kind,
                "mutations": [{"path": m.path, "function": m.function, "line": m.lineno,
                               "kind": m.kind, "description": m.description} for m in cand.mutations],
                "files": cand.files,
                "functions": sorted({m.function for m in cand.mutations}),
                "hint_level": opts.hint_level,
                "validation": {"determinism_runs": opts.determinism_runs,
                               "full_suite_check": opts.full_suite_check,
                               "suite_size": len(self.base.tests)},
            },
        )
        return describe(task, self.evidence[iid], self.sources_of_tests())

    def sources_of_tests(self) -> dict[str, str]:
        return {path: text for path, text in self.test_sources.items() if text is not None}

    def run(self, suite_timeout: float) -> ProjectResult:
        t0 = time.monotonic()
        callers = self.setup(suite_timeout)
        seed = self.opts.seed + int(hashlib.sha256(self.project.key.encode()).hexdigest()[:8], 16)
        cands = order_candidates(combine(propose(self.runner, callers, self.sources), self.opts.bugs_per_task, seed),
                                 seed)
        budget = self.opts.max_tasks * self.opts.candidates_per_task
        tasks: list[TaskInstance] = []
        per_fn: Counter = Counter()
        tried = runner_errors = 0
        kinds_tried: Counter = Counter()
        for cand in cands:
            if len(tasks) >= self.opts.max_tasks or tried >= budget:
                break
            if self.stop.is_set():
                raise Interrupted(f"{self.project.key}: stopped after {tried} candidates")
            if time.monotonic() - t0 > self.opts.time_budget_s:
                self.reasons["time_budget"] += 1
                break
            fn = (cand.mutations[0].path, cand.mutations[0].func_line)
            if per_fn[fn] >= self.opts.max_per_function:
                continue
            tried += 1
            kinds_tried[cand.kind] += 1
            try:
                reason, run, f2p = self.evaluate(cand)
                runner_errors = 0
            except RunnerError as e:  # this mutant's run was unreadable; the project goes on
                reason, run, f2p = "runner_error", None, set()
                runner_errors += 1
                self.runner_messages.append(f"{cand.key}: {str(e)[:800]}")
                self.progress(f"[{self.project.key}] runner error on {cand.key}: {str(e)[:300]}")
                if runner_errors >= MAX_RUNNER_ERRORS:
                    raise
            self.reasons[reason] += 1
            if reason == "ok" and run is not None:
                tasks.append(self.make_task(cand, run, f2p))
                per_fn[fn] += 1
            if tried % 25 == 0:
                self.progress(f"[{self.project.key}] tried {tried}, kept {len(tasks)} "
                              f"({time.monotonic() - t0:.0f} s)")
        stats = {
            "baseline_tests": len(self.base.tests) if self.base else 0,
            "flaky_tests": len(self.base.flaky) if self.base else 0,
            "timing_tests": len(self.base.timing) if self.base else 0,
            "failing_tests": len(self.base.failing) if self.base else 0,
            "suite_s": round(self.base.duration_s, 2) if self.base else 0,
            "functions": len(callers),
            "candidates": len(cands),
            "tried": tried,
            "kept": len(tasks),
            "reasons": dict(self.reasons),
            "tried_by_modifier": dict(kinds_tried),
            "kept_by_modifier": dict(Counter(t.meta["modifier"] for t in tasks)),
            "runner_errors": self.runner_messages[:5],
            "seconds": round(time.monotonic() - t0, 1),
        }
        self.progress(f"[{self.project.key}] kept {len(tasks)} of {tried} tried in {stats['seconds']} s")
        return ProjectResult(self.project.key, tasks, stats, self.evidence, self.sources_of_tests())


def synth_project(project: Project, env_image: str, env_cfg: EnvironmentConfig, opts: SynthOptions,
                  progress: Progress = print, stop: threading.Event | None = None) -> ProjectResult:
    """All of one project's tasks, from its environment image (one sandbox for the whole run);
    setting `stop` makes it raise Interrupted at the next candidate (the sandbox is closed)."""
    with open_sandbox(env_image, env_cfg) as sb:
        runner = ProjectRunner(sb, project.pytest_cmd, list(project.test_paths))
        return ProjectSynth(project, runner, opts, progress, stop).run(env_cfg.test_timeout_s)


def cache_key(project: Project, opts: SynthOptions, version: str = SYNTH_VERSION) -> str:
    """Content hash of everything that decides a project's tasks (`version`: of this pipeline;
    an older one names the cache entry an upgrade starts from)."""
    what = {"project": project.env_spec().to_dict(), "test_cmd": project.test_cmd, "split": project.split,
            "test_paths": list(project.test_paths), "opts": opts.to_dict(), "version": version}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]
