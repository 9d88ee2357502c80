"""What the agent is told: the system prompt with tool docs, the task prompt, a worked example.

Kept short on purpose: the default policy (SmolLM2-135M) has a context budget of a few thousand
tokens, and every prompt token is paid for on every turn of every rollout. The rollout engine
composes [system, *one_shot_demo, user: SWEEnv.reset() observation, ...]; SWEEnv.reset() returns
`instance_prompt(task)` plus the state footer.

The demonstration's observations are exactly what the tools print (a unit test replays it
against the real tools), so the model is never taught a format the environment does not use.
"""

from __future__ import annotations

from environments.actions import ActionFormat
from environments.records import TaskInstance
from environments.sandbox import WORKDIR

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


def system_prompt(action_format: ActionFormat, window: int) -> str:
    text = _INTRO + _TOOLS.format(window=window)
    if action_format == "tools+file":
        text += _REWRITE
    return text + _END


def instance_prompt(task: TaskInstance) -> str:
    return (f"<issue>\n{task.problem_statement.strip()}\n</issue>\n"
            f"The repository {task.repo} is checked out at {WORKDIR}. Change its source files so that the "
            "issue is resolved, then submit. The tests that check your fix are hidden; you may write and run your own.")


# --- the worked example (RFT data collection, as in the paper) ----------------------------------

DEMO_PREFIX = "Here is an example task, solved.\n\n"
DEMO_FILE = "shapes.py"
DEMO_SOURCE = '''"""Area helpers."""


def rectangle_area(width, height):
    return width * width


def square_area(side):
    return side * side
'''
DEMO_TASK = TaskInstance(
    instance_id="demo__shapes-1", repo="demo/shapes", base_commit="HEAD",
    problem_statement="rectangle_area(2, 3) returns 4, but the area of a 2 by 3 rectangle is 6.",
    patch="", test_patch="", FAIL_TO_PASS=[], PASS_TO_PASS=[],
)

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


def one_shot_demo(action_format: ActionFormat) -> list[dict[str, str]]:
    """Chat messages showing open -> fix -> submit on a made-up bug; they precede the real task."""
    return [
        {"role": "user", "content": DEMO_PREFIX + instance_prompt(DEMO_TASK) + "\n" + _FOOT_NONE},
        {"role": "assistant", "content": _LOOK},
        {"role": "user", "content": _OPENED},
        {"role": "assistant", "content": _FIX[action_format]},
        {"role": "user", "content": _FIXED[action_format]},
        {"role": "assistant", "content": _SUBMIT},
    ]
