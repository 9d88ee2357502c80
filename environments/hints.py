"""Hint level 4: a statement that also quotes the line that looks wrong, derived at run time.

Curation stores levels 0-3 with every task (`meta["statements"]`); level 4 is made when a task
is loaded, from the level-3 statement and the bug patch (`line_statement`). It is the easiest
rung of a curriculum for very small policies, and it still does not say the fix. The tools read
the quoted line back (`quoted_line`) to place a one-line fix.
"""

from __future__ import annotations

LINE_HINT = 4  # the hint level derived from level 3 and the bug patch
_LINE_HINT_TEXT = "This line looks wrong: "


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
