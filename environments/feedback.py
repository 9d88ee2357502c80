"""Test feedback: after the agent changes the code, the environment runs the task's failing
tests in the agent's own sandbox and shows what they say (`rollout.feedback: tests`).

This is what makes an episode multi-turn for a small policy: a wrong fix is answered with the
test output, and the next turn can use it. Only tests the agent could run itself are used: a task
whose checking tests are hidden (a SWE-bench `test_patch`) gets no feedback, so the grader's
tests never leak into an observation. The verdict still comes from environments.grading in a
fresh container; a passing check only ends the episode early.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from environments.records import TaskInstance
from environments.sandbox import Sandbox, SandboxError, run_env_prefix

MAX_TESTS = 8  # failing tests run per check: enough to see the failure, cheap to run every turn
MAX_FAILURE_LINES = 14  # of the first failure's traceback, where the assertion is
PASSED_NOTE = "The failing tests pass now."
UNDONE_NOTE = "Your change was undone, so the file is as it was."
REPEATED_NOTE = "You wrote this line already, and the tests failed with it. Write a different corrected line."
# the first observation's own request (prompts.instance_prompt, line style), so that every turn
# ends the way the turn the policy answers best does
RETRY = "Write the corrected line in one ```python block."

_RULE = re.compile(r"^_{3,} (.+?) _{3,}$")  # pytest's "____ test_name ____" failure header
_SECTION = re.compile(r"^={3,} .* ={3,}$")  # "=== FAILURES ===", "=== short test summary info ==="
_TALLY = re.compile(r"^=*\s*(\d+ (failed|passed|error|errors)\b.*?)\s*=*$")


def feedback_unavailable(task: TaskInstance) -> str | None:
    """Why a task cannot get test feedback (None when it can)."""
    if task.test_patch.strip():
        return "its checking tests are hidden (test_patch): showing them would leak the grader"
    if task.log_parser != "pytest":
        return f"its tests are read by the {task.log_parser!r} parser, not pytest"
    if not task.FAIL_TO_PASS:
        return "it lists no failing tests"
    return None


def check_command(task: TaskInstance, workdir: str, timeout_s: float) -> str:
    """The failing tests by node id, quiet, in a subshell (the agent's shell keeps its directory),
    with the interpreter the task's own test command names."""
    ids = " ".join(shlex.quote(t) for t in task.FAIL_TO_PASS[:MAX_TESTS])
    words = shlex.split(task.test_cmd) if task.test_cmd else []
    python = words[0] if words and re.fullmatch(r"python[0-9.]*", words[0]) else "python"
    pytest = f"{python} -m pytest -q --no-header -p no:cacheprovider -o addopts= --tb=short -rN {ids}"
    return f"(cd {shlex.quote(workdir)} && {run_env_prefix()} timeout -k 5 {timeout_s:g}s {pytest} < /dev/null)"


def first_failure(output: str) -> str:
    """The first failure's short traceback and pytest's tally: the assertion a fix must satisfy."""
    lines, block, tally, inside = output.splitlines(), [], "", False
    for line in lines:
        if rule := _RULE.match(line):
            if block:
                inside = False
                continue
            inside, line = True, f"___ {rule.group(1)} ___"  # pytest pads it to 80 columns
        elif _SECTION.match(line):
            inside = False
        m = _TALLY.match(line.strip())
        if m:
            tally = m.group(1)
        if inside and len(block) < MAX_FAILURE_LINES:
            block.append(line)
    if not block:  # a collection error or a crash: its tail says what went wrong
        block = [ln for ln in lines[-MAX_FAILURE_LINES:] if ln.strip()]
    return "\n".join(block + ([tally] if tally and tally not in block else []))


@dataclass(frozen=True)
class Check:
    passed: bool
    report: str  # what the agent is shown


def run_check(sandbox: Sandbox, task: TaskInstance, timeout_s: float) -> Check:
    """Run the failing tests in the agent's sandbox; a timeout or crash is the agent's code failing."""
    res = sandbox.exec(check_command(task, sandbox.workdir, timeout_s), timeout=timeout_s + 10)
    if res.exit_code in (126, 127):  # no interpreter or pytest: the image, not the agent
        raise SandboxError(f"the feedback tests cannot run in {task.image}: {res.output.strip()[:300]}")
    if res.exit_code == 0 and not res.timed_out:
        return Check(True, PASSED_NOTE)
    if res.timed_out or res.exit_code == 124:
        return Check(False, f"The failing tests did not finish within {timeout_s:g} s (stopped).")
    return Check(False, "The failing tests still fail:\n" + first_failure(res.output))


def undo_changes(sandbox: Sandbox) -> str | None:
    """Put the tracked files back as they were at the start; the reason when that failed."""
    res = sandbox.exec(f"git -C {shlex.quote(sandbox.workdir)} checkout -q -- .", timeout=30)
    return None if res.exit_code == 0 else (res.output.strip()[:200] or f"exit code {res.exit_code}")
