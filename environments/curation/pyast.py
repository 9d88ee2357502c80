"""What a piece of test code reads, binds, changes and calls: the name analysis that turning a
test into a user's script (`checks`, `repro`) rests on.

Tests are data plus calls. A call into code (`parse(x)`, `cache.expire(now)`) is what a bug
report is about; a builtin or a method of the test's own data (`len(x)`, `param.strip()`) is not.
A comparison's observed side is the one that is not an expectation (a literal, a parameter, a
name like `expected`). A step is kept in a reproduction when it binds or may change an object a
later step needs (`backward_slice`).
"""

from __future__ import annotations

import ast
import builtins
import copy
import re

BUILTINS = set(dir(builtins))
EQUAL_CHECKS = {"assertEqual", "assertEquals", "assertListEqual", "assertDictEqual", "assertTupleEqual",
                "assertSetEqual", "assertSequenceEqual", "assertMultiLineEqual", "assertIs"}
TRUTH_CHECKS = {"assertTrue": "True", "assertFalse": "False", "assertIsNone": "None",
                "assertIsNotNone": "not None", "assert_": "True", "failUnless": "True"}
RAISES_CHECKS = {"assertRaises", "assertRaisesRegex", "assertRaisesRegexp", "assertWarns", "assertWarnsRegex"}
CHECKERS = RAISES_CHECKS | {"raises", "warns", "approx"}  # not calls into code
_EXPECTED_NAME = re.compile(r"^(exp|expected|expect|want|wanted|correct|golden|reference|ref)(_\w*)?$")
CAPTURE = {"capsys", "capfd"}  # pytest fixtures reading what earlier steps printed
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def walk_scope(node: ast.AST) -> list[ast.AST]:
    """`ast.walk` that does not enter nested functions, classes and lambdas (their names are
    their own), though it yields the nested node itself."""
    out, todo = [], [node]
    while todo:
        n = todo.pop()
        out.append(n)
        if n is node or not isinstance(n, SCOPES):
            todo.extend(ast.iter_child_nodes(n))
    return out


def params_of(f: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[str]:
    a = f.args
    return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x]


def loaded(node: ast.AST) -> set[str]:
    """Names a statement reads (a nested function counts with the free names of its body)."""
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    for f in ast.walk(node):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            names -= set(params_of(f))
    return names


def bound(node: ast.AST) -> set[str]:
    """Names a statement binds (assignments, loop and `with` targets, imports, defs; `self.x`
    counts as `x`, which is what the script will call it)."""
    if isinstance(node, DEFS):
        return {node.name}
    out: set[str] = set()
    for n in walk_scope(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            out.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and is_self(n.value):
            out.add(n.attr)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in n.names}
        elif isinstance(n, DEFS) and n is not node:
            out.add(n.name)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            out.add(n.name)
    return out


