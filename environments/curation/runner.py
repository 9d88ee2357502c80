"""One long-lived sandbox per project: run (a selection of) its tests, trace them, try mutants.

Starting a container per mutant would cost more than the tests themselves on a 2-core machine,
so every candidate of a project is applied, tested and reverted inside the same container. The
traps of doing that are handled here, once: bytecode is cleared before every run (a mutant that
keeps a file's size and mtime second would otherwise be served from a stale .pyc), each run has
its own `timeout` (mutants that loop forever), and reverting is `git checkout` of the changed
files plus `git clean` of what the tests left behind, so nothing from one mutant leaks into the
next. A small pytest plugin (`trace_plugin`) is loaded in every run.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from environments.images import CLEAN_BYTECODE, GIT_DATE
from environments.log_parsers import parse_pytest, strip_ansi
from environments.sandbox import TEST_ENV, Sandbox, SandboxError

PLUGIN_DIR = "/tmp/swerl-plugin"
TRACE_OUT = "/tmp/swerl-plugin/calls.json"
PARAMS_OUT = "/tmp/swerl-plugin/params.json"
_RC = re.compile(r"<<<swerl-rc (-?\d+)>>>")
_BUG, _GOLD, _HEAD = "<<<swerl-bug>>>", "<<<swerl-gold>>>", "<<<swerl-head>>>"
_TESTS, _PARAMS = "<<<swerl-tests>>>", "<<<swerl-params>>>"
OK_STATUSES = ("PASSED", "XFAIL")
NOT_FOUND_EXIT = 4  # pytest: usage error, e.g. a node id that does not exist


class RunnerError(SandboxError):
    """The project's tests could not be run at all (not a property of one mutant)."""


@dataclass
class SuiteRun:
    status: dict[str, str]  # node id -> PASSED / FAILED / ERROR / SKIPPED / XFAIL / XPASS
    log: str
    exit_code: int
    timed_out: bool
    duration_s: float
    bug_patch: str = ""  # set when the run was made with a mutant applied
    gold_patch: str = ""
    head: str = ""  # the commit an instance image of this state would have (mutant_diffs_sh)
    params: dict[str, dict[str, str]] = field(default_factory=dict)  # failing test -> param reprs

    def failing(self, tests: list[str] | set[str]) -> set[str]:
        """Tests of `tests` that did not succeed; a test missing from the log did not succeed."""
        return {t for t in tests if self.status.get(t) not in OK_STATUSES}

    @property
    def collection_errors(self) -> list[str]:
        return [k for k, v in self.status.items() if v == "ERROR" and "::" not in k]


def function_ids(tests: list[str] | set[str]) -> list[str]:
    """Node ids without parametrisation: robust on a command line (no spaces, quotes or
    brackets to mangle), and a function id runs all its parameter sets."""
    return sorted({t.split("[", 1)[0] for t in tests})


def mutant_diffs_sh(files: list[str]) -> str:
    """Shell printing the bug diff, the gold (revert) diff and the commit an instance image of
    this tree would have, from a throwaway index (the real index and history stay untouched).

    The commit is what `environments.images.RESET_HISTORY` makes of HEAD's tree with `files` as
    they are now: same tree, identity, date and message, so the same hash.
    """
    quoted = " ".join(shlex.quote(f) for f in files)
    ident = ("GIT_AUTHOR_NAME=swerl GIT_AUTHOR_EMAIL=swerl@localhost GIT_COMMITTER_NAME=swerl "
             f"GIT_COMMITTER_EMAIL=swerl@localhost GIT_AUTHOR_DATE={GIT_DATE} GIT_COMMITTER_DATE={GIT_DATE}")
    diff = "git -c core.quotepath=off diff"
    return (
        "( export GIT_INDEX_FILE=/tmp/swerl-mutant.idx; rm -f $GIT_INDEX_FILE; "
        f"git read-tree HEAD && git add -- {quoted} && tree=$(git write-tree) "
        f"&& echo '{_BUG}' && {diff} HEAD $tree -- {quoted} "
        f"&& echo '{_GOLD}' && {diff} $tree HEAD -- {quoted} "
        f"&& echo '{_HEAD}' && {ident} git -c commit.gpgsign=false commit-tree $tree -m base; "
        "rm -f $GIT_INDEX_FILE )"
    )


