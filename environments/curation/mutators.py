"""Procedural bug injection over the AST of real functions (in the spirit of SWE-smith).

A `Mutation` is a byte-range replacement in one source file, located with the AST but applied
to the original text, so the bug's diff touches one token or a few whole lines and the rest of
the file keeps its formatting (an `ast.unparse` round trip would rewrite the whole file and leak
the bug's position through the noise). Each modifier looks at one node inside a function body
and proposes the realistic slips a developer makes: a flipped comparison, an off-by-one bound,
`and` for `or`, a dropped branch, swapped arguments...

Whether a mutant is a *bug* (some test fails, nothing else breaks) is decided later by running
the tests; this module only has to propose syntactically valid, non-identical edits.
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import asdict, dataclass
from typing import Iterator

from environments.rewrite import parse_python

MODIFIERS = (
    "flip_compare",  # a < b  ->  a >= b
    "boundary_shift",  # a < b  ->  a <= b (off-by-one in a bound)
    "swap_boolop",  # and <-> or
    "swap_binop",  # + <-> -, & <-> |, << <-> >>, / <-> //
    "swap_operands",  # a - b  ->  b - a
    "off_by_one",  # x[:n] -> x[:n + 1], range(k) -> range(k - 1), i + 1 -> i + 2
    "change_constant",  # True <-> False, 0 <-> 1
    "invert_condition",  # if x:  ->  if not x:
    "drop_branch",  # remove an `if` without else, an `elif` or an `else` block
    "drop_statement",  # remove a call, an augmented/attribute assignment, a return/continue/break
    "swap_args",  # f(a, b) -> f(b, a)
)

_COMPARE_TEXT = {
    ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
    ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in",
}
_INVERSE = {
    ast.Lt: ast.GtE, ast.LtE: ast.Gt, ast.Gt: ast.LtE, ast.GtE: ast.Lt, ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In,
}
_BOUNDARY = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
_BINOP_TEXT = {
    ast.Add: "+", ast.Sub: "-", ast.BitAnd: "&", ast.BitOr: "|", ast.LShift: "<<",
    ast.RShift: ">>", ast.Div: "/", ast.FloorDiv: "//", ast.Mult: "*", ast.Mod: "%",
}
_BINOP_SWAP = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd,
    ast.LShift: ast.RShift, ast.RShift: ast.LShift, ast.Div: ast.FloorDiv, ast.FloorDiv: ast.Div,
}
_NON_COMMUTATIVE = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod)
# Swapping these only produces a TypeError from the builtin, not a plausible logic bug.
_NO_SWAP_CALLS = {
    "isinstance", "issubclass", "getattr", "setattr", "hasattr", "delattr", "print", "super",
    "format", "join", "warn", "log", "debug", "info", "warning", "error", "exception",
}
_NEEDS_PARENS = (ast.BoolOp, ast.IfExp, ast.NamedExpr, ast.Lambda, ast.Yield, ast.YieldFrom)


@dataclass(frozen=True)
class Mutation:
    path: str  # repo-relative file
    function: str  # qualified name of the enclosing function, e.g. "Table.add_row"
    func_line: int  # first line of the def including decorators (= code.co_firstlineno)
    lineno: int  # first line the edit touches
    kind: str  # one of MODIFIERS
    description: str  # for meta and debugging; never shown to the agent
    start: int  # byte offsets into the UTF-8 source
    end: int
    replacement: str

    @property
    def key(self) -> str:
        """Stable identity: the same edit of the same file gets the same id on every run."""
        raw = f"{self.path}:{self.start}:{self.end}:{self.replacement}:{self.kind}"
        return hashlib.sha256(raw.encode()).hexdigest()[:10]

    def apply(self, source: str) -> str:
        return apply_mutations(source, [self])

    def to_dict(self) -> dict:
        return asdict(self)


def apply_mutations(source: str, mutations: list[Mutation]) -> str:
    """Apply non-overlapping mutations of one file (from the end, so offsets stay valid)."""
    data = source.encode()
    last = len(data) + 1
    for m in sorted(mutations, key=lambda m: m.start, reverse=True):
        if m.end > last:
            raise ValueError(f"overlapping mutations in {m.path}")
        data = data[: m.start] + m.replacement.encode() + data[m.end :]
        last = m.start
    return data.decode()


class _Source:
    """Byte-offset view of a file: AST col_offsets count UTF-8 bytes, not characters."""

    def __init__(self, text: str):
        self.text = text
        self.data = text.encode()
        self.line_starts = [0]
        for i, b in enumerate(self.data):
            if b == 0x0A:
                self.line_starts.append(i + 1)
        self.lines = self.data.split(b"\n")

    def offset(self, lineno: int, col: int) -> int:
        return self.line_starts[lineno - 1] + col

    def start(self, node: ast.AST) -> int:
        return self.offset(node.lineno, node.col_offset)

    def end(self, node: ast.AST) -> int:
        return self.offset(node.end_lineno, node.end_col_offset)

    def segment(self, a: int, b: int) -> str:
        return self.data[a:b].decode()

    def node_text(self, node: ast.AST) -> str:
        return self.segment(self.start(node), self.end(node))

    def line_span(self, first: int, last: int) -> tuple[int, int]:
        """Byte range of whole lines first..last, including the final newline."""
        end = self.line_starts[last] if last < len(self.line_starts) else len(self.data)
        return self.line_starts[first - 1], end

    def owns_lines(self, node: ast.stmt) -> bool:
        """True when the statement alone occupies its lines (no `a; b`, no trailing code)."""
        head = self.lines[node.lineno - 1][: node.col_offset]
        tail = self.lines[node.end_lineno - 1][node.end_col_offset :]
        return not head.strip() and (not tail.strip() or tail.strip().startswith(b"#"))


@dataclass
class _Ctx:
    src: _Source
    path: str
    function: str
    func_line: int
    func: ast.FunctionDef | ast.AsyncFunctionDef

    def make(self, node: ast.AST, kind: str, desc: str, start: int, end: int, repl: str) -> Mutation:
        return Mutation(self.path, self.function, self.func_line, getattr(node, "lineno", 0), kind,
                        desc, start, end, repl)


def _replace_in_gap(ctx: _Ctx, a: int, b: int, old: str, new: str) -> tuple[int, int, str] | None:
    """Replace operator `old` in the text between two operands (which may hold parentheses)."""
    gap = ctx.src.segment(a, b)
    word = old[0].isalpha()
    pat = (r"\b" + re.escape(old).replace(r"\ ", r"\s+") + r"\b") if word else re.escape(old)
    # For symbolic operators make sure we do not match a prefix of a longer one (`<` in `<=`).
    if not word:
        pat = r"(?<![<>=!/*])" + pat + r"(?![<>=/*])"
    found = list(re.finditer(pat, gap))
    if len(found) != 1:
        return None
    m = found[0]
    return a + m.start(), a + m.end(), new


def _single_line(node: ast.AST) -> bool:
    return node.lineno == node.end_lineno


def _compare(node: ast.Compare, ctx: _Ctx) -> Iterator[Mutation]:
    left = node.left
    for op, right in zip(node.ops, node.comparators):
        a, b = ctx.src.end(left), ctx.src.start(right)
        old = _COMPARE_TEXT[type(op)]
        inv = _INVERSE[type(op)]
        hit = _replace_in_gap(ctx, a, b, old, _COMPARE_TEXT[inv])
        if hit:
            yield ctx.make(node, "flip_compare", f"{old} -> {_COMPARE_TEXT[inv]}", *hit)
        if type(op) in _BOUNDARY:
            new = _COMPARE_TEXT[_BOUNDARY[type(op)]]
            hit = _replace_in_gap(ctx, a, b, old, new)
            if hit:
                yield ctx.make(node, "boundary_shift", f"{old} -> {new}", *hit)
        left = right


def _boolop(node: ast.BoolOp, ctx: _Ctx) -> Iterator[Mutation]:
    old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
    # Swap only the first operator: `a and b and c` -> `a or b and c` is still one slip.
    hit = _replace_in_gap(ctx, ctx.src.end(node.values[0]), ctx.src.start(node.values[1]), old, new)
    if hit:
        yield ctx.make(node, "swap_boolop", f"{old} -> {new}", *hit)


def _is_text(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (
        isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)))


def _binop(node: ast.BinOp, ctx: _Ctx) -> Iterator[Mutation]:
    if _is_text(node.left) or _is_text(node.right):
        return  # string concatenation / %-formatting
    a, b = ctx.src.end(node.left), ctx.src.start(node.right)
    op = type(node.op)
    if op in _BINOP_SWAP:
        old, new = _BINOP_TEXT[op], _BINOP_TEXT[_BINOP_SWAP[op]]
        hit = _replace_in_gap(ctx, a, b, old, new)
        if hit:
            yield ctx.make(node, "swap_binop", f"{old} -> {new}", *hit)
    if isinstance(node.op, _NON_COMMUTATIVE) and _single_line(node):
        lt, rt = ctx.src.node_text(node.left), ctx.src.node_text(node.right)
        if lt != rt and not isinstance(node.left, ast.BinOp) and not isinstance(node.right, ast.BinOp):
            gap = ctx.src.segment(a, b)
            yield ctx.make(node, "swap_operands", f"operands of {_BINOP_TEXT[op]}",
                           ctx.src.start(node.left), ctx.src.end(node.right), rt + gap + lt)


def _int_const(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _bump(node: ast.AST, ctx: _Ctx, delta: int, kind: str) -> Mutation | None:
    text = ctx.src.node_text(node)
    if _int_const(node):
        if node.value + delta < 0 or not text.isdigit():
            return None
        return ctx.make(node, kind, f"{node.value} -> {node.value + delta}", ctx.src.start(node),
                        ctx.src.end(node), str(node.value + delta))
    if isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)) and _single_line(node):
        sign = "+" if delta > 0 else "-"
        return ctx.make(node, kind, f"{text} -> {text} {sign} {abs(delta)}", ctx.src.start(node),
                        ctx.src.end(node), f"{text} {sign} {abs(delta)}")
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)) and _int_const(node.right):
        return _bump(node.right, ctx, delta if isinstance(node.op, ast.Add) else -delta, kind)
    return None


def _bounds(node: ast.AST, ctx: _Ctx) -> Iterator[Mutation]:
    """Off-by-one in the places where bounds live: slices, indices and range() arguments."""
    targets: list[tuple[ast.AST, int]] = []
    if isinstance(node, ast.Slice):
        if node.lower is not None:
            targets.append((node.lower, +1))
        if node.upper is not None:
            targets.append((node.upper, -1 if _int_const(node.upper) and node.upper.value else +1))
    elif isinstance(node, ast.Subscript) and _int_const(node.slice):
        targets.append((node.slice, +1))
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
        if node.args:
            targets.append((node.args[-1] if len(node.args) <= 2 else node.args[1], -1))
            if len(node.args) >= 2:
                targets.append((node.args[0], +1))
    for target, delta in targets:
        m = _bump(target, ctx, delta, "off_by_one")
        if m:
            yield m


def _constant(node: ast.Constant, ctx: _Ctx, parent: ast.AST | None) -> Iterator[Mutation]:
    if isinstance(node.value, bool):
        new = str(not node.value)
        yield ctx.make(node, "change_constant", f"{node.value} -> {new}", ctx.src.start(node),
                       ctx.src.end(node), new)
    elif type(node.value) is int and node.value in (0, 1) and isinstance(parent, (ast.Return, ast.Assign, ast.Compare, ast.keyword)):
        new = str(1 - node.value)
        yield ctx.make(node, "change_constant", f"{node.value} -> {new}", ctx.src.start(node),
                       ctx.src.end(node), new)
    elif type(node.value) is int and isinstance(parent, (ast.BinOp, ast.AugAssign)):
        additive = isinstance(parent.op, (ast.Add, ast.Sub))
        if additive or node.value > 1:
            m = _bump(node, ctx, +1, "off_by_one" if additive else "change_constant")
            if m:
                yield m


def _invert(node: ast.If | ast.While | ast.IfExp, ctx: _Ctx) -> Iterator[Mutation]:
    test = node.test
    if isinstance(test, (ast.Compare, ast.Constant)) or not _single_line(test):
        return  # flip_compare and change_constant cover these
    a, b = ctx.src.start(test), ctx.src.end(test)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = ctx.src.node_text(test.operand)
        yield ctx.make(test, "invert_condition", "drop `not`", a, b, inner)
        return
    text = ctx.src.node_text(test)
    new = f"not ({text})" if isinstance(test, _NEEDS_PARENS) else f"not {text}"
    yield ctx.make(test, "invert_condition", "negate condition", a, b, new)


def _blocks(node: ast.AST) -> Iterator[list[ast.stmt]]:
    for name in ("body", "orelse", "finalbody"):
        block = getattr(node, name, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            yield block
    for h in getattr(node, "handlers", []) or []:
        yield h.body


def _assigned_before(func: ast.AST, name: str, line: int) -> bool:
    for n in ast.walk(func):
        if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) and n.lineno < line:
            return True
        if isinstance(n, ast.arg) and n.arg == name:
            return True
    return False


def _droppable(stmt: ast.stmt, ctx: _Ctx) -> str | None:
    """Why dropping this statement is a plausible bug, or None when it is not."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        return "remove call"
    if isinstance(stmt, ast.AugAssign):
        return "remove augmented assignment"
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        t = stmt.targets[0]
        if isinstance(t, (ast.Attribute, ast.Subscript)):
            return "remove attribute/item assignment"
        if isinstance(t, ast.Name) and _assigned_before(ctx.func, t.id, stmt.lineno):
            return "remove re-assignment"
    if isinstance(stmt, (ast.Continue, ast.Break)):
        return f"remove {type(stmt).__name__.lower()}"
    return None


