"""The source of the function an issue names, shown as if the agent had opened it.

When a statement names the file and function to look at (hint level 3), `SWEEnv` can show that
function's current source in the first observation (`show_source`): only what the issue already
points to, never the fix. Here: finding that function, its lines in a file, and the view.
"""

from __future__ import annotations

import ast
import textwrap

from environments.prompts import source_block
from environments.records import TaskInstance
from environments.rewrite import parse_python
from environments.tools import ToolError, Workspace, read_text


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
    """The definition in `code` without its docstring, and whether there was one: a small
    policy copies what it is shown, and a docstring spends its tokens before the bug's line."""
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
