"""A failing test turned into the script a user would paste into a bug report.

A user does not write `self.assertEqual(slugify(x), 'a-b')`; they write `slugify(x)` and say what
they expected. So the test's code up to the step that failed is rewritten, never quoted (the
rules: `build`). Everything comes from the test file: the library's code, where the bug is, is
never read here.
"""

from __future__ import annotations

import ast
import copy
import functools
from dataclasses import dataclass, field

from environments.curation.checks import NOTE, CheckRewriter, Fold, Placeholders, render
from environments.curation.pyast import (
    BUILTINS, CAPTURE, DEFS, EQUAL_CHECKS, RAISES_CHECKS, backward_slice, bound, code_calls,
    is_call_to, is_check, is_code_call, is_self, loaded, orient, params_of, replace_names, self_attrs,
)
from environments.rewrite import parse_python

MAX_HELPER_LINES = 12  # a module-level helper longer than this is not copied in
MAX_TITLE_CALL = 60
MAX_INLINE = 40  # a value up to this long is written into the call, not assigned
_COMPOUND = (ast.With, ast.AsyncWith, ast.For, ast.AsyncFor, ast.While, ast.If, ast.Try)
_PYTEST_FIXTURES = CAPTURE | {"tmp_path", "tmpdir", "monkeypatch", "request", "caplog", "recwarn"}


@dataclass
class Repro:
    code: str  # the script
    call: str | None  # the library call of the failing step, as code (for a title)
    expected: str | None  # what the failing step expected, as code
    raises: str | None  # the exception the failing step expected
    actual_first: bool = True  # an equality's observed value is its left side
    observed: str | None = None  # the failing step's observed expression, when short
    observed_call: bool = False  # ... and it is a call
    observed_code: bool = False  # ... and it calls into code (not `result.attr`, `len(x)`)
    undefined: list[str] = field(default_factory=list)  # names the script uses but cannot define
    indirect: bool = False  # the failed check is in a callback the failing step triggers


def _body(func: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.stmt]:
    body = func.body
    if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return body


def _step_at(body: list[ast.stmt], line: int | None) -> int:
    """Index of the statement of `body` holding `line` (else the last check, else the last)."""
    if line is not None:
        for i, s in enumerate(body):
            if s.lineno <= line <= (s.end_lineno or s.lineno):
                return i
    checks = [i for i, s in enumerate(body) if is_check(s)]
    return checks[-1] if checks else len(body) - 1


def _innermost(stmt: ast.stmt, line: int | None) -> ast.stmt:
    """The simple statement on the failing line inside a compound one (a loop, a `with`)."""
    line = line or stmt.end_lineno or stmt.lineno
    best = stmt
    for n in ast.walk(stmt):
        if isinstance(n, ast.stmt) and not isinstance(n, (*_COMPOUND, *DEFS)) \
                and n.lineno <= line <= (n.end_lineno or n.lineno):
            best = n
    return best


def _setup_of(cls: ast.ClassDef | None, attrs: set[str]) -> list[ast.stmt]:
    """Class attributes and `setUp` / `setup_method` statements that set `attrs` (as `self.x`)."""
    if cls is None or not attrs:
        return []
    out: list[ast.stmt] = []
    for node in cls.body:
        if isinstance(node, ast.Assign) and bound(node) & attrs:
            out.append(node)
        elif isinstance(node, ast.FunctionDef) and node.name in ("setUp", "setup_method", "setup"):
            out += backward_slice(node.body, attrs)
    return out


def _is_fixture(node: ast.AST) -> bool:
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
        "fixture" in ast.unparse(d) for d in node.decorator_list)