def _statements(node: ast.AST, ctx: _Ctx) -> Iterator[Mutation]:
    """Whole-statement removals inside the blocks of `node` (never emptying a block)."""
    src = ctx.src
    for block in _blocks(node):
        for i, stmt in enumerate(block):
            if not src.owns_lines(stmt):
                continue
            if isinstance(stmt, ast.If) and stmt.orelse:
                yield from _drop_else(stmt, ctx)
            if len(block) < 2:
                continue
            why = _droppable(stmt, ctx)
            if isinstance(stmt, ast.Return) and block is not ctx.func.body and i == len(block) - 1:
                why = "remove early return"  # falls through to the code after the block
            if why:
                a, b = src.line_span(stmt.lineno, stmt.end_lineno)
                yield ctx.make(stmt, "drop_statement", why, a, b, "")
            if isinstance(stmt, ast.If) and not stmt.orelse:
                a, b = src.line_span(stmt.lineno, stmt.end_lineno)
                yield ctx.make(stmt, "drop_branch", "remove if-block", a, b, "")


def _first_line(node: ast.AST) -> int:
    decos = getattr(node, "decorator_list", None) or []
    return min([node.lineno] + [d.lineno for d in decos])


def _drop_else(stmt: ast.If, ctx: _Ctx) -> Iterator[Mutation]:
    """Remove an `elif` arm (its own else, if any, re-attaches to the `if`) or an `else` block."""
    src = ctx.src
    first_else = stmt.orelse[0]
    line_text = src.lines[first_else.lineno - 1].decode(errors="replace").lstrip()
    if len(stmt.orelse) == 1 and isinstance(first_else, ast.If) and line_text.startswith("elif"):
        body_end = first_else.body[-1].end_lineno
        a, b = src.line_span(first_else.lineno, body_end)
        yield ctx.make(first_else, "drop_branch", "remove elif-block", a, b, "")
        return
    # A plain else: find its `else:` line between the if-body and the else-body.
    for ln in range(stmt.body[-1].end_lineno + 1, first_else.lineno):
        if re.match(rb"\s*else\s*:\s*(#.*)?$", src.lines[ln - 1]):
            if not all(src.owns_lines(s) for s in stmt.orelse):
                return
            a, b = src.line_span(ln, stmt.orelse[-1].end_lineno)
            yield ctx.make(first_else, "drop_branch", "remove else-block", a, b, "")
            return


