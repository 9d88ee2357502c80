"""SWEEnv: one episode of one task, as text in and text out.

The rollout engine feeds the model's turn to `step()` and gets the observation back; `submit`
ends the episode and the patch is `sandbox.diff()`. Grading never trusts the agent's container:
`grade()` hands the diff to environments.grading, which applies it with the test patch on a
fresh checkout. The agent's mistakes (format errors, bad tool arguments, failing or timed-out
commands) become observations and the episode continues; infrastructure failures (a dead
sandbox) raise, so that they are reported as status "error" and never scored as a reward of 0.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import shlex
import textwrap
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Literal

from environments.actions import ActionFormat, FormatError, parse_action
from environments.curation.statements import quoted_line
from environments.prompts import PromptStyle, instance_prompt, source_block
from environments.records import GradeResult, TaskInstance
from environments.rewrite import parse_python
from environments.sandbox import Sandbox, SandboxDead, SandboxError
from environments.shell_session import DiffTooLarge
from environments.tools import ToolError, Workspace, read_text, run_tool
from swerl.config import EnvironmentConfig

SandboxFactory = Callable[[str, EnvironmentConfig], Sandbox]

# Pagers would wait for a keypress and editors for a terminal; make every program that might
# start one print instead. Set once per session, in the agent's shell.
_SESSION_SETUP = "export PAGER=cat GIT_PAGER=cat MANPAGER=cat GIT_EDITOR=true EDITOR=true TERM=dumb"


@dataclass
class StepResult:
    observation: str
    done: bool
    format_error: bool
    command: str | None  # the parsed action (None on a format error): Turn.command
    exit_reason: Literal["submitted"] | None = None


def truncate_middle(text: str, max_chars: int) -> str:
    """Keep the head and the tail (where errors and summaries are) and say how much was cut."""
    if len(text) <= max_chars:
        return text
    keep = max(max_chars - 80, 2)
    head, tail = keep // 2, keep - keep // 2
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters cut from the middle of this output ...]\n{text[-tail:]}"


class SWEEnv:
    def __init__(self, task: TaskInstance, env_cfg: EnvironmentConfig, action_format: ActionFormat = "tools+file",
                 sandbox_factory: SandboxFactory | None = None, observation_max_chars: int = 4000,
                 prompt_style: PromptStyle = "full", show_source: bool = False):
        """`show_source`: when the issue names the function to fix (hint level 3), the first
        observation shows its current source, as if the agent had opened it (it becomes the
        current file). Only what the issue already points to; never the fix."""
        self.task = task
        self.env_cfg = env_cfg
        self.action_format = action_format
        self.observation_max_chars = observation_max_chars
        self.prompt_style = prompt_style
        self.show_source = show_source
        self._factory = sandbox_factory
        self.sandbox: Sandbox | None = None
        self.ws: Workspace | None = None
        self.patch: str | None = None  # set by submit
        self.done = False

    # --- episode -------------------------------------------------------------------------------

    def reset(self) -> str:
        """Start a sandbox on the task image; the observation is the task prompt and the footer."""
        self.close()
        factory = self._factory or _default_factory()
        self.sandbox = factory(self.task.image, self.env_cfg)
        self.patch, self.done = None, False
        res = self.sandbox.exec(f"cd {shlex.quote(self.sandbox.workdir)} && {_SESSION_SETUP}",
                                timeout=self.env_cfg.command_timeout_s)
        if res.exit_code != 0:
            raise SandboxError(f"sandbox session setup failed ({res.exit_code}): {res.output.strip()[:500]}")
        self.ws = Workspace(self.sandbox, self.sandbox.workdir, self.env_cfg.window,
                            quoted=quoted_line(self.task.problem_statement))
        named = named_function(self.task) if self.show_source else None
        view = function_view(self.ws, *named) if named else None
        shown = enclosing(named[1]) if named and view else None
        if self.prompt_style == "line":  # its file is open, but the quoted line is the code to copy:
            view = None  # shown a whole function, the 135M policy rewrote whole functions
        return self._observe(instance_prompt(self.task, self.prompt_style, view, shown))

    def step(self, text: str) -> StepResult:
        if self.ws is None or self.sandbox is None:
            raise RuntimeError("SWEEnv.step() before reset()")
        if self.done:
            raise RuntimeError("SWEEnv.step() after the episode ended (submit)")
        action = parse_action(text, self.action_format)
        if isinstance(action, FormatError):
            return StepResult(self._observe(action.message), False, True, None)
        if action.kind == "tool" and action.tool == "submit":
            if action.args:
                return StepResult(self._observe("Usage: submit (no arguments)"), False, False, action.text)
            try:
                self.patch = self.sandbox.diff()
            except DiffTooLarge as e:  # the agent's doing (e.g. a generated blob): let it clean up
                note = (f"Not submitted: {e}. Remove or revert the large changes (git status shows them), "
                        "then submit again.")
                return StepResult(self._observe(note), False, False, action.text)
            self.done = True
            changed = sum(1 for ln in self.patch.splitlines() if ln.startswith("diff --git"))
            return StepResult(f"Submitted: {changed} file(s) changed.", True, False, action.text, "submitted")
        body = self._shell(action.text) if action.kind == "shell" else run_tool(self.ws, action)
        return StepResult(self._observe(body), False, False, action.text)

    def diff(self) -> str:
        """The work tree's changes now (the patch so far; `patch` holds the submitted one)."""
        if self.sandbox is None:
            raise RuntimeError("no sandbox: reset() first")
        return self.sandbox.diff()

    def grade(self, patch: str | None = None) -> GradeResult:
        """Grade `patch` (default: the submitted one, else the current diff) in a fresh container."""
        from environments.grading import grade_prediction  # here: grading pulls in heavier deps

        if patch is None:
            patch = self.patch if self.patch is not None else self.diff()
        key = verdict_key(self.task, patch, f"{grade_prediction.__module__}.{grade_prediction.__qualname__}")
        return _VERDICTS.get_or_grade(key, lambda: grade_prediction(self.task, patch, self.env_cfg))

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
        self.sandbox, self.ws = None, None

    def __enter__(self) -> "SWEEnv":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- helpers -------------------------------------------------------------------------------

    def _shell(self, cmd: str) -> str:
        assert self.sandbox is not None
        timeout = self.env_cfg.command_timeout_s
        res = self.sandbox.exec(cmd, timeout=timeout)
        out = res.output.rstrip()
        if res.truncated_bytes:
            out += f"\n[... {res.truncated_bytes} more bytes of output were cut]"
        if res.timed_out:
            if not self.sandbox.alive:
                raise SandboxDead(f"sandbox died while running a command that timed out: {cmd[:200]!r}")
            hint = "[Avoid commands that run long or wait for input; run a narrower test or add a timeout.]"
            if "timed out" not in out[-200:]:  # the backend may already have said so
                hint = f"[The command timed out after {timeout:g} s and was stopped.]\n" + hint
            return (out + "\n" if out else "") + hint
        if not out:
            return ("Your command ran successfully and did not produce any output." if res.exit_code == 0
                    else f"(no output, exit code {res.exit_code})")
        return out if res.exit_code == 0 else f"{out}\n(exit code {res.exit_code})"

    def _observe(self, body: str) -> str:
        """Cap the body, refresh the shell's directory, and end with the footer."""
        assert self.ws is not None and self.sandbox is not None
        res = self.sandbox.exec("pwd", timeout=self.env_cfg.command_timeout_s)
        lines = res.output.strip().splitlines()
        if res.exit_code == 0 and lines and lines[-1].startswith("/"):
            self.ws.cwd = lines[-1]
        elif not self.sandbox.alive:
            raise SandboxDead("sandbox is gone (pwd failed)")
        return truncate_middle(body, self.observation_max_chars) + "\n" + self.ws.footer()