def _fixtures(module: ast.Module, cls: ast.ClassDef | None, names: set[str]) -> list[ast.stmt]:
    """`name = value` for fixtures of the test file among `names` whose body is just
    `return value` / `yield value` (a fixture's own fixtures resolved once more)."""
    scopes = module.body + (cls.body if cls else [])
    out: list[ast.stmt] = []
    for depth in range(2):
        found = []
        for node in scopes:
            if _is_fixture(node) and node.name in names and "request" not in params_of(node):  # type: ignore
                body = _body(node)  # type: ignore[arg-type]
                last = body[-1] if len(body) == 1 else None
                if isinstance(last, ast.Expr) and isinstance(last.value, ast.Yield):
                    last = last.value  # `yield value` gives the test `value` as `return value` would
                value = last.value if isinstance(last, (ast.Return, ast.Yield)) else None
                if value is not None:
                    found.append(ast.Assign([ast.Name(node.name, ast.Store())], value, lineno=0))  # type: ignore
        out = found + out
        names = set().union(*(loaded(s) for s in found)) if found else set()
        if not names:
            break
    return out


def _helpers(module: ast.Module, names: set[str]) -> list[ast.stmt]:
    """Small module-level definitions of the test file that the script uses (one level deep)."""
    out: list[ast.stmt] = []
    for node in module.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) or not (bound(node) & names) or _is_fixture(node):
            continue
        if isinstance(node, DEFS) and node.name.startswith(("Test", "test")):
            continue
        if (node.end_lineno or node.lineno) - node.lineno + 1 <= MAX_HELPER_LINES:
            out.append(node)
    return out


def _private(module: str) -> bool:
    return any(p.startswith("_") and not p.startswith("__") for p in module.split("."))


def _is_test_module(name: str) -> bool:
    parts = name.split(".")
    return any(p in ("tests", "test", "testing", "conftest") or p.startswith("test_") for p in parts)


def _imports(module: ast.Module, names: set[str]) -> list[ast.stmt]:
    """The test module's imports of `names`: public names of real packages only."""
    out: list[ast.stmt] = []
    for node in module.body:
        if isinstance(node, ast.ImportFrom):
            if node.level or not node.module or _is_test_module(node.module) or _private(node.module):
                continue
            keep = [a for a in node.names if (a.asname or a.name) in names and not a.name.startswith("_")]
            if keep:
                out.append(ast.ImportFrom(node.module, keep, 0))
        elif isinstance(node, ast.Import):
            keep = [a for a in node.names if (a.asname or a.name).split(".")[0] in names
                    and not _is_test_module(a.name) and not _private(a.name)]
            if keep:
                out.append(ast.Import(keep))
    # names a single `from pkg.mod import *` brought in, spelled out
    covered = set().union(*(bound(n) for n in out))
    stars = [n.module for n in module.body if isinstance(n, ast.ImportFrom) and n.module and not n.level
             and any(a.name == "*" for a in n.names) and not _is_test_module(n.module) and not _private(n.module)]
    starred = sorted(names - covered - BUILTINS - {n for n in names if n.startswith("_")})
    if len(stars) == 1 and starred:
        out.append(ast.ImportFrom(stars[0], [ast.alias(n) for n in starred], 0))
        covered |= set(starred)
    # a parameter's repr names its package (`isodate.Duration(...)`): the test imported from it
    packages = {m.split(".")[0] for n in module.body for m in
                ([n.module] if isinstance(n, ast.ImportFrom) and n.module and not n.level else
                 [a.name for a in n.names] if isinstance(n, ast.Import) else [])
                if not _is_test_module(m) and not _private(m)}
    out += [ast.Import([ast.alias(p)]) for p in sorted((names - covered) & packages)]
    return out


def _literal(text: str) -> ast.expr | None:
    try:
        return parse_python(text, mode="eval").body
    except SyntaxError:
        return None


def _call_of(roots: list[ast.AST], data: set[str]) -> ast.Call | None:
    """The library call a step makes: in the first of `roots` that makes one, the outermost
    call into code."""
    for root in roots:
        for n in ast.walk(root):
            if is_code_call(n, data):
                return n  # type: ignore[return-value]
    return None


