"""Merge a ```python block into a file by definition name: the "rewrite" action's core.

Why this exists: small models write corrected code far more reliably than edit scripts (the
numbers: docs/history/environments.md), so the environment meets them halfway: the block's
top-level `def`s and `class`es replace the same-named ones in the file, methods given alone
(or inside a partial `class`) replace the same-named methods, new imports are added, and a block
that has a counterpart for everything in the file replaces the whole file. Everything else in
the block (example calls, prints) is ignored and reported, because running or appending it
would damage the module. The merge is pure text-in, text-out so that it is tested without a sandbox.
"""

from __future__ import annotations

import ast
import re
import threading
import warnings
from collections import Counter
from dataclasses import dataclass, field

Def = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
_DEF_TYPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_FUNC_TYPES = (ast.FunctionDef, ast.AsyncFunctionDef)
_DEF_LINE = re.compile(r"^(?:async\s+)?(?:def|class)\s+(\w+)", re.M)


class MergeError(ValueError):
    """The block cannot be applied; the message tells the agent why and what to do instead."""


@dataclass
class Merge:
    text: str  # the new file content
    changes: list[str]  # what was done, one phrase each: "replaced function add"
    span: tuple[int, int]  # first changed region in the new text (1-based, inclusive), to show
    ignored: list[str] = field(default_factory=list)  # block statements that were not applied


@dataclass
class _Edit:
    start: int  # 1-based first line replaced in the original (insertions: the line before which)
    end: int  # last line replaced; start - 1 for a pure insertion
    lines: list[str]
    what: str
    show: bool = True  # the observation shows the first edit with show=True (imports: False)


_PARSE_LOCK = threading.Lock()


def parse_python(text: str, mode: str = "exec") -> ast.Module | ast.Expression:
    """ast.parse without the SyntaxWarnings (e.g. invalid escapes) it would print to stderr.

    One parse at a time, in the whole process (every module parses through here): the rollout
    engine steps episodes in threads and curation synthesises two projects at once, and CPython
    3.11's AST constructor can raise "SystemError: AST constructor recursion depth mismatch" when
    two threads parse at once; `catch_warnings` is process-global state too.
    """
    with _PARSE_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(text, mode=mode)


def defined_names(code: str) -> list[str]:
    """Top-level def/class names of a block, in order (also used to find which file to merge into)."""
    try:
        tree = parse_python(code)
    except SyntaxError:
        return _DEF_LINE.findall(code)
    return [n.name for n in tree.body if isinstance(n, _DEF_TYPES)]


def merge_code(original: str | None, code: str, quoted: str | None = None) -> Merge:
    if original is not None and (line := _lone_line(code)) is not None:
        merged = merge_line(original, line, quoted)
        if merged is not None:
            return merged
    try:
        block = parse_python(code)
    except SyntaxError as e:
        raise MergeError(f"Your python block has a syntax error at line {e.lineno}: {e.msg}. "
                         "Nothing was changed.") from None
    new_text = code if code.endswith("\n") else code + "\n"
    whole = Merge(new_text, ["wrote the whole file"], (1, len(code.splitlines()) or 1))
    if original is None or not original.strip():
        return whole
    try:
        tree = parse_python(original)
    except SyntaxError as e:  # cannot match definitions; only a whole-file block is safe
        if set(_DEF_LINE.findall(original)) <= set(defined_names(code)):
            return whole
        raise MergeError(f"The file has a syntax error at line {e.lineno} ({e.msg}), so definitions cannot be "
                         "matched by name. Write the whole corrected file in the python block.") from None
    if _signatures(tree) <= _signatures(block):
        return whole
    return _splice(original, tree, code, block)


# A lone line at least this similar to a file line (_line_similarity) is taken as its correction.
LINE_MATCH_MIN = 0.6
_TOKEN = re.compile(r"\w+|[^\w\s]")


def _lone_line(code: str) -> str | None:
    """The block's one line when it is a single statement line, not a definition or import."""
    lines = [ln for ln in code.split("\n") if ln.strip()]
    if len(lines) != 1 or re.match(r"\s*(?:async\s+def|def|class|import|from\s+\S+\s+import|@)\b", lines[0]):
        return None
    return lines[0]


def _line_similarity(a: str, b: str) -> float:
    """Shared tokens as a share of both lines (a multiset Dice score): a fix keeps most of the
    line's tokens and may reorder them (swapped arguments), so order is not compared."""
    ta, tb = Counter(_TOKEN.findall(a)), Counter(_TOKEN.findall(b))
    total = sum(ta.values()) + sum(tb.values())
    return 2 * sum((ta & tb).values()) / total if total else 0.0


