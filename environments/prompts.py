"""What the agent is told: the system prompt, the task prompt, a worked example.

Two styles, because the policies differ by three orders of magnitude:
  full   the SWE-agent tool set documented in the system prompt (~450 tokens); for models that can
         navigate a repository over many turns.
  short  two sentences of system prompt and one instruction after the task: write the corrected
         code in one ```python block. The default 135M policy, given the full prompt at
         temperature 1.0, mostly wrote prose with no block at all (docs/DEMO.md has the numbers);
         every prompt token is also paid for on every turn of every rollout.
Both accept the same actions (environments/actions.py); a style only changes what is explained.

The rollout engine composes [system, *one_shot_demo, user: SWEEnv.reset() observation, ...];
SWEEnv.reset() returns `instance_prompt(task, style, view)` plus the state footer, where `view`
is the named function's source when the environment shows it (SWEEnv `show_source`).

The demonstration's observations are exactly what the environment prints (a unit test replays
it against the real tools), so the model is never taught a format the environment does not use.
"""

from __future__ import annotations

from typing import Literal

from environments.actions import ActionFormat
from environments.curation.statements import LINE_HINT, with_line_hint
from environments.records import TaskInstance
from environments.sandbox import WORKDIR

PromptStyle = Literal["full", "short"]

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
_SHORT_SYSTEM_TOOLS = ("You are an expert Python programmer who fixes bugs, one shell command per reply in one "
                       "```bash block (use sed or python to edit files). When the bug is fixed, reply "
                       "```bash\nsubmit\n```")


def system_prompt(action_format: ActionFormat, window: int, style: PromptStyle = "full") -> str:
    if style == "short":
        return _SHORT_SYSTEM if action_format == "tools+file" else _SHORT_SYSTEM_TOOLS
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
    if style == "short":
        what = f"`{function.rsplit('.', 1)[-1]}`" if function else "code"
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
_FOOT_NONE = f"(Current directory: {WORKDIR}, current file: none)"
_FOOT_FILE = f"(Current directory: {WORKDIR}, current file: {_PATH})"
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
_SHORT_SUBMIT = "```bash\nsubmit\n```"


def one_shot_demo(action_format: ActionFormat, style: PromptStyle = "full",
                  show_source: bool = False, line_hint: bool = False) -> list[dict[str, str]]:
    """Chat messages solving a made-up bug; they precede the real task.

    Full style: open -> fix -> submit. Short style: the fix as a python block, then submit; with
    `show_source` the demo task names the function and its source is shown, as the real tasks'
    first observation will be; with `line_hint` its statement also quotes the wrong line, as
    hint-level-4 statements do.
    """
    if style == "short" and action_format == "tools+file":
        task = (DEMO_TASK_LINE if line_hint else DEMO_TASK_NAMED) if show_source else DEMO_TASK
        view = source_block(DEMO_FILE, "rectangle_area", 4, 5, "def rectangle_area(width, height):\n"
                            "    return width * width") if show_source else None
        foot = _FOOT_FILE if show_source else _FOOT_NONE
        fn = "rectangle_area" if show_source else None
        return [
            {"role": "user", "content": DEMO_PREFIX + instance_prompt(task, style, view, fn) + "\n" + foot},
            {"role": "assistant", "content": _SHORT_FIX},
            {"role": "user", "content": _REWRITTEN},
            {"role": "assistant", "content": _SHORT_SUBMIT},
        ]
    return [
        {"role": "user", "content": DEMO_PREFIX + instance_prompt(DEMO_TASK) + "\n" + _FOOT_NONE},
        {"role": "assistant", "content": _LOOK},
        {"role": "user", "content": _OPENED},
        {"role": "assistant", "content": _FIX[action_format]},
        {"role": "user", "content": _FIXED[action_format]},
        {"role": "assistant", "content": _SHORT_SUBMIT if style == "short" else _SUBMIT},
    ]