def _expectation(step: ast.stmt, enclosing: ast.stmt, data: set[str]
                 ) -> tuple[ast.expr | None, ast.expr | None, str | None, bool]:
    """(observed expr, expected expr, expected exception, observed is the left side) of the
    failing step."""
    raises = None
    for n in ast.walk(enclosing):  # a `with pytest.raises(E):` around the failing step
        if isinstance(n, ast.With) and n.lineno <= step.lineno <= (n.end_lineno or n.lineno):
            for item in n.items:
                c = item.context_expr
                if isinstance(c, ast.Call) and is_call_to(c, RAISES_CHECKS | {"raises"}) and c.args:
                    raises = ast.unparse(c.args[0])
    if isinstance(step, ast.Expr) and isinstance(step.value, ast.Call) \
            and is_call_to(step.value, RAISES_CHECKS | {"raises"}) and step.value.args:
        return None, None, ast.unparse(step.value.args[0]), True
    pair: tuple[ast.expr, ast.expr] | None = None
    if isinstance(step, ast.Assert) and isinstance(step.test, ast.Compare) and len(step.test.ops) == 1 \
            and isinstance(step.test.ops[0], (ast.Eq, ast.Is)):
        pair = (step.test.left, step.test.comparators[0])
    elif isinstance(step, ast.Expr) and is_check(step) and isinstance(step.value, ast.Call) \
            and step.value.func.attr in EQUAL_CHECKS and len(step.value.args) >= 2:  # type: ignore[attr-defined]
        pair = (step.value.args[0], step.value.args[1])
    if pair:
        actual, want = orient(*pair, data)
        return actual, want, raises, actual is pair[0]
    if isinstance(step, ast.Expr) and is_check(step) and isinstance(step.value, ast.Call) and step.value.args:
        return step.value.args[0], None, raises, True  # `self.assertTrue(x)`: x is what was seen
    if isinstance(step, (ast.Assert, ast.Expr, ast.Assign)):
        return (step.test if isinstance(step, ast.Assert) else step.value), None, raises, True
    return None, None, raises, True


def _short(node: ast.expr | None, values: dict[str, ast.expr], limit: int = MAX_TITLE_CALL,
           excinfo: set[str] = frozenset()) -> str | None:
    if node is None:
        return None
    text = ast.unparse(replace_names(node, values, excinfo))
    return text if len(text) <= limit else None


@functools.lru_cache(maxsize=32)
def _parse(source: str) -> ast.Module | None:
    """Parsed once per test file: a task's failing tests mostly share one (never mutated here)."""
    try:
        return parse_python(source)  # without warnings: a test file's own `'\/'` is not our concern
    except SyntaxError:
        return None


def test_function(module: ast.Module, test_id: str) -> tuple[ast.ClassDef | None, ast.FunctionDef | None]:
    """(enclosing class, function) a node id names (`path::Class::test[param]`)."""
    parts = test_id.split("::")[1:]
    if not parts:
        return None, None
    parts[-1] = parts[-1].split("[", 1)[0]
    scope: list[ast.stmt] = module.body
    cls = None
    for i, name in enumerate(parts):
        found = next((n for n in scope if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and n.name == name), None)
        if found is None:  # inherited: a mixin class of this file (the traceback said which file)
            return next(((c, m) for c in module.body if isinstance(c, ast.ClassDef) for m in c.body
                         if isinstance(m, ast.FunctionDef) and m.name == parts[-1]), (cls, None))
        if i == len(parts) - 1:
            is_func = isinstance(found, (ast.FunctionDef, ast.AsyncFunctionDef))
            return cls, found if is_func else None  # type: ignore[return-value]
        if not isinstance(found, ast.ClassDef):
            return cls, None
        cls, scope = found, found.body
    return cls, None