class ProjectRunner:
    """Tests of one project inside one sandbox whose `/testbed` is the pristine env tree."""

    def __init__(self, sandbox: Sandbox, pytest_cmd: str, test_paths: list[str]):
        self.sb = sandbox
        self.pytest_cmd = pytest_cmd  # e.g. "python -m pytest -rA -p no:cacheprovider -o addopts="
        self.test_paths = test_paths
        self.by_file = False  # set when node ids cannot be passed on this project's command line
        self.plugin_ready = False

    # ------------------------------------------------------------------ running tests
    def install_plugin(self) -> None:
        plugin = (Path(__file__).parent / "trace_plugin.py").read_text()
        self.write(f"{PLUGIN_DIR}/swerl_trace.py", plugin)
        self.plugin_ready = True

    def _script(self, tests: list[str] | None, timeout: float, changed: list[str], env: dict[str, str],
                verbose: bool = False) -> str:
        if tests is None:
            targets = " ".join(shlex.quote(p) for p in self.test_paths)
        elif self.by_file:
            targets = " ".join(shlex.quote(p) for p in sorted({t.split("::", 1)[0] for t in tests}))
        else:
            targets = " ".join(shlex.quote(t) for t in function_ids(tests))
        env = {"PYTHONPATH": f"{PLUGIN_DIR}${{PYTHONPATH:+:$PYTHONPATH}}", **TEST_ENV, **env}
        if changed:
            env["SWERL_PARAMS_OUT"] = PARAMS_OUT
        assigns = " ".join(f"{k}={v}" for k, v in env.items())
        lines = ["cd /testbed", CLEAN_BYTECODE, f"rm -f {PARAMS_OUT}"]
        if changed:
            lines.append(mutant_diffs_sh(changed))
        lines += [
            f"echo '{_TESTS}'",
            f"{assigns} timeout -k 5 {timeout:g} {self.pytest_cmd} -p swerl_trace --tb=short "
            f"{'-vv ' if verbose else ''}{targets} "
            "2>&1 < /dev/null",
            'echo "<<<swerl-rc $?>>>"',
        ]
        if changed:
            # revert, and drop files the mutant's tests left behind (the base tree is clean)
            lines += [f"echo '{_PARAMS}'", f"cat {PARAMS_OUT} 2>/dev/null",
                      "git checkout -q -- " + " ".join(shlex.quote(f) for f in changed), "git clean -fdq"]
        return "\n".join(lines) + "\n"

    def run_tests(self, tests: list[str] | None = None, timeout: float = 300.0,
                  changed: list[str] | None = None, env: dict[str, str] | None = None,
                  verbose: bool = False) -> SuiteRun:
        """Run `tests` (None = the whole suite) on the tree as it is now; `verbose` (-vv) makes
        pytest print compared values whole instead of cut at 30 characters (for statements).

        With `changed` (files a mutant wrote): the bug and gold diffs are read first, the
        failing tests' parameters after, and the files are reverted, all in one sandbox call.
        """
        if not self.plugin_ready:
            self.install_plugin()
        changed = changed or []
        t0 = time.monotonic()
        res = self.sb.run(self._script(tests, timeout, changed, env or {}, verbose), timeout=timeout + 60)
        out = res.output
        if _TESTS not in out:
            raise RunnerError(f"test script failed before the tests ran (rc={res.exit_code}, timed out: "
                              f"{res.timed_out}, {len(out)} chars, {res.truncated_bytes} bytes cut): "
                              f"{out[:400]} [...] {out[-400:]}")
        pre, log = out.split(_TESTS, 1)
        log, _, params = log.partition(_PARAMS)
        m = _RC.search(log)
        code = int(m.group(1)) if m else -1
        log = log[: m.start()] if m else log
        run = SuiteRun(parse_pytest(log), log, code, res.timed_out or code in (124, 137),
                      time.monotonic() - t0)
        if changed:
            if _HEAD not in pre:
                raise RunnerError(f"could not diff the mutant of {changed} (rc={res.exit_code}): {pre[-800:]}")
            bug, _, rest = pre.split(_BUG, 1)[1].partition(_GOLD)
            gold, _, head = rest.partition(_HEAD)
            run.bug_patch, run.gold_patch, run.head = bug.lstrip("\n"), gold.lstrip("\n"), head.strip()
            try:
                run.params = json.loads(params) if params.strip() else {}
            except json.JSONDecodeError:
                run.params = {}
        if (tests is not None and not self.by_file and code == NOT_FOUND_EXIT
                and "not found" in log and not run.status):
            self.by_file = True  # some node id is not addressable: select whole files instead
            return self.run_tests(tests, timeout, changed, env, verbose)
        return run

    # ------------------------------------------------------------------ files
    def read(self, path: str) -> str:
        return self.sb.read_file(path)

    def write(self, path: str, text: str) -> None:
        self.sb.write_file(path, text)

    def try_mutant(self, new_sources: dict[str, str], tests: list[str] | None, timeout: float,
                   verbose: bool = False) -> SuiteRun:
        """Write the mutated files, run `tests`, read the diffs, revert: one mutant, one call
        for the writes and one for the rest."""
        for path, text in new_sources.items():
            self.write(path, text)
        try:
            return self.run_tests(tests, timeout, changed=sorted(new_sources), verbose=verbose)
        except BaseException:
            self.sb.run("git checkout -q -- " + " ".join(shlex.quote(p) for p in new_sources), timeout=60)
            raise

    def patched_sources(self, patch: str) -> dict[str, str]:
        """The files `patch` changes, as they read with it applied; the tree is left as it was.
        (What `try_mutant` takes, for a bug known only as a diff: a cached task's.)"""
        files = sorted({line[6:] for line in patch.splitlines() if line.startswith("+++ b/")})
        quoted = " ".join(shlex.quote(f) for f in files)
        self.write("/tmp/swerl-known.patch", patch if patch.endswith("\n") else patch + "\n")
        res = self.sb.run("cd /testbed && git apply --whitespace=nowarn /tmp/swerl-known.patch", timeout=60)
        if res.exit_code != 0:
            raise RunnerError(f"the patch does not apply to {files}: {res.output[-500:]}")
        try:
            return {f: self.read(f) for f in files}
        finally:
            self.sb.run(f"cd /testbed && git checkout -q -- {quoted}", timeout=60)

    def list_files(self) -> list[str]:
        """Tracked files of the base tree (git knows exactly what the project ships)."""
        res = self.sb.run("git -c core.quotepath=off ls-files", timeout=60)
        if res.exit_code != 0:
            raise RunnerError(f"git ls-files failed: {res.output[-500:]}")
        return [line for line in res.output.splitlines() if line.strip()]

    # ------------------------------------------------------------------ tracing
    def trace(self, tests: list[str] | None, timeout: float) -> "Trace":
        """Which project functions each test called (calls outside any test are under
        "<import>" / "<between>"), and how long each test took."""
        run = self.run_tests(tests, timeout, env={"SWERL_TRACE_ROOT": "/testbed", "SWERL_TRACE_OUT": TRACE_OUT})
        if run.timed_out:
            raise RunnerError(f"the traced test run timed out after {timeout:g} s")
        try:
            raw = json.loads(self.read(TRACE_OUT))
        except (FileNotFoundError, json.JSONDecodeError) as e:
            raise RunnerError(f"the trace plugin wrote no result ({e}); log tail: {run.log[-1500:]}") from e
        calls = {test: [(p, int(line)) for p, line in keys] for test, keys in raw["calls"].items()}
        return Trace(calls, {k: float(v) for k, v in raw["durations"].items()}, run.duration_s,
                     {k: list(v) for k, v in raw.get("timing", {}).items()})


