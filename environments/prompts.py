"""What the agent is told: the system prompt, the task prompt, worked examples.

Three styles, because the policies differ by three orders of magnitude:
  full   the SWE-agent tool set documented in the system prompt (~450 tokens), for models that
         can navigate a repository over many turns;
  short  two sentences of system prompt and one instruction after the task: write the corrected
         code in one ```python block (a small policy writes code, rarely tool calls);
  line   short, but the answer is the one corrected line (environments/rewrite.py `merge_line`),
         for hint-level-4 tasks, whose statement quotes the wrong line.
All accept the same actions (environments/actions.py); a style only changes what is explained.
The demonstrations' observations are exactly what the environment prints (a unit test replays
them against the real tools), so the model is never taught a format the environment does not use.
"""

from __future__ import annotations

import re
from typing import Literal

from environments.actions import ActionFormat
from environments.feedback import RETRY, UNDONE_NOTE, first_failure
from environments.hints import LINE_HINT, POINTER_HINT, pointed_line, with_line_hint, with_line_pointer
from environments.records import TaskInstance
from environments.sandbox import WORKDIR
from environments.tools import Text

PromptStyle = Literal["full", "short", "line"]
SHORT_STYLES = ("short", "line")

_INTRO = f"""You are a software engineer fixing an issue in a Python repository at {WORKDIR}, using a shell.
Each reply: think briefly, then give exactly ONE action in ONE fenced block. You then see its output.
No interactive programs (vim, less, a bare python REPL); use the tools below.
"""

_TOOLS = """
Actions (in a ```bash block):
  any shell command       e.g. ls, grep -rn TEXT ., python -c '...', python -m pytest -x
  open FILE [LINE]        show FILE ({window} lines at a time, numbered), from LINE
  goto LINE               move the view of the open file to LINE
  scroll_down, scroll_up  move the view by {window} lines
  search_file TERM [FILE] lines of FILE (default: the open file) that contain TERM
  create FILE             create an empty file and open it
  edit START:END          replace lines START..END of the open file by the lines that follow, up to a
  NEW LINES               line `end_of_edit` (keep the indentation right). `edit --file PATH START:END`
  end_of_edit             edits another file. An edit that breaks Python syntax is refused.
  replace 'OLD' 'NEW'     replace the exact text OLD by NEW in the open file. Quote both as in the shell
                          (they may span lines). OLD must occur once, or add --replace-all.
  submit                  finish: your changes to the files are your answer
"""

_REWRITE = """
Or give corrected code (in a ```python block): every def/class in the block replaces the one with
the same name in the open file (a lone method replaces that method of its class); new ones are added,
new imports too. A block with all of the file's contents replaces the whole file. Make the first line
`# file: PATH` to change another file. Other code in the block is not run.
"""

_END = "\nWhen the issue is fixed, reply with ```bash\nsubmit\n```"

# Short style: the python block is the action the model already produces; `submit` is named so
# that a second turn, when there is one, has a right answer too.
_SHORT_SYSTEM = ("You are an expert Python programmer who fixes bugs. Reply with the corrected code in one "
                 "```python block; it replaces the function of the same name in the file. "
                 "After the fix is applied, reply ```bash\nsubmit\n```")
_LINE_SYSTEM = ("You are an expert Python programmer who fixes bugs. Reply with the corrected line in one "
                "```python block; it replaces the line it corrects in the file. "
                "After the fix is applied, reply ```bash\nsubmit\n```")
# Line style with test feedback (rollout.feedback: tests): a passing fix ends the episode, so
# there is no submit; a failing one is answered with the test output.
_LINE_FEEDBACK_SYSTEM = ("You are an expert Python programmer who fixes bugs. Reply with the corrected line in one "
                         "```python block; it replaces the line it corrects in the file, and the failing tests "
                         "run. If they still fail, read their output and write a different corrected line.")