def _helper_call(step: ast.stmt, name: str) -> ast.Call | None:
    for n in ast.walk(step):
        if isinstance(n, ast.Call) and (
                (isinstance(n.func, ast.Name) and n.func.id == name)
                or (isinstance(n.func, ast.Attribute) and is_self(n.func.value) and n.func.attr == name)):
            return n
    return None


def _bind(helper: ast.FunctionDef, call: ast.Call) -> list[tuple[str, ast.expr]]:
    """The helper's parameters paired with the call's arguments (no *args/**kwargs)."""
    names = [a.arg for a in helper.args.posonlyargs + helper.args.args]
    if names and names[0] == "self":
        names = names[1:]
    pairs = list(zip(names, call.args))
    pairs += [(k.arg, k.value) for k in call.keywords if k.arg]
    return pairs


def _steps(module: ast.Module, cls: ast.ClassDef | None, func: ast.FunctionDef,
           frames: list[tuple[str, int]]) -> tuple[list[ast.stmt], ast.stmt, ast.stmt, list[str]] | None:
    """(statements to run, the failing statement, the simple statement that failed in it,
    names that hold data) for a test whose traceback went through `frames` of its file."""
    body = _body(func)
    if not body:
        return None
    fixed = set().union(*(bound(n) for n in module.body if isinstance(n, (ast.Import, ast.ImportFrom, *DEFS))))
    fixed -= set(params_of(func))  # a fixture argument shadows the module's fixture function
    test_lines = [line for fn, line in frames if fn == func.name]
    idx = _step_at(body, test_lines[-1] if test_lines else None)
    failing = body[idx]
    last = frames[-1] if frames else None
    if last and last[0] != func.name:  # the check that failed is in a helper of the test file
        helper = next((n for n in module.body + (cls.body if cls else [])
                       if isinstance(n, ast.FunctionDef) and n.name == last[0] and not _is_fixture(n)), None)
        call = _helper_call(failing, last[0]) if helper else None
        if helper is not None and call is not None and _body(helper):
            hbody = _body(helper)
            hidx = _step_at(hbody, last[1])
            pairs = _bind(helper, call)
            before = backward_slice(body[:idx], loaded(call) | self_attrs(call), fixed)
            binds: list[ast.stmt] = [ast.Assign([ast.Name(n, ast.Store())], v, lineno=0) for n, v in pairs]
            inner = backward_slice(hbody[:hidx], loaded(hbody[hidx]) | self_attrs(hbody[hidx]), fixed)
            last_step = hbody[hidx]
            if isinstance(last_step, ast.Return) and last_step.value is not None:  # the script has no caller
                last_step = ast.copy_location(ast.Expr(last_step.value), last_step)
            return before + binds + inner + [last_step], last_step, _innermost(last_step, last[1]), \
                [n for n, _ in pairs]
    steps = backward_slice(body[:idx], loaded(failing) | self_attrs(failing), fixed) + [failing]
    return steps, failing, _innermost(failing, test_lines[-1] if test_lines else None), []


def _indirect(func: ast.FunctionDef, frames: list[tuple[str, int]]) -> bool:
    """The check that failed is in code the test defines inside itself (a callback, a nested
    class): what the failing step returns is not what the check saw."""
    return bool(frames) and frames[-1][0] != func.name and any(
        isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == frames[-1][0]
        for n in ast.walk(func) if n is not func)


def _whatever(module: ast.Module) -> set[str]:
    """Names imported from the `whatever` package (funcy's tests write `_ * 2` for a lambda)."""
    return {a.asname or a.name for n in module.body if isinstance(n, ast.ImportFrom) and n.module == "whatever"
            for a in n.names}