@dataclass
class Trace:
    calls: dict[str, list[tuple[str, int]]]  # node id -> [(file, first line)] of called functions
    durations: dict[str, float]  # node id -> seconds (setup + call + teardown), under the tracer
    wall_s: float  # the whole traced run, start-up and collection included
    timing: dict[str, list[str]] = field(default_factory=dict)  # node id -> socket/thread/subprocess/sleep

    def run_time(self, tests: list[str]) -> float:
        """Expected seconds for running `tests` alone (untraced runs are faster; this is a bound)."""
        overhead = max(self.wall_s - sum(self.durations.values()), 0.0)
        return overhead + sum(self.durations.get(t, 0.0) for t in tests)


@dataclass
class Baseline:
    """The tests that pass in every one of N runs of the untouched tree."""

    tests: list[str]  # deterministic passes (the only tests a task may name)
    flaky: list[str]  # passed in some runs only
    failing: list[str]  # never passed (network, environment, already broken)
    durations: list[float] = field(default_factory=list)
    timing: list[str] = field(default_factory=list)  # passed every run, but depend on the scheduler
    cause: str = ""  # when nothing passes: the collection error or the first failure, from the log

    @property
    def duration_s(self) -> float:
        return max(self.durations) if self.durations else 0.0

    def without_timing(self, trace: "Trace") -> "Baseline":
        """The same baseline with the tests the trace saw using sockets, threads, subprocesses
        or sleep moved out of `tests`: passing N quiet runs says little about a loaded machine,
        and a task may only name tests whose verdict is the code's, not the scheduler's."""
        timing = {t for t in self.tests if trace.timing.get(t)}
        return Baseline([t for t in self.tests if t not in timing], self.flaky, self.failing,
                        self.durations, sorted(timing), self.cause)


