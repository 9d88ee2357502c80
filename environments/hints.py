"""Hint levels 4 and 5: a statement that also points at the line that looks wrong, derived at run time.

Curation stores levels 0-3 with every task (`meta["statements"]`); levels 4 and 5 are made when a
task is loaded, from the level-3 statement and the bug patch. Neither says the fix.
  4  quotes the wrong line (`line_statement`): the easiest rung for very small policies, one turn;
  5  gives its file and number, as a permalink would (`pointer_statement`), not its text: the
     agent must open the file to see the line before it can correct it, so the fix depends on
     an observation (the multi-turn curriculum).
The environment reads the hint back (`quoted_line`, `pointed_line`) to place a one-line fix.
"""

from __future__ import annotations

import re

LINE_HINT = 4  # the hint level derived from level 3 and the bug patch: the line quoted
POINTER_HINT = 5  # ... the line's file and number, not its text
_LINE_HINT_TEXT = "This line looks wrong: "
_POINTER = re.compile(r"^The wrong line seems to be line (\d+) of `([^`\s]+)`\.$")


def changed_line(bug_patch: str) -> tuple[str, str] | None:
    """(gold line, buggy line), stripped, when the bug patch (gold -> buggy) changes exactly one
    line; None otherwise (a dropped statement, a multi-line change)."""
    changed = [line for line in bug_patch.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    gold = [line[1:].strip() for line in changed if line.startswith("-")]
    bug = [line[1:].strip() for line in changed if line.startswith("+")]
    return (gold[0], bug[0]) if len(gold) == len(bug) == 1 and bug[0] else None


def line_statement(level3: str, bug_patch: str) -> str | None:
    """Hint level 4: the level-3 statement plus the one line the bug changed, quoted as a user
    points at a suspicious line. None when the bug is not a one-line change (a dropped
    statement has no wrong line left to show)."""
    line = changed_line(bug_patch)
    if line is None or "`" in line[1]:
        return None
    return with_line_hint(level3, line[1])


def with_line_hint(level3: str, line: str) -> str:
    return f"{level3}\n\n{_LINE_HINT_TEXT}`{line.strip()}`"


def quoted_line(statement: str) -> str | None:
    """The line a hint-level-4 statement points at (what `with_line_hint` appended), else None."""
    last = statement.rstrip().rsplit("\n", 1)[-1]
    if last.startswith(_LINE_HINT_TEXT + "`") and last.endswith("`") and len(last) > len(_LINE_HINT_TEXT) + 2:
        return last[len(_LINE_HINT_TEXT) + 1:-1]
    return None


def pointer_statement(level3: str, bug_patch: str, mutations: list[dict]) -> str | None:
    """Hint level 5: the level-3 statement plus the file and number of the one line the bug
    changed (curation's `meta["mutations"]` site, a line of the buggy file). None unless the bug
    is one changed line at one recorded site."""
    if changed_line(bug_patch) is None or len(mutations) != 1 or not mutations[0].get("line"):
        return None
    return with_line_pointer(level3, str(mutations[0]["path"]), int(mutations[0]["line"]))


def with_line_pointer(level3: str, path: str, line: int) -> str:
    return f"{level3}\n\nThe wrong line seems to be line {line} of `{path}`."


def pointed_line(statement: str) -> tuple[str, int] | None:
    """(path, line number) a hint-level-5 statement points at (`with_line_pointer`), else None."""
    m = _POINTER.match(statement.rstrip().rsplit("\n", 1)[-1])
    return (m.group(2), int(m.group(1))) if m else None