def _literal_names(steps: list[ast.stmt]) -> dict[str, ast.expr]:
    """Names the steps assign a literal once (`expected = {(2, 2)}`): data, not code."""
    out: dict[str, ast.expr] = {}
    counts: dict[str, int] = {}
    for s in steps:
        for name in bound(s):
            counts[name] = counts.get(name, 0) + 1
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name):
            try:
                ast.literal_eval(s.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
            out[s.targets[0].id] = s.value
    return {n: v for n, v in out.items() if counts.get(n) == 1}


def _drop_unused(stmts: list[ast.stmt]) -> list[ast.stmt]:
    """Without assignments of call-free values nothing after reads (the rewrite spelled them out)."""
    keep: list[ast.stmt] = []
    used: set[str] = set()
    for s in reversed(stmts):
        if isinstance(s, ast.Assign) and all(isinstance(t, ast.Name) for t in s.targets) \
                and not any(isinstance(n, ast.Call) for n in ast.walk(s.value)) and not bound(s) & used:
            continue
        keep.append(s)
        used |= loaded(s)
    return keep[::-1]


@dataclass
class _Bindings:
    """What the test's arguments become in the script."""

    args: list[str]  # the test function's own arguments
    params: dict[str, str]  # parametrize name -> repr(value)
    values: dict[str, ast.expr]  # the parameters whose repr is a literal
    inline: dict[str, ast.expr]  # short values, written where they are used
    opaque: set[str]  # parameters whose value is not code (`<Foo object>`)


def build(source: str, test_id: str, frames: list[tuple[str, int]] | None = None,
          params: dict[str, str] | None = None) -> Repro | None:
    """The reproduction of one failing test (None when its code cannot be found). `frames`:
    (function, line) of the traceback's frames in the test file, outermost first.

    - checks (`assert`, `self.assert*`, `pytest.raises`, `try/except/else: fail`) become the call
      they check, printed, with the expectation as a comment (`print(f(x))  # expected: 3`);
    - earlier steps the failing one does not depend on are left out (a backward slice over names),
      so a forty-line test gives a five-line script;
    - parametrised arguments become values, simple fixtures of the test file and `self.x` set in
      `setUp` become assignments, small module-level helpers the script calls are copied in, and
      when the failing check sits in a helper of the test file (`_check(a, b)`), the helper's body
      is the script, its parameters bound to the test's arguments;
    - imports are only those the script uses, never of private names or modules (`from m import
      _x`, `m._private`) nor of the test suite's own modules.
    """
    module = _parse(source)
    if module is None:
        return None
    cls, func = test_function(module, test_id)
    if func is None:
        return None
    found = _steps(module, cls, func, frames or [])
    if found is None:
        return None
    steps, failing, step, bound_args = found
    params = params or {}
    args = [a.arg for a in func.args.args + func.args.kwonlyargs if a.arg != "self"]
    values = {n: v for n in args if n in params for v in [_literal(params[n])] if v is not None}
    data = set(params) | set(bound_args) | _PYTEST_FIXTURES
    steps, inline, rebound = _inline_short_values(steps, values)
    literals = _literal_names(steps)
    data |= set(literals)
    names = _Bindings(args, params, values, inline, {n for n in args if n in params and n not in values})
    rewrite = CheckRewriter({**literals, **{n: v for n, v in values.items() if n not in rebound}}, data,
                            {n: params[n] for n in names.opaque})
    stmts = _rewritten_steps(module, steps, names, rewrite)
    lines, used, known = _script_lines(module, cls, steps, stmts, names, rewrite)
    actual, want, raises, actual_first = _expectation(step, failing, data)
    call = _call_of([n for n in (actual, step) if n is not None] + steps[::-1], data)
    return Repro(
        code="\n".join(lines).strip("\n"),
        call=_short(call, inline) or (f"{ast.unparse(replace_names(call.func, {}))}()" if call is not None else None),
        expected=rewrite.say(want) if want is not None and len(rewrite.say(want)) <= 200 else None,
        raises=raises,
        actual_first=actual_first,
        observed=_short(actual, inline, excinfo=rewrite.excinfo),
        observed_call=isinstance(actual, ast.Call),
        observed_code=actual is not None and code_calls(actual, data) > 0,
        undefined=sorted(used - known),
        indirect=_indirect(func, frames or []),
    )


def _inline_short_values(steps: list[ast.stmt], values: dict[str, ast.expr]
                         ) -> tuple[list[ast.stmt], dict[str, ast.expr], set[str]]:
    """Short values are written where they are used, unless the steps rebind the name; the
    helper's parameters (assignments `_steps` made, line 0) likewise. Returns the steps left,
    the inlined values and the names the steps rebind."""
    made = [s for s in steps if isinstance(s, ast.Assign) and s.lineno == 0]
    rebound = set().union(*(bound(s) for s in steps if s not in made))
    inline = {n: v for n, v in values.items() if len(ast.unparse(v)) <= MAX_INLINE and n not in rebound}
    for s in made:
        value = replace_names(s.value, inline)
        s.value = value  # type: ignore[assignment]
        if len(ast.unparse(value)) <= MAX_INLINE and s.targets[0].id not in rebound:  # type: ignore[union-attr]
            inline[s.targets[0].id] = value  # type: ignore[union-attr]
    steps = [s for s in steps if not (s in made and s.targets[0].id in inline)]  # type: ignore[union-attr]
    return steps, inline, rebound


def _rewritten_steps(module: ast.Module, steps: list[ast.stmt], names: _Bindings,
                     rewrite: CheckRewriter) -> list[ast.stmt]:
    """The steps with values inlined, checks turned into printed calls, unused data dropped."""
    copies = [replace_names(s, names.inline) for s in steps]  # copies: the module is cached
    if "_" in _whatever(module):
        copies = [Placeholders().visit(s) for s in copies]
    fold = Fold(names.opaque)
    copies = [t for s in copies for t in (lambda r: r if isinstance(r, list) else [r])(fold.visit(s))]
    return _drop_unused(rewrite.block(copies))


def _script_lines(module: ast.Module, cls: ast.ClassDef | None, steps: list[ast.stmt], stmts: list[ast.stmt],
                  names: _Bindings, rewrite: CheckRewriter) -> tuple[list[str], set[str], set[str]]:
    """The script around the rewritten steps: imports, helpers, `setUp`, fixtures and parameter
    values they use. Returns its lines, the names it reads and the names it can define."""
    used = set().union(*(loaded(s) for s in stmts))
    attrs = set().union(*(self_attrs(s) for s in steps))
    setup = rewrite.block([replace_names(s, {}) for s in _setup_of(cls, attrs)]) if attrs & used else []  # type: ignore
    setup = [s for s in setup if not isinstance(s, ast.Pass)]
    used |= set().union(*(loaded(s) for s in setup)) if setup else set()
    fixtures = _fixtures(module, cls, (used & set(names.args)) - set(names.params))
    used |= set().union(*(loaded(s) for s in fixtures)) if fixtures else set()
    assigns: list[ast.stmt] = [ast.Assign([ast.Name(n, ast.Store())], v, lineno=0)
                               for n, v in names.values.items() if n in used and n not in names.inline]
    defined = set().union(*(bound(s) for s in stmts + setup + assigns + fixtures))
    helpers = rewrite.block([copy.deepcopy(h) for h in _helpers(module, used - defined)]) if used - defined else []
    helpers = [h for h in helpers if not isinstance(h, ast.Pass)]
    for h in helpers:
        used |= loaded(h)
    defined |= set().union(*(bound(h) for h in helpers)) if helpers else set()
    imports = _imports(module, used - defined)
    known = defined | set().union(*(bound(s) for s in helpers + imports)) | BUILTINS | names.opaque | {NOTE}
    head = render(imports + helpers, rewrite.notes)
    # a parameter whose value is not code (`<Foo object>`) is said in a comment
    opaque = [f"# {n} = {names.params[n]}" for n in sorted(names.opaque & used)]
    lines = head + ([""] if head else []) + opaque + render(fixtures + assigns + setup + stmts, rewrite.notes)
    return lines, used, known