def merge_line(original: str, line: str, quoted: str | None = None) -> Merge | None:
    """A one-line block is the corrected version of one line of the file: it replaces the line the
    issue quotes (`quoted`, when the file has it once and the block is close to it), else the
    file's most similar line, keeping that line's indentation.

    Why: when the issue quotes the suspicious line (hint level 4), "here is that line, fixed" is
    the shortest answer a small model can give (a handful of tokens instead of a whole function),
    and it is what a reviewer would write. An ambiguous match, a line that is already in the file
    unchanged, or a result that does not parse changes nothing and says why. None when no line
    is close: then the block is not a line fix (e.g. `print(f())`), and the definition merge
    explains what a block may hold.
    """
    lines = original.split("\n")
    want = line.strip()
    at_quoted = [i for i, old in enumerate(lines) if quoted and old.strip() == quoted.strip()]
    if len(at_quoted) == 1 and _line_similarity(lines[at_quoted[0]], want) >= LINE_MATCH_MIN:
        # the line the agent was pointed at: a correct fix can equal another line of the file
        # (`if self._isdst(dt):` for the quoted `if not self._isdst(dt):`), or tie with several
        return _replace_line(lines, at_quoted[0], want)
    scored = sorted(((_line_similarity(old, want), i) for i, old in enumerate(lines) if old.strip()), reverse=True)
    if not scored or scored[0][0] < LINE_MATCH_MIN:
        return None
    best, at = scored[0]
    ties = sorted(i + 1 for r, i in scored if r == best)
    if len(ties) > 1 and lines[at].strip() != want:  # an unchanged copy is refused as such below
        raise MergeError(f"Your one-line block matches lines {', '.join(map(str, ties))} equally well, so nothing "
                         "was changed. Write the whole corrected function instead.")
    return _replace_line(lines, at, want)


def _replace_line(lines: list[str], at: int, want: str) -> Merge:
    """Line `at` (0-based) becomes `want` at its indentation; refused if unchanged or unparsable."""
    if lines[at].strip() == want:
        raise MergeError(f"Line {at + 1} already reads `{want}`: your block changes nothing. Write the line "
                         "as it should be.")
    indent = lines[at][:len(lines[at]) - len(lines[at].lstrip())]
    lines[at] = indent + want
    text = "\n".join(lines)
    try:
        parse_python(text)
    except SyntaxError as e:
        raise MergeError(f"Putting your line in place of line {at + 1} would leave a syntax error at line "
                         f"{e.lineno} ({e.msg}); nothing was changed.") from None
    return Merge(text, [f"replaced line {at + 1}"], (at + 1, at + 1))