# Line style, hint level 5: the issue gives the wrong line's file and number; it must be opened
# before it can be corrected (the observation the fix depends on).
_POINTER_SYSTEM = ("You are an expert Python programmer who fixes bugs. The issue says which line looks wrong. "
                   "First open it: reply ```bash\nopen FILE LINE\n```. Then reply with that line corrected in one "
                   "```python block; it replaces the line in the file, and the failing tests run. If they still "
                   "fail, read their output and write a different corrected line.")
_SHORT_SYSTEM_TOOLS = ("You are an expert Python programmer who fixes bugs, one shell command per reply in one "
                       "```bash block (use sed or python to edit files). When the bug is fixed, reply "
                       "```bash\nsubmit\n```")


def system_prompt(action_format: ActionFormat, window: int, style: PromptStyle = "full",
                  feedback: bool = False, pointer: bool = False) -> str:
    if style in SHORT_STYLES:
        if action_format != "tools+file":
            return _SHORT_SYSTEM_TOOLS
        if style == "line" and pointer:
            return _POINTER_SYSTEM
        if style == "line":
            return _LINE_FEEDBACK_SYSTEM if feedback else _LINE_SYSTEM
        return _SHORT_SYSTEM
    text = _INTRO + _TOOLS.format(window=window)
    if action_format == "tools+file":
        text += _REWRITE
    return text + _END


def instance_prompt(task: TaskInstance, style: PromptStyle = "full", view: str | None = None,
                    function: str | None = None) -> str:
    """The task as the agent first sees it; `view` (the named function's source) follows the issue
    and, in the short style, the one instruction comes last, where a small model attends most."""
    issue = f"<issue>\n{task.problem_statement.strip()}\n</issue>\n"
    shown = f"\n{view}\n" if view else ""
    if style in SHORT_STYLES:
        what = f"`{function.rsplit('.', 1)[-1]}`" if function else "code"
        what = "line" if style == "line" else what
        if style == "line" and (pointed := pointed_line(task.problem_statement)):
            return issue + ("\nOnce you see that line, write it corrected in one ```python block. To see it, reply:"
                            f"\n```bash\nopen {pointed[0]} {pointed[1]}\n```")
        return issue + shown + f"\nWrite the corrected {what} in one ```python block."
    return (issue + shown + f"The repository {task.repo} is checked out at {WORKDIR}. Change its source files so "
            "that the issue is resolved, then submit. The tests that check your fix are hidden; you may write and "
            "run your own.")


def source_block(path: str, function: str, first: int, last: int, code: str, docstring_hidden: bool = False) -> str:
    """How the environment shows a function's source (SWEEnv `show_source`): a python block the
    model can copy and correct, already dedented when it is a method (a block that starts
    indented is not valid Python on its own)."""
    note = " (docstring not shown)" if docstring_hidden else ""
    return f"`{function}` in {path}, lines {first}-{last}{note}:\n```python\n{code.rstrip()}\n```"


# --- the worked example (RFT data collection, as in the paper) ----------------------------------

DEMO_PREFIX = "Here is an example task, solved.\n\n"
DEMO_FILE = "shapes.py"
DEMO_SOURCE = '''"""Area helpers."""


def rectangle_area(width, height):
    return width * width


def square_area(side):
    return side * side
'''
DEMO_STATEMENT = "rectangle_area(2, 3) returns 4, but the area of a 2 by 3 rectangle is 6."
DEMO_TASK = TaskInstance(
    instance_id="demo__shapes-1", repo="demo/shapes", base_commit="HEAD",
    problem_statement=DEMO_STATEMENT, patch="", test_patch="", FAIL_TO_PASS=[], PASS_TO_PASS=[],
)
# The same bug as a hint-level-3 task (the statement names the function and file), with the
# mutation site recorded the way curation records it, so SWEEnv shows its source.
DEMO_TASK_NAMED = TaskInstance(
    instance_id="demo__shapes-1", repo="demo/shapes", base_commit="HEAD",
    problem_statement=f"{DEMO_STATEMENT}\n\nThe problem seems to be in `rectangle_area` in `{DEMO_FILE}`.",
    patch="", test_patch="", FAIL_TO_PASS=[], PASS_TO_PASS=[],
    meta={"mutations": [{"path": DEMO_FILE, "function": "rectangle_area", "line": 5}]},
)
# ... and as a hint-level-4 task (the wrong line quoted too), for curricula at that level.
DEMO_TASK_LINE = TaskInstance.from_dict({
    **DEMO_TASK_NAMED.to_dict(),
    "problem_statement": with_line_hint(DEMO_TASK_NAMED.problem_statement, "return width * width"),
    "meta": {**DEMO_TASK_NAMED.meta, "hint_level": LINE_HINT},
})