def chain_root(node: ast.expr) -> ast.expr:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def changed(stmt: ast.stmt) -> set[str]:
    """Names whose objects a statement may change without rebinding them: the object of an
    item or attribute assignment; outside assignments, anything a method is called on or that
    is passed to a call (`s.add(1)`, `random.shuffle(xs)`), but not a function being called."""
    if isinstance(stmt, (*DEFS, ast.Import, ast.ImportFrom)) or is_check(stmt):
        return set()
    out: set[str] = set()
    if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        roots = [chain_root(t) for t in targets if isinstance(t, (ast.Attribute, ast.Subscript))]
        out = {r.id for r in roots if isinstance(r, ast.Name)}
        # `items = cache.expire(now)` changes `cache` too (an argument passed along is read, here)
        calls = [n for n in ast.walk(stmt.value) if isinstance(n, ast.Call)] if stmt.value else []
        roots = [chain_root(c.func) for c in calls if isinstance(c.func, ast.Attribute)]
        return out | {r.id for r in roots if isinstance(r, ast.Name)}
    called = {id(c.func) for c in ast.walk(stmt) if isinstance(c, ast.Call)}
    return out | {n.id for n in walk_scope(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                  and id(n) not in called}


def is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def self_attrs(node: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and is_self(n.value)}


def is_call_to(node: ast.AST, names: set[str]) -> bool:
    """`self.assertX(...)` / `pytest.raises(...)` / `raises(...)` for X in names."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr in names) or (isinstance(f, ast.Name) and f.id in names)


def is_check(stmt: ast.stmt) -> bool:
    """A statement that only checks (an assertion), as opposed to one that does something."""
    if isinstance(stmt, ast.Assert):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        f = stmt.value.func
        return isinstance(f, ast.Attribute) and is_self(f.value) and f.attr.startswith(("assert", "fail"))
    return False


def is_code_call(node: ast.AST, data: set[str]) -> bool:
    """A call into code (the library's), not to a builtin nor a method of the test's data:
    `f(x)` and `mod.f(x)` are, `len(x)`, `'a'.upper()` and `param.strip()` are not."""
    if not isinstance(node, ast.Call) or is_call_to(node, CHECKERS):
        return False
    if isinstance(node.func, ast.Attribute) and node.func.attr.startswith(("assert", "fail")):
        return False  # unittest's checks
    root = chain_root(node.func)
    return isinstance(root, ast.Name) and root.id not in BUILTINS and root.id not in data


def code_calls(node: ast.AST, data: set[str]) -> int:
    return sum(is_code_call(c, data) for c in ast.walk(node))


def expected_like(node: ast.expr, data: set[str]) -> bool:
    """A side of a comparison that reads as the expectation: a literal, a test parameter, or a
    name such as `expected`."""
    if isinstance(node, ast.Name):
        return node.id in data or bool(_EXPECTED_NAME.match(node.id))
    try:
        ast.literal_eval(node)
        return True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass  # an expression over the test's data alone (`param.replace('-', sep)`) reads as one too
    names = loaded(node)
    return names <= data | BUILTINS and not code_calls(node, data)


def orient(left: ast.expr, right: ast.expr, data: set[str] = frozenset()) -> tuple[ast.expr, ast.expr]:
    """(observed, expected) of a comparison: the left side by convention, unless it reads as
    an expectation and the right one does not (`assert 16 == area(4, 4)`)."""
    if expected_like(left, data) and not expected_like(right, data):
        return right, left
    return left, right


def replace_names(node: ast.AST, values: dict[str, ast.expr], excinfo: set[str] = frozenset()) -> ast.AST:
    """A copy of `node` with names in `values` written as their values, `self.x` as `x`, and
    `info.value` of a `pytest.raises(...) as info` as `info` (the script binds the exception)."""
    class Sub(ast.NodeTransformer):
        def visit_Name(self, n: ast.Name) -> ast.AST:
            return copy.deepcopy(values[n.id]) if isinstance(n.ctx, ast.Load) and n.id in values else n

        def visit_Attribute(self, n: ast.Attribute) -> ast.AST:
            if is_self(n.value) and not n.attr.startswith(("assert", "fail")):  # checks: rewritten later
                return ast.Name(n.attr, n.ctx)
            if isinstance(n.value, ast.Name) and n.value.id in excinfo and n.attr == "value":
                return ast.Name(n.value.id, n.ctx)
            return self.generic_visit(n)
    return Sub().visit(copy.deepcopy(node))


def backward_slice(stmts: list[ast.stmt], needed: set[str], fixed: set[str] = frozenset()) -> list[ast.stmt]:
    """The statements of `stmts` (in order) that the code needing `needed` depends on: those
    binding a needed name or changing its object, and what they need in turn. `fixed` names
    (imported modules, classes, functions) are used, never changed, by a call."""
    keep: list[ast.stmt] = []
    needed = set(needed)
    for stmt in reversed(stmts):
        prints = bool(needed & CAPTURE) and isinstance(stmt, ast.Expr) and not is_check(stmt)
        if prints or (bound(stmt) | (changed(stmt) - fixed)) & needed:
            keep.append(stmt)
            needed |= loaded(stmt) | self_attrs(stmt)
    return keep[::-1]