def verdict_key(task: TaskInstance, patch: str, grader: str) -> str:
    """Everything a verdict depends on: the grader, the task's image and tests, the patch."""
    parts = [grader, task.instance_id, task.image, task.test_cmd, task.test_patch,
             "\n".join(task.FAIL_TO_PASS), "\n".join(task.PASS_TO_PASS), patch]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


class VerdictCache:
    """Verdicts of patches already graded, by `verdict_key`.

    Why: a group of samples of one task often ends with the same patch (most often the empty
    one, when no action changed anything), and grading runs the project's whole suite in a
    fresh container: seconds of CPU each. Curation keeps only tasks whose outcome is the same on
    every rerun, so the same patch gets the same verdict; only `resolved`/`unresolved` verdicts
    are kept, an `error` is always graded again. Bounded, per process.

    Single-flight: a group's samples finish together, so without it G concurrent episodes with
    the same patch would all miss and grade it G times; the later ones wait for the first.
    """

    def __init__(self, size: int = 512):
        self.size = size
        self._items: OrderedDict[str, GradeResult] = OrderedDict()
        self._lock = threading.Lock()
        self._inflight: dict[str, threading.Event] = {}
        self.hits = 0

    def get_or_grade(self, key: str, grade_fn: Callable[[], GradeResult]) -> GradeResult:
        """The cached verdict, the one being computed for the same key, or `grade_fn()`."""
        while True:
            hit = self.get(key)
            if hit is not None:
                return hit
            with self._lock:
                if key in self._items:  # landed between get() and here
                    continue
                running = self._inflight.get(key)
                if running is None:
                    mine = self._inflight[key] = threading.Event()
                    break
            running.wait()  # then look again: a hit, or (the first one erred) our turn to grade
        try:
            result = grade_fn()
            self.put(key, result)
            return result
        finally:
            with self._lock:
                del self._inflight[key]
            mine.set()

    def get(self, key: str) -> GradeResult | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return copy.deepcopy(hit)  # callers may edit what they get; the cache must not change

    def put(self, key: str, result: GradeResult) -> None:
        if result.status == "error":
            return
        with self._lock:
            self._items[key] = copy.deepcopy(result)
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