_PATH = f"{WORKDIR}/{DEMO_FILE}"


def state_footer(file: str | None) -> str:
    """The line the environment ends every observation with (tools.Workspace.footer), at the start."""
    return f"(Current directory: {WORKDIR}, current file: {file or 'none'})"


_FOOT_NONE = state_footer(None)
_FOOT_FILE = state_footer(_PATH)
_OPENED = f"""[File: {_PATH} (9 lines total)]
1:\"\"\"Area helpers.\"\"\"
2:
3:
4:def rectangle_area(width, height):
5:    return width * width
6:
7:
8:def square_area(side):
9:    return side * side
{_FOOT_FILE}"""
_EDITED = f"""[File: {_PATH} (9 lines total)]
[1 line above]
2:
3:
4:def rectangle_area(width, height):
5:    return width * height
6:
7:
8:def square_area(side):
[1 line below]
{_FOOT_FILE}"""
_REWRITTEN = f"""Rewrote {_PATH}: replaced function rectangle_area.
[File: {_PATH} (9 lines total)]
1:\"\"\"Area helpers.\"\"\"
2:
3:
4:def rectangle_area(width, height):
5:    return width * height
6:
7:
8:def square_area(side):
[1 line below]
{_FOOT_FILE}"""

_LOOK = f"The bug is in {DEMO_FILE}. Let me look at it.\n```bash\nopen {DEMO_FILE}\n```"
_FIX = {
    "tools": "Line 5 multiplies width by width; it should be width * height.\n"
             "```bash\nedit 5:5\n    return width * height\nend_of_edit\n```",
    "tools+file": "rectangle_area multiplies width by width; it should be width * height.\n"
                  "```python\ndef rectangle_area(width, height):\n    return width * height\n```",
}
_FIXED = {"tools": _EDITED, "tools+file": _REWRITTEN}
_SUBMIT = "rectangle_area now returns width * height, which fixes the issue.\n```bash\nsubmit\n```"
_SHORT_FIX = "```python\ndef rectangle_area(width, height):\n    return width * height\n```"
_LINE_FIX = "```python\nreturn width * height\n```"
_LINE_FIXED = f"Rewrote {_PATH}: replaced line 5.\n" + _EDITED
_SHORT_SUBMIT = "```bash\nsubmit\n```"
# With test feedback, the demo's first try is wrong: the tests answer it (rendered by the same
# function that renders real test output) and the second try uses what they showed.
_LINE_WRONG = "```python\nreturn height * height\n```"
_DEMO_TEST_LOG = """F                                                                        [100%]
=================================== FAILURES ===================================
__________________________________ test_area ___________________________________
test_shapes.py:5: in test_area
    assert rectangle_area(2, 3) == 6
E   assert 9 == 6
E    +  where 9 = rectangle_area(2, 3)
1 failed in 0.01s
"""
_LINE_TRIED = (f"Rewrote {_PATH}: replaced line 5.\n" + _EDITED.replace("width * height", "height * height")
               .replace(f"\n{_FOOT_FILE}", "") + "\nThe failing tests still fail:\n" + first_failure(_DEMO_TEST_LOG)
               + f"\n{UNDONE_NOTE}\n{RETRY}\n{_FOOT_FILE}")


