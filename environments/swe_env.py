"""SWEEnv: one episode of one task, as text in and text out.

The rollout engine feeds the model's turn to `step()` and gets the observation back; `submit`
ends the episode and the patch is `sandbox.diff()`. Grading never trusts the agent's container:
`grade()` hands the diff to environments.grading, which applies it with the test patch on a
fresh checkout. The agent's mistakes (format errors, bad tool arguments, failing or timed-out
commands) become observations and the episode continues; infrastructure failures (a dead
sandbox) raise, so that they are reported as status "error" and never scored as a reward of 0.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Callable, Literal

from environments.actions import Action, ActionFormat, FormatError, parse_action
from environments.feedback import REPEATED_NOTE, RETRY, UNDONE_NOTE, Check, feedback_unavailable, run_check, undo_changes
from environments.hints import pointed_line, quoted_line
from environments.prompts import PromptStyle, instance_prompt, unseen_line_note
from environments.records import GradeResult, TaskInstance
from environments.sandbox import DiffFailed, DiffTooLarge, Sandbox, SandboxDead, SandboxError, open_sandbox
from environments.source_view import enclosing, function_view, named_function
from environments.tools import Workspace, run_tool
from environments.verdicts import cached_grade
from swerl.config import EnvironmentConfig

SandboxFactory = Callable[[str, EnvironmentConfig], Sandbox]
Feedback = Literal["none", "tests"]

# Pagers would wait for a keypress and editors for a terminal; make every program that might
# start one print instead. Set once per session, in the agent's shell.
_SESSION_SETUP = "export PAGER=cat GIT_PAGER=cat MANPAGER=cat GIT_EDITOR=true EDITOR=true TERM=dumb"


@dataclass
class StepResult:
    observation: str
    done: bool
    format_error: bool
    command: str | None  # the parsed action (None on a format error): Turn.command
    exit_reason: Literal["submitted", "tests_passed"] | None = None


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
                 prompt_style: PromptStyle = "full", show_source: bool = False, feedback: Feedback = "none"):
        """`show_source`: when the issue names the function to fix (hint level 3), the first
        observation shows its current source, as if the agent had opened it (it becomes the
        current file). Only what the issue already points to; never the fix.
        `feedback="tests"`: each change is checked by the task's failing tests (environments.feedback);
        a pass ends the episode with that patch, a failure is shown and the change undone."""
        if feedback == "tests" and (why := feedback_unavailable(task)):
            raise ValueError(f"rollout.feedback=tests cannot check task {task.instance_id}: {why}")
        self.task = task
        self.env_cfg = env_cfg
        self.action_format = action_format
        self.observation_max_chars = observation_max_chars
        self.prompt_style = prompt_style
        self.show_source = show_source
        self.feedback = feedback
        self._factory = sandbox_factory
        self.sandbox: Sandbox | None = None
        self.ws: Workspace | None = None
        self.patch: str | None = None  # set by submit
        self.diff_problem = ""  # why diff() gave the empty patch for a tree it could not diff
        self._unchanged_check: Check | None = None
        self._failed_tries: set[str] = set()
        self._pointed: tuple[str, int] | None = None  # hint level 5: the line the issue points at
        self._seen_pointed = False  # ... and whether the agent has had it on screen
        self.done = False

    # --- episode -------------------------------------------------------------------------------

    def reset(self) -> str:
        """Start a sandbox on the task image; the observation is the task prompt and the footer."""
        self.close()
        factory = self._factory or open_sandbox
        self.sandbox = factory(self.task.image, self.env_cfg)
        self.patch, self.done = None, False
        self._unchanged_check = None  # the failing tests' output on the untouched tree (feedback)
        self._failed_tries = set()  # python blocks the tests already failed: a repeat is not run again
        self._pointed, self._seen_pointed = pointed_line(self.task.problem_statement), False
        res = self.sandbox.exec(f"cd {shlex.quote(self.sandbox.workdir)} && {_SESSION_SETUP}",
                                timeout=self.env_cfg.command_timeout_s)
        if res.exit_code != 0:
            raise SandboxError(f"sandbox session setup failed ({res.exit_code}): {res.output.strip()[:500]}")
        self.ws = Workspace(self.sandbox, self.sandbox.workdir, self.env_cfg.window,
                            quoted=quoted_line(self.task.problem_statement) or self._pointed_text())
        named = named_function(self.task) if self.show_source else None
        view = function_view(self.ws, *named) if named else None
        shown = enclosing(named[1]) if named and view else None
        if self.prompt_style == "line":  # its file is open, but the quoted line is the code to copy:
            view = None  # shown a whole function, a small policy rewrites the whole function
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
            except DiffFailed as e:  # also the agent's doing: a full disk, files it made unreadable
                note = (f"Not submitted: {e}. Undo what broke the work tree (free space, fix permissions), "
                        "then submit again.")
                return StepResult(self._observe(note), False, False, action.text)
            self.done = True
            changed = sum(1 for ln in self.patch.splitlines() if ln.startswith("diff --git"))
            return StepResult(f"Submitted: {changed} file(s) changed.", True, False, action.text, "submitted")
        if action.kind == "rewrite" and self._pointed and not self._seen_pointed:
            return StepResult(self._observe(self._show_pointed()), False, False, action.text)
        if self.feedback == "tests" and action.kind == "rewrite" and action.text.strip() in self._failed_tries:
            return StepResult(self._observe(f"{REPEATED_NOTE}\n{RETRY}"), False, False, action.text)
        body = self._shell(action.text) if action.kind == "shell" else run_tool(self.ws, action)
        self._note_view()
        if self.feedback == "tests":
            return self._checked(body, action.kind == "rewrite", action.text)
        return StepResult(self._observe(body), False, False, action.text)

    def diff(self) -> str:
        """The work tree's changes now (the patch so far; `patch` holds the submitted one).

        A tree the agent left undiffable (too large, unreadable, a full disk) is its answer
        lost by its own doing: the empty patch, graded unresolved (`diff_problem` says why)."""
        if self.sandbox is None:
            raise RuntimeError("no sandbox: reset() first")
        try:
            return self.sandbox.diff()
        except (DiffTooLarge, DiffFailed) as e:
            self.diff_problem = str(e)
            return ""

    def grade(self, patch: str | None = None) -> GradeResult:
        """Grade `patch` (default: the submitted one, else the current diff) in a fresh container;
        a patch this process graded before gets its verdict back (environments.verdicts)."""
        if patch is None:
            patch = self.patch if self.patch is not None else self.diff()
        return cached_grade(self.task, patch, self.env_cfg)

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
        self.sandbox, self.ws = None, None

    def __enter__(self) -> "SWEEnv":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- helpers -------------------------------------------------------------------------------

    def _checked(self, body: str, rewrite: bool, command: str) -> StepResult:
        """Test feedback on the work tree after an action: a pass submits it, a failure is shown
        and undone. A python block that changed nothing is answered with the tests' failure on the
        unchanged code (run once per episode): what the fix must satisfy, not only "no change"."""
        assert self.sandbox is not None
        patch = self.diff()
        if not patch.strip():
            if not rewrite:
                return StepResult(self._observe(body), False, False, command)
            self._failed_tries.add(command.strip())
            if self._unchanged_check is None:
                self._unchanged_check = run_check(self.sandbox, self.task, self.env_cfg.command_timeout_s)
            shown = f"{body}\n{self._unchanged_check.report}\n{RETRY}"
            return StepResult(self._observe(shown), False, False, command)
        check = run_check(self.sandbox, self.task, self.env_cfg.command_timeout_s)
        if check.passed:
            self.patch, self.done = patch, True
            return StepResult(f"{body}\n{check.report}", True, False, command, "tests_passed")
        self._failed_tries.add(command.strip())
        failed = undo_changes(self.sandbox)
        undone = UNDONE_NOTE if failed is None else f"Your change could not be undone ({failed})."
        return StepResult(self._observe(f"{body}\n{check.report}\n{undone}\n{RETRY}"), False, False, command)

    def _note_view(self) -> None:
        """Whether the viewer now shows the pointed-at line (the agent opened or scrolled to it)."""
        assert self.ws is not None and self.sandbox is not None
        if self._pointed and self.ws.file == f"{self.sandbox.workdir}/{self._pointed[0]}":
            self._seen_pointed |= self.ws.first <= self._pointed[1] < self.ws.first + self.ws.window

    def _show_pointed(self) -> str:
        """A line fix written before the agent saw the line it must correct (hint level 5) changes
        nothing: the environment opens that line, as `open FILE LINE` would, so that the next fix
        lands in its file, and quotes it as a level-4 statement would. Only the line the issue
        already points at, never its fix."""
        assert self.ws is not None and self._pointed is not None
        path, line = self._pointed
        view = run_tool(self.ws, Action("tool", f"open {path} {line}", "open", f"{path} {line}"))
        self._note_view()
        text = self._pointed_text()
        return unseen_line_note(path, line, text) if text is not None else view  # gone: the tool says why

    def _pointed_text(self) -> str | None:
        """The text of the line a hint-level-5 statement points at, so that a one-line fix replaces
        that line (as a quoted one would); the agent is not shown it until it opens the file."""
        pointed = self._pointed
        if pointed is None:
            return None
        assert self.sandbox is not None
        try:
            lines = self.sandbox.read_file(f"{self.sandbox.workdir}/{pointed[0]}").split("\n")
        except FileNotFoundError:
            return None
        return lines[pointed[1] - 1].strip() if 0 < pointed[1] <= len(lines) else None

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