def _swap_args(node: ast.Call, ctx: _Ctx) -> Iterator[Mutation]:
    name = node.func.id if isinstance(node.func, ast.Name) else (
        node.func.attr if isinstance(node.func, ast.Attribute) else "")
    if name in _NO_SWAP_CALLS or len(node.args) < 2:
        return
    x, y = node.args[0], node.args[1]
    if any(isinstance(a, ast.Starred) for a in (x, y)) or not (_single_line(x) and _single_line(y)):
        return
    tx, ty = ctx.src.node_text(x), ctx.src.node_text(y)
    if tx == ty:
        return
    gap = ctx.src.segment(ctx.src.end(x), ctx.src.start(y))
    yield ctx.make(node, "swap_args", f"swap arguments of {name or 'call'}()", ctx.src.start(x),
                   ctx.src.end(y), ty + gap + tx)


def _node_mutations(node: ast.AST, parent: ast.AST | None, ctx: _Ctx) -> Iterator[Mutation]:
    if isinstance(node, ast.Compare):
        yield from _compare(node, ctx)
    elif isinstance(node, ast.BoolOp):
        yield from _boolop(node, ctx)
    elif isinstance(node, ast.BinOp):
        yield from _binop(node, ctx)
    elif isinstance(node, ast.Constant) and not isinstance(parent, (ast.Slice, ast.Subscript)):
        yield from _constant(node, ctx, parent)
    if isinstance(node, (ast.Slice, ast.Subscript)) or (isinstance(node, ast.Call)):
        yield from _bounds(node, ctx)
    if isinstance(node, (ast.If, ast.While, ast.IfExp)):
        yield from _invert(node, ctx)
    if isinstance(node, ast.Call):
        yield from _swap_args(node, ctx)
    if isinstance(node, ast.stmt):
        yield from _statements(node, ctx)