# Worked examples of the line style, one per kind of change a quoted line needs (the rectangle
# demo above is a wrong name): a constant, a `not`, a comparison, the argument order; one demo
# alone did not teach the small policy to answer with a line (docs/history/environments.md).
# (file, function, buggy source, statement, wrong line, fixed line)
LINE_EXAMPLES = [
    ("nums.py", "is_even", "def is_even(n):\n    return n % 2 == 1\n", "`is_even(4)` returns False, but 4 is even.",
     "return n % 2 == 1", "return n % 2 == 0"),
    ("seq.py", "first_or_default", "def first_or_default(items, default):\n    if not items:\n        return items[0]\n"
     "    return default\n", "`first_or_default([5], 0)` returns 0 instead of 5.", "if not items:", "if items:"),
    ("bounds.py", "clamp_low", "def clamp_low(x, low):\n    if x > low:\n        return low\n    return x\n",
     "`clamp_low(1, 3)` returns 1, but it should be 3.", "if x > low:", "if x < low:"),
    ("maths.py", "power", "def power(base, exp):\n    return pow(exp, base)\n", "`power(2, 3)` returns 9 instead of 8.",
     "return pow(exp, base)", "return pow(base, exp)"),
]


def line_example_task(path: str, function: str, statement: str, wrong: str) -> TaskInstance:
    """A LINE_EXAMPLES entry as a hint-level-4 task (site recorded as curation records it)."""
    named = f"{statement}\n\nThe problem seems to be in `{function}` in `{path}`."
    return TaskInstance(instance_id=f"demo__{function}-1", repo=f"demo/{function}", base_commit="HEAD",
                        problem_statement=with_line_hint(named, wrong), patch="", test_patch="", FAIL_TO_PASS=[],
                        PASS_TO_PASS=[], meta={"mutations": [{"path": path, "function": function, "line": 2}],
                                               "hint_level": LINE_HINT})


def line_examples() -> list[dict[str, str]]:
    """The line style's extra worked examples: each the task as the environment states it, then
    the corrected line (one-turn episodes end there)."""
    messages = []
    for path, function, _, statement, wrong, right in LINE_EXAMPLES:
        task = line_example_task(path, function, statement, wrong)
        messages += [{"role": "user", "content": instance_prompt(task, "line") + "\n" + state_footer(f"{WORKDIR}/{path}")},
                     {"role": "assistant", "content": f"```python\n{right}\n```"}]
    return messages


def pointer_example_task(path: str, function: str, statement: str, line: int) -> TaskInstance:
    """A worked example as a hint-level-5 task: the wrong line's file and number, not its text."""
    named = f"{statement}\n\nThe problem seems to be in `{function}` in `{path}`."
    return TaskInstance(instance_id=f"demo__{function}-1", repo=f"demo/{function}", base_commit="HEAD",
                        problem_statement=with_line_pointer(named, path, line), patch="", test_patch="",
                        FAIL_TO_PASS=[], PASS_TO_PASS=[], meta={"hint_level": POINTER_HINT})


def unseen_line_note(path: str, line: int, text: str) -> str:
    """The environment's answer to a line fix written before the pointed-at line was seen (hint
    level 5): nothing changed, and the line is quoted as a level-4 statement quotes it. The line is
    what `open PATH LINE` shows; the fix is never in it."""
    return f"Nothing was changed: you have not seen line {line} of {path} yet." + with_line_hint("", text) + f"\n{RETRY}"