def is_test_file(path: str) -> bool:
    parts = path.split("/")
    name = parts[-1]
    return (name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"
            or any(p in ("tests", "test", "testing") for p in parts[:-1]))


def baseline(runner: ProjectRunner, runs: int, timeout: float) -> Baseline:
    """Run the whole suite `runs` times; keep what passes every time, in a real test file
    (doctests inside library modules would make the mutated file a test file)."""
    seen: list[dict[str, str]] = []
    durations = []
    for _ in range(runs):
        run = runner.run_tests(None, timeout)
        if run.timed_out:
            raise RunnerError(f"the test suite timed out after {timeout:g} s")
        if not run.status:
            raise RunnerError(f"no test results in the log (exit {run.exit_code}): {run.log[-1500:]}")
        seen.append(run.status)
        durations.append(run.duration_s)
    every = set.intersection(*(set(s) for s in seen))
    ok = sorted(t for t in every if "::" in t and is_test_file(t.split("::", 1)[0])
                and all(s[t] == "PASSED" for s in seen))
    some = {t for s in seen for t, v in s.items() if v == "PASSED"}
    return Baseline(ok, sorted(some - set(ok)), sorted(set().union(*seen) - some), durations,
                    cause="" if ok else first_failure(run))


def first_failure(run: SuiteRun) -> str:
    """Why a run passed nothing, for the user: its first collection error or failing test, as
    pytest's short summary states it (`ERROR tests/x.py - ImportError: ...`), else the log's end."""
    errors = run.collection_errors
    summary = [ln.strip() for ln in strip_ansi(run.log).splitlines() if ln.startswith(("ERROR ", "FAILED "))]
    for group in (errors, [t for t, v in run.status.items() if v in ("FAILED", "ERROR")]):
        if group:
            line = next((ln for ln in summary if ln.split(" ", 2)[1:2] == [group[0]]), None)
            return line[:500] if line else f"{run.status[group[0]]} {group[0]}"
    tail = strip_ansi(run.log).strip().splitlines()[-3:]
    return " | ".join(tail)[-500:] or f"exit code {run.exit_code}, empty log"