def _signatures(tree: ast.Module) -> set[tuple[str, str]]:
    """One key per top-level statement; a block covering all of the file's keys is the whole file."""
    sigs = set()
    for i, node in enumerate(tree.body):
        if isinstance(node, _DEF_TYPES):
            sigs.add(("def", node.name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            sigs.add(("import", ast.unparse(node)))
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            sigs.add(("assign", ",".join(_assigned(node))))
        elif i == 0 and _is_docstring(node):
            continue
        else:
            sigs.add(("other", type(node).__name__))
    return sigs


def _splice(original: str, tree: ast.Module, code: str, block: ast.Module) -> Merge:
    lines = original.split("\n")
    trailing_newline = lines[-1] == ""
    if trailing_newline:
        lines.pop()
    code_lines = code.split("\n")
    top = {n.name: n for n in tree.body if isinstance(n, _DEF_TYPES)}
    assigns = {",".join(_assigned(n)): n for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))}
    imports = {ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))}
    edits: list[_Edit] = []
    ignored: list[str] = []
    new_imports: list[str] = []
    appended: list[str] = []
    appended_names: list[str] = []
    for node in block.body:
        src = _segment(code_lines, node)
        if isinstance(node, _DEF_TYPES) and node.name in top:
            old = top[node.name]
            if isinstance(node, ast.ClassDef) and isinstance(old, ast.ClassDef) and _partial(node, old):
                edits += _merge_methods(lines, code_lines, node, old, ignored)
            else:
                edits.append(_Edit(_start(old), old.end_lineno, _reindent(src, node.col_offset, ""),
                                   f"replaced {_kind(node)} {node.name}"))
        elif isinstance(node, _FUNC_TYPES) and (owner := _owner(tree, node.name)):
            cls, meth = owner
            edits.append(_Edit(_start(meth), meth.end_lineno, _reindent(src, node.col_offset, _indent_of(lines, meth)),
                               f"replaced method {cls.name}.{node.name}"))
        elif isinstance(node, _DEF_TYPES):
            appended += ["", "", *src]
            appended_names.append(f"{_kind(node)} {node.name}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if ast.unparse(node) not in imports:
                new_imports += src
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and ",".join(_assigned(node)) in assigns:
            old = assigns[",".join(_assigned(node))]
            edits.append(_Edit(old.lineno, old.end_lineno, src, f"replaced {', '.join(_assigned(node))} ="))
        elif not _is_docstring(node):
            ignored.append(f"line {node.lineno}: {code_lines[node.lineno - 1].strip()[:60]}")
    if appended:
        while lines and not lines[-1].strip():
            lines.pop()
        edits.append(_Edit(len(lines) + 1, len(lines), appended, "added " + ", ".join(appended_names)))
    if new_imports:
        at = _import_line(tree)
        edits.append(_Edit(at, at - 1, new_imports, "added " + "; ".join(s.strip() for s in new_imports), show=False))
    if not edits:
        raise MergeError("Nothing to apply: the python block has no function or class definition to put in the "
                         "file (and it is not the whole file), so nothing was changed. To run Python code instead, "
                         "use a ```bash block: python -c '...' or python script.py.")
    edits.sort(key=lambda e: (e.start, e.end))
    _check_overlaps(edits)
    for e in reversed(edits):
        lines[e.start - 1:e.end] = e.lines
    text = "\n".join(lines) + ("\n" if trailing_newline or appended else "")
    try:
        parse_python(text)
    except SyntaxError as e:  # e.g. a method re-indented into a class with odd indentation
        raise MergeError(f"Merging the block would leave a syntax error at line {e.lineno} ({e.msg}); nothing was "
                         "changed. Write the whole corrected file instead.") from None
    return Merge(text, [e.what for e in edits], _first_span(edits), ignored)


def _first_span(edits: list[_Edit]) -> tuple[int, int]:
    """Where the first definition change landed in the new text (imports are less interesting)."""
    shift = 0
    shown = next((e for e in edits if e.show), edits[0])
    for e in edits:
        if e is shown:
            return e.start + shift, e.start + shift + max(len(e.lines), 1) - 1
        shift += len(e.lines) - (e.end - e.start + 1)
    raise AssertionError("unreachable")


def _merge_methods(lines: list[str], code_lines: list[str], node: ast.ClassDef, old: ast.ClassDef,
                   ignored: list[str]) -> list[_Edit]:
    """A partial class in the block: replace or add its methods, keep the file's other members."""
    methods = {m.name: m for m in old.body if isinstance(m, _FUNC_TYPES)}
    body_indent = _indent_of(lines, old.body[0]) if old.body else "    "
    edits, added, names = [], [], []
    for m in node.body:
        src = _segment(code_lines, m)
        if isinstance(m, _FUNC_TYPES) and m.name in methods:
            target = methods[m.name]
            new = _reindent(src, m.col_offset, _indent_of(lines, target))
            edits.append(_Edit(_start(target), target.end_lineno, new, f"replaced method {old.name}.{m.name}"))
        elif isinstance(m, _FUNC_TYPES):
            added += ["", *_reindent(src, m.col_offset, body_indent)]
            names.append(f"{old.name}.{m.name}")
        elif not _is_docstring(m):
            ignored.append(f"line {m.lineno}: {code_lines[m.lineno - 1].strip()[:60]} (in class {node.name})")
    if added:
        edits.append(_Edit(old.end_lineno + 1, old.end_lineno, added, "added method " + ", ".join(names)))
    return edits


def _check_overlaps(edits: list[_Edit]) -> None:
    last_end = 0
    for e in sorted(edits, key=lambda e: (e.start, e.end)):
        if e.end >= e.start and e.start <= last_end:
            raise MergeError("The python block defines the same thing twice (" + e.what + "); nothing was changed.")
        last_end = max(last_end, e.end)


def _partial(node: ast.ClassDef, old: ast.ClassDef) -> bool:
    """Does the block's class leave out some of the file's methods (so we merge, not replace)?"""
    have = {m.name for m in node.body if isinstance(m, _FUNC_TYPES)}
    return not {m.name for m in old.body if isinstance(m, _FUNC_TYPES)} <= have


def _owner(tree: ast.Module, name: str) -> tuple[ast.ClassDef, ast.AST] | None:
    """The one class in the file with a method `name`; several is ambiguous and an error."""
    hits = [(c, m) for c in tree.body if isinstance(c, ast.ClassDef)
            for m in c.body if isinstance(m, _FUNC_TYPES) and m.name == name]
    if len(hits) > 1:
        classes = ", ".join(c.name for c, _ in hits)
        raise MergeError(f"Method {name} exists in several classes ({classes}); put it inside `class NAME:` in the "
                         "block to say which. Nothing was changed.")
    return hits[0] if hits else None


def _start(node: ast.AST) -> int:
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


def _segment(code_lines: list[str], node: ast.AST) -> list[str]:
    return code_lines[_start(node) - 1:node.end_lineno]


def _reindent(src: list[str], col: int, indent: str) -> list[str]:
    """Move a block from column `col` to `indent`, leaving under-indented lines (strings) alone."""
    out = []
    for line in src:
        head = line[:col]
        body = line[col:] if not head.strip() else line
        out.append(indent + body if body.strip() else "")
    return out


def _indent_of(lines: list[str], node: ast.AST) -> str:
    line = lines[_start(node) - 1]
    return line[:len(line) - len(line.lstrip())]


def _import_line(tree: ast.Module) -> int:
    """Where new imports go: after the last top-level import, else after the module docstring."""
    at = 1
    for i, node in enumerate(tree.body):
        if isinstance(node, (ast.Import, ast.ImportFrom)) or (i == 0 and _is_docstring(node)):
            at = node.end_lineno + 1
    return at


def _assigned(node: ast.AST) -> list[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return sorted(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))


def _is_docstring(node: ast.AST) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _kind(node: Def) -> str:
    return "class" if isinstance(node, ast.ClassDef) else "function"