def _walk_function(func: ast.FunctionDef | ast.AsyncFunctionDef, ctx: _Ctx) -> Iterator[Mutation]:
    """Visit the function's own body; nested defs are visited as functions of their own."""
    yield from _statements(func, ctx)
    stack: list[tuple[ast.AST, ast.AST | None]] = [(s, func) for s in func.body]
    while stack:
        node, parent = stack.pop()
        # Nested defs are visited on their own; positions inside f-strings are unreliable in 3.11.
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda,
                             ast.JoinedStr)) or _is_docstring(node):
            continue
        yield from _node_mutations(node, parent, ctx)
        stack.extend((child, node) for child in ast.iter_child_nodes(node))


def _is_docstring(node: ast.AST) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str))


def functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(qualified name, node) for every def in the module, methods and nested defs included."""

    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                yield name, child
                yield from visit(child, f"{name}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}{child.name}.")
            elif not isinstance(child, ast.Lambda):
                yield from visit(child, prefix)

    yield from visit(tree, "")


def find_mutations(source: str, path: str, only_lines: set[int] | None = None,
                   kinds: tuple[str, ...] = MODIFIERS) -> list[Mutation]:
    """Every candidate mutation inside the module's functions.

    `only_lines` restricts to functions whose first line (decorators included, the number a
    traced code object reports) is in the set: the functions the tests actually call.
    """
    try:
        tree = parse_python(source)
    except (SyntaxError, ValueError):
        return []
    src = _Source(source)
    out: list[Mutation] = []
    seen: set[tuple[int, int, str]] = set()
    for qualname, func in functions(tree):
        first = _first_line(func)
        if only_lines is not None and first not in only_lines:
            continue
        ctx = _Ctx(src, path, qualname, first, func)
        for m in _walk_function(func, ctx):
            ident = (m.start, m.end, m.replacement)
            if m.kind in kinds and ident not in seen and src.data[m.start:m.end].decode() != m.replacement:
                seen.add(ident)
                out.append(m)
    return out


def still_parses(source: str, mutations: list[Mutation]) -> bool:
    """Cheap guard before a mutant is tested (not run on all candidates: most are never tried)."""
    try:
        parse_python(apply_mutations(source, mutations))
        return True
    except (SyntaxError, ValueError):
        return False


def by_kind(mutations: list[Mutation]) -> dict[str, list[Mutation]]:
    out: dict[str, list[Mutation]] = {}
    for m in mutations:
        out.setdefault(m.kind, []).append(m)
    return out

