"""Test checks rewritten as what a user would run: the checked value printed, the expectation in
a comment (`print(f(x))  # expected: 3`), never the assertion framework's code.

`assert`, `self.assert*`, `with pytest.raises(E)` / `self.assertRaises(E)` (as `try/except`
when the test reads the exception afterwards), `try: ... except E: pass / else: fail`, and two
clean-ups: funcy's `whatever._` placeholders become lambdas, and `if` tests a parameter decided
become the branch that runs. Notes reach the rendered code through a marker call that `render`
turns into a trailing comment.
"""

from __future__ import annotations

import ast
import copy
import re

from environments.curation.pyast import (
    EQUAL_CHECKS, RAISES_CHECKS, TRUTH_CHECKS, is_call_to, is_check, orient, replace_names,
)

MAX_NOTE = 100  # a longer expectation is not repeated in the script's comment (the report says it)
NOTE = "__swerl_note__"
_NOTE_LINE = re.compile(rf"^(\s*){NOTE}\((\d+)(?:, (.*))?\)$")


class CheckRewriter(ast.NodeTransformer):
    """Checks -> printed calls with a note. Notes are attached through a marker call
    `__swerl_note__(i, expr)` that `render` turns into `expr  # note`."""

    def __init__(self, values: dict[str, ast.expr], data: set[str], opaque: dict[str, str] | None = None) -> None:
        self.notes: list[str] = []
        self.values = values  # parameter -> its value, spelled out in the notes
        self.data = data  # names that hold test data (parameters)
        self.opaque = opaque or {}  # parameter -> its repr, when that is not Python (`<Foo>`)
        self.excinfo: set[str] = set()  # names bound by `pytest.raises(...) as name`

    def say(self, node: ast.expr) -> str:
        text = ast.unparse(replace_names(node, self.values, self.excinfo))
        return self.opaque.get(text, text)

    def note(self, text: str, value: ast.expr | None = None, *, at: ast.AST) -> ast.Expr:
        self.notes.append(text)
        args: list[ast.expr] = [ast.Constant(len(self.notes) - 1)] + ([value] if value is not None else [])
        return ast.copy_location(ast.Expr(ast.Call(ast.Name(NOTE, ast.Load()), args, [])), at)

    def show(self, actual: ast.expr, expectation: str, at: ast.AST) -> ast.Expr:
        printed = ast.Call(ast.Name("print", ast.Load()), [self.visit(actual)], [])
        if len(expectation) > MAX_NOTE:
            expectation = "something else (see below)"
        return self.note(f"expected: {expectation}", printed, at=at)

    def block(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for s in stmts:
            new = self.visit(s)
            out += new if isinstance(new, list) else [new] if new is not None else []
        return out or [ast.Pass()]

    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        test = node.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            left, op, right = test.left, test.ops[0], test.comparators[0]
            if isinstance(op, (ast.Eq, ast.Is)):
                actual, want = orient(left, right, self.data)
                return self.show(actual, self.say(want), node)
            if isinstance(op, (ast.NotEq, ast.IsNot)):
                actual, want = orient(left, right, self.data)
                return self.show(actual, "not " + self.say(want), node)
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self.show(test.operand, "False", node)
        return self.show(test, "True", node)

    def visit_Expr(self, node: ast.Expr) -> ast.AST:
        call = node.value
        if not is_check(node):
            if isinstance(call, ast.Call) and is_call_to(call, {"raises"}) and call.args[1:]:
                inner = ast.Call(self.visit(call.args[1]), [self.visit(a) for a in call.args[2:]], call.keywords)
                return self.note(f"expected: raises {ast.unparse(call.args[0])}", inner, at=node)
            return self.generic_visit(node)
        assert isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
        name, args = call.func.attr, call.args
        if name in EQUAL_CHECKS and len(args) >= 2:
            actual, want = orient(args[0], args[1], self.data)
            return self.show(actual, self.say(want), node)
        if name in ("assertNotEqual", "assertIsNot") and len(args) >= 2:
            actual, want = orient(args[0], args[1], self.data)
            return self.show(actual, "not " + self.say(want), node)
        if name in ("assertAlmostEqual", "assertCountEqual") and len(args) >= 2:
            how = "about " if name == "assertAlmostEqual" else "the same items as "
            return self.show(args[0], how + self.say(args[1]), node)
        if name in TRUTH_CHECKS and args:
            return self.show(args[0], TRUTH_CHECKS[name], node)
        if name in ("assertIn", "assertNotIn") and len(args) >= 2:
            test = ast.Compare(args[0], [ast.In()], [args[1]])
            return self.show(test, "True" if name == "assertIn" else "False", node)
        if name in ("assertIsInstance", "assertNotIsInstance") and len(args) >= 2:
            neg = "not " if name.startswith("assertNot") else ""
            return self.show(ast.Call(ast.Name("type", ast.Load()), [args[0]], []), f"{neg}{self.say(args[1])}", node)
        if name in RAISES_CHECKS and len(args) >= 2:
            skip = 2 if name.endswith(("Regex", "Regexp")) else 1
            if len(args) > skip:
                inner = ast.Call(self.visit(args[skip]), [self.visit(a) for a in args[skip + 1:]], call.keywords)
                return self.note(f"expected: raises {ast.unparse(args[0])}", inner, at=node)
        if name in ("assertRegex", "assertNotRegex") and len(args) >= 2:
            neg = "not " if "Not" in name else ""
            return self.show(args[0], f"{neg}to match {self.say(args[1])}", node)
        if args:  # an assertion helper we do not know: show its first argument
            return self.show(args[0], name.removeprefix("assert").lower() or "true", node)
        return self.note("this is where it goes wrong", at=node)

    def visit_With(self, node: ast.With) -> ast.AST | list[ast.AST]:
        checks = [i for i in node.items if is_call_to(i.context_expr, RAISES_CHECKS | {"raises", "warns"})]
        if not checks:
            return self.generic_visit(node)
        item = checks[0]
        call = item.context_expr
        assert isinstance(call, ast.Call)
        what = ast.unparse(call.args[0]) if call.args else "an exception"
        match = next((k.value for k in call.keywords if k.arg == "match"), None)
        what += f" matching {ast.unparse(match)}" if match is not None else ""
        kind = "warns" if is_call_to(call, {"warns", "assertWarns", "assertWarnsRegex"}) else "raises"
        rest = [i for i in node.items if i is not item]
        body = self.block(node.body)
        if isinstance(item.optional_vars, ast.Name) and kind == "raises" and call.args:
            # `with pytest.raises(E) as info:` -> `try: ... except E as e: info = e`
            name = item.optional_vars.id
            self.excinfo.add(name)
            keep = ast.Assign([ast.Name(name, ast.Store())], ast.Name("error", ast.Load()), lineno=0)
            handler = ast.ExceptHandler(copy.deepcopy(call.args[0]), "error", [keep])
            inner: list[ast.stmt] = [ast.Try(body, [handler], [], [])]
            head = self.note(f"expected: {kind} {what}", at=node)
        else:
            inner = body
            head = self.note(f"expected: the next line {kind} {what}", at=node)
        if rest:
            return ast.copy_location(ast.With(rest, [head, *inner]), node)
        return [head, *inner]

    def visit_Try(self, node: ast.Try) -> ast.AST | list[ast.AST]:
        """`try: f() / except E: pass / else: assert False` is `pytest.raises(E)` spelled out."""
        if len(node.body) == 1 and node.orelse and all(is_fail(s) for s in node.orelse) and node.handlers \
                and all(h.type is not None for h in node.handlers) and not node.finalbody:
            what = " or ".join(ast.unparse(h.type) for h in node.handlers if h.type is not None)
            return [self.note(f"expected: the next line raises {what}", at=node), *self.block(node.body)]
        return self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.value.id in self.excinfo and node.attr == "value":
            return ast.copy_location(ast.Name(node.value.id, node.ctx), node)
        return self.generic_visit(node)


class Placeholders(ast.NodeTransformer):
    """The `_` of the `whatever` package (`walk(_ * 2, xs)`) as the lambda it stands for: each
    `_` in a call argument is one parameter (`_ + _` is `lambda x, y: x + y`)."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)  # inner calls first: their arguments become lambdas of their own
        node.args = [self.wrap(a) for a in node.args]
        for k in node.keywords:
            k.value = self.wrap(k.value)
        return node

    @staticmethod
    def wrap(arg: ast.expr) -> ast.expr:
        holes = [n for n in ast.walk(arg) if isinstance(n, ast.Name) and n.id == "_" and isinstance(n.ctx, ast.Load)]
        if not holes or len(holes) > 3:
            return arg
        names = ["x", "y", "z"][:len(holes)]
        for hole, name in zip(holes, names):
            hole.id = name
        return ast.Lambda(ast.arguments([], [ast.arg(n) for n in names], None, [], [], None, []), arg)


class Fold(ast.NodeTransformer):
    """`if 'meta' == 'meta':` (a parameter written in) keeps only the branch that runs; so
    does `if expected is None:` for a parameter whose value has no Python spelling (so it is
    not None)."""

    def __init__(self, opaque: set[str] = frozenset()) -> None:
        self.opaque = opaque

    def visit_If(self, node: ast.If) -> ast.AST | list[ast.stmt]:
        self.generic_visit(node)
        test = node.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Name) \
                and test.left.id in self.opaque and isinstance(test.comparators[0], ast.Constant) \
                and test.comparators[0].value is None and isinstance(test.ops[0], (ast.Is, ast.IsNot)):
            test = ast.Constant(isinstance(test.ops[0], ast.IsNot))
        taken = _constant_truth(test)
        if taken is None:
            return node
        return (node.body if taken else node.orelse) or [ast.Pass()]


def _constant_truth(test: ast.expr) -> bool | None:
    """The value of `c1 == c2` / `c1 is c2` / `not ...` / a constant, for constants only."""
    if isinstance(test, ast.Constant):
        return bool(test.value)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _constant_truth(test.operand)
        return None if inner is None else not inner
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Constant) \
            and isinstance(test.comparators[0], ast.Constant):
        a, b = test.left.value, test.comparators[0].value
        same = {ast.Eq: a == b, ast.NotEq: a != b, ast.Is: a is b, ast.IsNot: a is not b}
        return same.get(type(test.ops[0]))
    return None


def is_fail(stmt: ast.stmt) -> bool:
    """`assert False`, `self.fail(...)`, `pytest.fail(...)`, `raise AssertionError(...)`."""
    if isinstance(stmt, ast.Assert):
        return isinstance(stmt.test, ast.Constant) and not stmt.test.value
    if isinstance(stmt, ast.Expr):
        return is_call_to(stmt.value, {"fail"})
    if isinstance(stmt, ast.Raise) and stmt.exc is not None:
        exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
        return isinstance(exc, ast.Name) and exc.id in ("AssertionError", "Exception")
    return False


def render(stmts: list[ast.stmt], notes: list[str]) -> list[str]:
    out = []
    for line in ast.unparse(ast.Module(stmts, [])).splitlines():
        m = _NOTE_LINE.match(line)
        if m:
            indent, idx, expr = m.groups()
            out.append(f"{indent}{expr}  # {notes[int(idx)]}" if expr else f"{indent}# {notes[int(idx)]}")
        else:
            out.append(line)
    return out
