"""The agent's tools (SWE-agent style): a windowed file viewer, editing, search, and rewrite.

The tools run host-side, in Python, over the Sandbox protocol (`read_file`, `write_file`,
`exec`), and the viewer state (current file, first visible line) lives in a `Workspace` that
SWEEnv owns. Why not a script inside the container, as SWE-agent does: host-side tools work the
same on every backend without installing anything in task images, unit tests call them
directly, and the syntax check uses the host's Python (the sandbox images' 3.11).

Every tool returns the observation text; mistakes (bad arguments, missing file, an edit that
would break the syntax) come back as explanations and leave the file unchanged. Only
infrastructure failures raise (SandboxError from the sandbox).
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass
from typing import Callable

from environments.actions import Action
from environments.rewrite import MergeError, defined_names, merge_code, parse_python
from environments.sandbox import FileRefused, Sandbox

MAX_SEARCH_HITS = 50
EDIT_CONTEXT = 3  # lines shown around an edited region


class ToolError(Exception):
    """A mistake by the agent: its message is the observation; nothing was changed."""


@dataclass
class Workspace:
    sandbox: Sandbox
    cwd: str  # the shell session's directory, refreshed by SWEEnv after every action
    window: int  # lines the viewer shows
    file: str | None = None  # absolute path of the current (open) file
    first: int = 1  # first line of the viewer window
    quoted: str | None = None  # the line the issue points at (hint level 4): a one-line fix replaces it

    def path(self, name: str) -> str:
        return posixpath.normpath(posixpath.join(self.cwd, name))

    def footer(self) -> str:
        """Ends every observation, so the agent always knows where it is (SWE-agent's state line)."""
        return f"(Current directory: {self.cwd}, current file: {self.file or 'none'})"

    def current(self) -> str:
        if self.file is None:
            raise ToolError("No file is open. Use `open FILE` first.")
        return self.file


# --- files as lists of lines --------------------------------------------------------------------

@dataclass
class Text:
    lines: list[str]
    newline_at_end: bool = True

    @classmethod
    def parse(cls, text: str) -> "Text":
        lines = text.split("\n")
        if lines[-1] == "":
            return cls(lines[:-1], True)
        return cls(lines, False)

    def render(self) -> str:
        return "\n".join(self.lines) + ("\n" if self.lines and self.newline_at_end else "")


def read_text(ws: Workspace, path: str) -> Text:
    try:
        return Text.parse(ws.sandbox.read_file(path))
    except FileNotFoundError:
        raise ToolError(f"File {path} not found.") from None
    except (IsADirectoryError, NotADirectoryError):
        raise ToolError(f"{path} is a directory, not a file. Use `ls {path}` to list it.") from None
    except PermissionError:
        raise ToolError(f"Permission denied: {path}.") from None
    except UnicodeDecodeError:
        raise ToolError(f"{path} is not a text file.") from None
    except FileRefused as e:
        raise ToolError(f"{e}.") from None


def write(ws: Workspace, path: str, text: str) -> None:
    try:
        ws.sandbox.write_file(path, text)
    except PermissionError:
        raise ToolError(f"Permission denied: cannot write {path}.") from None
    except FileRefused as e:
        raise ToolError(f"Nothing was written: {e}.") from None


def exists(ws: Workspace, path: str) -> bool:
    return ws.sandbox.exec(f"test -e {shlex.quote(path)}").exit_code == 0


def write_text(ws: Workspace, path: str, text: str) -> None:
    parent = posixpath.dirname(path)
    if parent and not exists(ws, parent):
        res = ws.sandbox.exec(f"mkdir -p {shlex.quote(parent)}")
        if res.exit_code != 0:
            raise ToolError(f"Cannot create directory {parent}: {res.output.strip()}")
    write(ws, path, text)


def syntax_problem(path: str, new: str, old: str | None) -> str | None:
    """Why `new` is refused, or None. Only .py files, and only errors the change introduces."""
    if not path.endswith(".py"):
        return None
    try:
        parse_python(new)
        return None
    except SyntaxError as e:
        if old is not None:
            try:
                parse_python(old)
            except SyntaxError:
                return None  # the file was already broken; do not block attempts to fix it
        return f"{e.msg} (line {e.lineno})"


# --- viewer -------------------------------------------------------------------------------------

def render_window(path: str, text: Text, first: int, size: int) -> tuple[str, int]:
    """Numbered lines [first, first+size) with how much is hidden above/below; returns the clamped first."""
    n = len(text.lines)
    first = max(1, min(first, n - size + 1))
    last = min(n, first + size - 1)
    out = [f"[File: {path} ({_lines(n)} total)]"]
    if first > 1:
        out.append(f"[{_lines(first - 1)} above]")
    out += [f"{i}:{text.lines[i - 1]}" for i in range(first, last + 1)]
    if last < n:
        out.append(f"[{_lines(n - last)} below]")
    if n == 0:
        out.append("[File is empty]")
    return "\n".join(out), first


def _lines(k: int) -> str:
    return f"{k} line" if k == 1 else f"{k} lines"


def show(ws: Workspace, path: str, text: Text, first: int) -> str:
    ws.file = path
    out, ws.first = render_window(path, text, first, ws.window)
    return out


def show_region(ws: Workspace, path: str, text: Text, start: int, end: int) -> str:
    """The edited lines with a little context, at most one window; the viewer moves there. A
    window too small for the context keeps the edited lines in view and trims the context."""
    last = max(end, start)
    context = max(0, min(EDIT_CONTEXT, (ws.window - (last - start + 1)) // 2))
    first = max(1, start - context)
    size = min(ws.window, last + context - first + 1)
    ws.file = path
    out, ws.first = render_window(path, text, first, size)
    return out


def _line_number(word: str, what: str = "LINE") -> int:
    if not re.fullmatch(r"\d+", word):
        raise ToolError(f"{what} must be a line number, got {word!r}.")
    return int(word)


def _split(args: str, usage: str) -> list[str]:
    try:
        return shlex.split(args)
    except ValueError as e:
        raise ToolError(f"Could not parse the arguments ({e}). Usage: {usage}") from None


# --- tools --------------------------------------------------------------------------------------

def tool_open(ws: Workspace, action: Action) -> str:
    usage = "open FILE [LINE]"
    words = _split(action.args, usage)
    if not 1 <= len(words) <= 2:
        raise ToolError(f"Usage: {usage}")
    path = ws.path(words[0])
    text = read_text(ws, path)
    if len(words) == 1:
        return show(ws, path, text, 1)
    return _goto(ws, path, text, _line_number(words[1]))


def _goto(ws: Workspace, path: str, text: Text, line: int) -> str:
    n = len(text.lines)
    if not 1 <= line <= max(n, 1):
        raise ToolError(f"Line {line} is outside {path}, which has {n} lines.")
    return show(ws, path, text, line - ws.window // 2)


def tool_goto(ws: Workspace, action: Action) -> str:
    words = action.args.split()
    if len(words) != 1:
        raise ToolError("Usage: goto LINE")
    path = ws.current()
    return _goto(ws, path, read_text(ws, path), _line_number(words[0]))


def _scroll(ws: Workspace, action: Action, direction: int) -> str:
    if action.args:
        raise ToolError(f"Usage: {action.tool} (no arguments)")
    path = ws.current()
    return show(ws, path, read_text(ws, path), ws.first + direction * ws.window)


def tool_scroll_down(ws: Workspace, action: Action) -> str:
    return _scroll(ws, action, +1)


def tool_scroll_up(ws: Workspace, action: Action) -> str:
    return _scroll(ws, action, -1)


def tool_create(ws: Workspace, action: Action) -> str:
    words = _split(action.args, "create FILE")
    if len(words) != 1:
        raise ToolError("Usage: create FILE")
    path = ws.path(words[0])
    if exists(ws, path):
        raise ToolError(f"{path} already exists. Use `open {words[0]}` to view it and `edit` to change it.")
    content = Text.parse(action.body + "\n") if action.body else Text([])
    problem = syntax_problem(path, content.render(), None)
    if problem:
        raise ToolError(f"The file was not created: its content has a syntax error: {problem}.")
    write_text(ws, path, content.render())
    return show(ws, path, content, 1)


_RANGE = re.compile(r"(\d+)\s*(?:[:,-]\s*(\d+))?")


def tool_edit(ws: Workspace, action: Action) -> str:
    usage = "edit [--file PATH] START:END, then the new lines, then end_of_edit"
    words = _split(action.args, usage)
    path = ws.file
    if len(words) >= 2 and words[0] == "--file":
        path, words = ws.path(words[1]), words[2:]
    m = _RANGE.fullmatch(" ".join(words))
    if not m:
        raise ToolError(f"Usage: {usage}")
    if path is None:
        raise ToolError("No file is open. Use `open FILE` first, or `edit --file PATH START:END`.")
    if action.body is None:
        raise ToolError(f"The edit has no new lines. Usage: {usage} (an empty body before end_of_edit deletes lines).")
    start = int(m.group(1))
    end = int(m.group(2) or start)
    text = read_text(ws, path)
    n = len(text.lines)
    if not 1 <= start <= n + 1 or end < start - 1:
        raise ToolError(f"Invalid range {start}:{end}: {path} has {n} lines (lines are numbered from 1).")
    end = min(end, n)
    new_lines = action.body.split("\n") if action.body else []
    edited = Text(text.lines[:start - 1] + new_lines + text.lines[end:], text.newline_at_end)
    problem = syntax_problem(path, edited.render(), text.render())
    if problem:
        before, _ = render_window(path, text, start, end - start + 1)
        after, _ = render_window(path, edited, start, max(len(new_lines), 1))
        raise ToolError(f"Your edit was NOT applied: it would introduce a syntax error: {problem}.\n"
                        f"This is how the edited lines would have looked:\n{after}\n"
                        f"These are the original lines, still in the file:\n{before}\n"
                        "Fix the edit (check indentation and brackets) and try again.")
    write(ws, path, edited.render())
    return show_region(ws, path, edited, start, start + len(new_lines) - 1)


def tool_replace(ws: Workspace, action: Action) -> str:
    usage = "replace [--replace-all] SEARCH REPLACE (quote each argument)"
    words = _split(action.args, usage)
    replace_all = "--replace-all" in words
    words = [w for w in words if w != "--replace-all"]
    if len(words) != 2:
        raise ToolError(f"replace takes exactly two quoted arguments, got {len(words)}. Usage: {usage}")
    search, replacement = words
    if not search:
        raise ToolError("SEARCH is empty.")
    path = ws.current()
    old = read_text(ws, path).render()
    count = old.count(search)
    if count == 0:
        raise ToolError(f"SEARCH text not found in {path}; nothing was changed. It must match exactly, including "
                        "indentation. Use `search_file` or `open` to check the text.")
    if count > 1 and not replace_all:
        lines = sorted({old[:m.start()].count("\n") + 1 for m in re.finditer(re.escape(search), old)})
        raise ToolError(f"SEARCH text occurs {count} times in {path} (lines {', '.join(map(str, lines))}); nothing "
                        "was changed. Include more surrounding text to make it unique, or use --replace-all.")
    new = old.replace(search, replacement)
    problem = syntax_problem(path, new, old)
    if problem:
        raise ToolError(f"The replacement was NOT applied: it would introduce a syntax error: {problem}.")
    write(ws, path, new)
    start = old[:old.index(search)].count("\n") + 1
    shown = show_region(ws, path, Text.parse(new), start, start + replacement.count("\n"))
    return (f"Replaced {count} occurrences.\n" if count > 1 else "") + shown


def tool_search_file(ws: Workspace, action: Action) -> str:
    usage = "search_file TERM [FILE]"
    words = _split(action.args, usage)
    if not 1 <= len(words) <= 2:
        raise ToolError(f"Usage: {usage} (quote a TERM that contains spaces)")
    term = words[0]
    path = ws.path(words[1]) if len(words) == 2 else ws.current()
    hits = [(i, line) for i, line in enumerate(read_text(ws, path).lines, 1) if term in line]
    if not hits:
        return f'No matches found for "{term}" in {path}'
    if len(hits) > MAX_SEARCH_HITS:
        return f'More than {MAX_SEARCH_HITS} lines matched "{term}" in {path}. Please narrow your search.'
    out = [f'Found {len(hits)} matches for "{term}" in {path}:']
    out += [f"Line {i}:{line}" for i, line in hits]
    out.append(f'End of matches for "{term}" in {path}')
    return "\n".join(out)


# --- rewrite (action_format "tools+file") -------------------------------------------------------

_FILE_COMMENT = re.compile(r"#\s*(?:file(?:name)?\s*:\s*)?(\S+\.py)\s*$", re.I)
_TEST_PATH = re.compile(r"(^|/)(tests?/|test_[^/]*\.py$|[^/]*_test\.py$|conftest\.py$)")


def tool_rewrite(ws: Workspace, code: str) -> str:
    """Apply a ```python block: by definition name into the target file, or as the whole file."""
    lines = code.split("\n")
    named = _FILE_COMMENT.fullmatch(lines[0].strip())
    if named:
        path, code = ws.path(named.group(1)), "\n".join(lines[1:])
    else:
        path = _rewrite_target(ws, defined_names(code))
    try:
        original = read_text(ws, path).render()
    except ToolError:
        if named is None:
            raise
        original = None  # `# file: new.py` creates the file
    try:
        merge = merge_code(original, code, ws.quoted)
    except MergeError as e:
        raise ToolError(f"{e} (target: {path})") from None
    write_text(ws, path, merge.text)
    summary = f"Rewrote {path}: " + "; ".join(merge.changes) + "."
    if merge.ignored:
        summary += ("\nNot applied (only definitions, imports and existing assignments are merged): "
                    + "; ".join(merge.ignored))
    return summary + "\n" + show_region(ws, path, Text.parse(merge.text), *merge.span)


def _rewrite_target(ws: Workspace, names: list[str]) -> str:
    """The current file if it defines one of `names`; else the one repository file that does."""
    if ws.file and names:
        try:
            if set(names) & set(_defs_anywhere(read_text(ws, ws.file).render())):
                return ws.file
        except ToolError:
            pass
    found = _files_defining(ws, names) if names else []
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise ToolError(f"Several files define {', '.join(names)}: {', '.join(found)}. Start the python block "
                        "with a comment line `# file: PATH` to choose one. Nothing was changed.")
    if ws.file and ws.file.endswith(".py"):
        return ws.file
    what = ", ".join(names) or "anything in the block"
    raise ToolError(f"No Python file is open and no file in the repository defines {what}. Open the file first, "
                    "or start the python block with `# file: PATH`. Nothing was changed.")


def _defs_anywhere(text: str) -> list[str]:
    return re.findall(r"^\s*(?:async\s+)?(?:def|class)\s+(\w+)", text, re.M)


def _files_defining(ws: Workspace, names: list[str]) -> list[str]:
    """Tracked and untracked .py files of the work tree that define one of `names`; tests last resort."""
    pattern = r"^\s*(async\s+)?(def|class)\s+(" + "|".join(map(re.escape, names)) + r")\b"
    # `git -C`, not `cd`: exec runs in the agent's shell session, whose directory must not move.
    res = ws.sandbox.exec(f"git -C {shlex.quote(ws.sandbox.workdir)} grep -l --untracked -E "
                          f"{shlex.quote(pattern)} -- '*.py'")
    if res.exit_code not in (0, 1):
        return []
    paths = [ws.sandbox.workdir + "/" + p.strip() for p in res.output.splitlines() if p.strip()]
    source = [p for p in paths if not _TEST_PATH.search(p[len(ws.sandbox.workdir):])]
    return source or paths


TOOLS: dict[str, Callable[[Workspace, Action], str]] = {
    "open": tool_open,
    "goto": tool_goto,
    "scroll_down": tool_scroll_down,
    "scroll_up": tool_scroll_up,
    "create": tool_create,
    "edit": tool_edit,
    "replace": tool_replace,
    "search_file": tool_search_file,
}


def run_tool(ws: Workspace, action: Action) -> str:
    """Run a tool or rewrite action (not `submit`, which SWEEnv handles) and return its observation."""
    try:
        if action.kind == "rewrite":
            return tool_rewrite(ws, action.text)
        return TOOLS[action.tool](ws, action)
    except ToolError as e:
        return str(e)