_VERDICTS = VerdictCache()


# --- the named function's source (show_source) ---------------------------------------------------

def named_function(task: TaskInstance) -> tuple[str, str] | None:
    """(path, function) of the bug's site when the issue itself names both, else None.

    Curation records the site in `meta["mutations"]`; only hint-level-3 statements mention it,
    so at lower levels nothing is shown and the agent has to find the code itself.
    """
    sites = task.meta.get("mutations") or []
    if not sites:
        return None
    path, function = sites[0].get("path"), sites[0].get("function")
    if not path or not function:
        return None
    short = enclosing(function).rsplit(".", 1)[-1]
    text = task.problem_statement
    return (path, function) if path in text and short in text else None


def enclosing(function: str) -> str:
    """The name that can be shown and rewritten: a nested function's outermost enclosing def."""
    return function.split(".<locals>")[0]


def locate(source: str, function: str) -> tuple[int, int, int] | None:
    """(first line, last line, indent) of `function` ("f", "Class.method"; a nested function
    resolves to the def that encloses it), decorators included; None when it is not there."""
    try:
        tree = parse_python(source)
    except SyntaxError:
        return None
    scope: list[ast.stmt] = tree.body
    found: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | None = None
    for part in function.split("."):
        if part == "<locals>":
            break
        node = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            if found is None:
                return None
            break
        found, scope = node, node.body
    if found is None:
        return None
    first = min([d.lineno for d in found.decorator_list] + [found.lineno])
    return first, found.end_lineno or found.lineno, found.col_offset


def function_view(ws: Workspace, path: str, function: str) -> str | None:
    """The function's current source as a python block; its file becomes the current file, so
    that a python block the agent writes next lands there. None when it cannot be found."""
    full = ws.path(path)
    try:
        lines = read_text(ws, full).lines
    except ToolError:
        return None
    where = locate("\n".join(lines) + "\n", function)
    if where is None:
        return None
    first, last, _ = where
    ws.file = full
    ws.first = first
    code, dropped = without_docstring(textwrap.dedent("\n".join(lines[first - 1:last])))
    return source_block(path, enclosing(function), first, last, code, docstring_hidden=dropped)


def without_docstring(code: str) -> tuple[str, bool]:
    """The definition in `code` without its docstring, and whether there was one.

    Why: the 135M policy copies what it is shown, and a docstring (often longer than the code)
    used most of its token budget before it reached the line with the bug.
    """
    try:
        node = parse_python(code).body[0]
    except (SyntaxError, IndexError):
        return code, False
    body = getattr(node, "body", [])
    doc = body[0] if body else None
    if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)
            and len(body) > 1):
        return code, False
    lines = code.split("\n")
    return "\n".join(lines[: doc.lineno - 1] + lines[doc.end_lineno:]), True


def _default_factory() -> SandboxFactory:
    from environments.sandbox import open_sandbox  # written alongside the docker/local backends

    return open_sandbox