def pointer_demo() -> list[dict[str, str]]:
    """Hint level 5's worked examples: the issue points at a line; the first try (the issue's
    reproducing call) comes before the line was seen, so the environment answers with the line
    quoted (`unseen_line_note`), and the second try writes it corrected. A policy trained on
    quoted lines (level 4) resolves only after that observation: docs/DEMO.md, 2026-12-04."""
    examples = [(DEMO_FILE, "rectangle_area", DEMO_SOURCE, DEMO_STATEMENT, "return width * width",
                 "return width * height")] + LINE_EXAMPLES
    messages: list[dict[str, str]] = []
    for i, (path, function, source, statement, wrong, right) in enumerate(examples):
        line = next(k for k, old in enumerate(Text.parse(source).lines, 1) if old.strip() == wrong)
        call = re.search(rf"{function}\([^)]*\)", statement).group(0)  # the call the statement reports
        reported = (f"{statement}\n\nTo reproduce:\n\n```python\nfrom {path.removesuffix('.py')} import {function}\n"
                    f"print({call})\n```")
        prompt = instance_prompt(pointer_example_task(path, function, reported, line), "line")
        messages += [{"role": "user", "content": (DEMO_PREFIX if i == 0 else "") + prompt + "\n" + _FOOT_NONE},
                     {"role": "assistant", "content": f"```python\nprint({call})\n```"},
                     {"role": "user", "content": f"{unseen_line_note(path, line, wrong)}\n{state_footer(f'{WORKDIR}/{path}')}"},
                     {"role": "assistant", "content": f"```python\n{right}\n```"}]
    return messages


def one_shot_demo(action_format: ActionFormat, style: PromptStyle = "full", show_source: bool = False,
                  line_hint: bool = False, feedback: bool = False, pointer: bool = False) -> list[dict[str, str]]:
    """Chat messages solving a made-up bug; they precede the real task: the rollout engine
    composes [system, *one_shot_demo, user: SWEEnv.reset()'s observation, ...].

    Full style: open -> fix -> submit. Short style: the fix as a python block, then submit; with
    `show_source` the demo task names the function and its source is shown, as the real tasks'
    first observation will be; with `line_hint` its statement also quotes the wrong line, as
    hint-level-4 statements do. Line style: the fix is the corrected line, and LINE_EXAMPLES
    follow the demo; with `feedback` (line style), a wrong line, its failing test, the right line.
    `pointer` (line style, hint level 5): each example's first try comes before the line was seen.
    """
    if pointer and style == "line" and action_format == "tools+file":
        return pointer_demo()
    if feedback and style == "line" and action_format == "tools+file":
        task = DEMO_TASK_LINE if line_hint else DEMO_TASK_NAMED
        return [
            {"role": "user", "content": DEMO_PREFIX + instance_prompt(task, style) + "\n" + _FOOT_FILE},
            {"role": "assistant", "content": _LINE_WRONG},
            {"role": "user", "content": _LINE_TRIED},
            {"role": "assistant", "content": _LINE_FIX},
        ] + line_examples()
    if style in SHORT_STYLES and action_format == "tools+file":
        line = style == "line"
        task = (DEMO_TASK_LINE if line_hint else DEMO_TASK_NAMED) if show_source else DEMO_TASK
        view = source_block(DEMO_FILE, "rectangle_area", 4, 5, "def rectangle_area(width, height):\n"
                            "    return width * width") if show_source and not line else None
        foot = _FOOT_FILE if show_source else _FOOT_NONE
        fn = "rectangle_area" if show_source else None
        return [
            {"role": "user", "content": DEMO_PREFIX + instance_prompt(task, style, view, fn) + "\n" + foot},
            {"role": "assistant", "content": _LINE_FIX if line else _SHORT_FIX},
            {"role": "user", "content": _LINE_FIXED if line else _REWRITTEN},
            {"role": "assistant", "content": _SHORT_SUBMIT},
        ] + (line_examples() if line and show_source else [])
    return [
        {"role": "user", "content": DEMO_PREFIX + instance_prompt(DEMO_TASK) + "\n" + _FOOT_NONE},
        {"role": "assistant", "content": _LOOK},
        {"role": "user", "content": _OPENED},
        {"role": "assistant", "content": _FIX[action_format]},
        {"role": "user", "content": _FIXED[action_format]},
        {"role": "assistant", "content": _SHORT_SUBMIT if style in SHORT_STYLES else _SUBMIT},
    ]
