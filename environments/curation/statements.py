"""Problem statements written the way a user reports a bug, from what the failing tests show.

Everything in a statement comes from the *test side*: the assertion pytest printed (observed vs
expected), the failing test's own code as a reproduction, the test names. Library frames and the
mutated line are never quoted, so the statement says what is wrong, not where the fix is; only
hint level 3 names the file and function.

Hint levels (`meta["hint_level"]`, all four variants in `meta["statements"]`):
  0  behaviour only: what happens and what was expected
  1  + a reproduction snippet built from the failing test
  2  + the failing tests' ids
  3  + the file and function to look at
"""

from __future__ import annotations

import ast
import random
import re
import textwrap
from dataclasses import dataclass, field

from environments.curation.pytest_output import Failure

MAX_SNIPPET_LINES = 25
MAX_MESSAGE_LINES = 12
MAX_TESTS_NAMED = 5
HINT_LEVELS = (0, 1, 2, 3)

_EQ = re.compile(r"^(?:AssertionError: )?assert (.+?) == (.+)$")
_OPENINGS = (
    "I think I found a bug in {project}.",
    "Something is off in {project} {version}.",
    "{project} {version} behaves unexpectedly for me.",
    "I ran into what looks like a regression in {project}.",
    "There seems to be a bug in {project} {version}.",
)
_OBSERVED_EQ = (
    "I get `{got}`, but I expected `{want}`.",
    "The result is `{got}` where it should be `{want}`.",
    "It returns `{got}` instead of `{want}`.",
)
_OBSERVED_ERR = (
    "It fails with:\n\n```\n{message}\n```",
    "This is what I see:\n\n```\n{message}\n```",
    "Instead of working, it gives:\n\n```\n{message}\n```",
)
_REPRO = (
    "To reproduce:\n\n```python\n{snippet}\n```",
    "Minimal example:\n\n```python\n{snippet}\n```",
    "Here is what I run:\n\n```python\n{snippet}\n```",
)


@dataclass
class FailedTest:
    test_id: str  # pytest node id
    failure: Failure | None
    source: str | None = None  # the test module's source, for the reproduction snippet
    params: dict[str, str] = field(default_factory=dict)  # parametrize name -> repr(value)

    @property
    def path(self) -> str:
        return self.test_id.split("::", 1)[0]


def _test_function(module: ast.Module, test_id: str) -> ast.FunctionDef | None:
    """The function a node id names (`path::Class::test[param]`)."""
    parts = test_id.split("::")[1:]
    if not parts:
        return None
    parts[-1] = parts[-1].split("[", 1)[0]
    scope: list[ast.stmt] = module.body
    for i, name in enumerate(parts):
        found = next((n for n in scope if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and n.name == name), None)
        if found is None:
            return None
        if i == len(parts) - 1:
            return found if isinstance(found, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
        if not isinstance(found, ast.ClassDef):
            return None
        scope = found.body
    return None


def _used_imports(module: ast.Module, source: str, names: set[str]) -> list[str]:
    out = []
    for node in module.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound = {(a.asname or a.name).split(".")[0] for a in node.names}
            if bound & names:
                out.append(ast.get_source_segment(source, node) or "")
    return [line for line in out if line]


def reproduction(test: FailedTest) -> str | None:
    """The failing test's body up to the line that failed, with the imports it uses."""
    if not test.source:
        return None
    try:
        module = ast.parse(test.source)
    except SyntaxError:
        return None
    func = _test_function(module, test.test_id)
    if func is None or not func.body:
        return None
    lines = test.source.splitlines()
    first = func.body[0]
    if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant) and len(func.body) > 1:
        first = func.body[1]  # skip the docstring
    last = func.body[-1].end_lineno or first.lineno
    path = test.path
    if test.failure:  # stop at the line that failed, when the traceback points into this test
        fail_lines = [f.line for f in test.failure.frames if f.path == path and first.lineno <= f.line <= last]
        if fail_lines:
            stmt = next((s for s in ast.walk(func) if isinstance(s, ast.stmt) and s is not func
                         and s.lineno <= fail_lines[0] <= (s.end_lineno or s.lineno)
                         and not isinstance(s, (ast.With, ast.For, ast.While, ast.If, ast.Try))), None)
            last = (stmt.end_lineno if stmt else fail_lines[0]) or last
    body = textwrap.dedent("\n".join(lines[first.lineno - 1: last]))
    body_lines = body.splitlines()
    if len(body_lines) > MAX_SNIPPET_LINES:
        body_lines = ["..."] + body_lines[-MAX_SNIPPET_LINES:]
    names = {n.id for stmt in func.body for n in ast.walk(stmt) if isinstance(n, ast.Name)}
    imports = _used_imports(module, test.source, names)
    # a parametrised test's arguments become assignments, so the snippet runs on its own
    args = [a.arg for a in func.args.args if a.arg in test.params and a.arg in names]
    assigns = [f"{a} = {test.params[a]}" for a in args]
    head = imports + ([""] if imports else []) + assigns
    return "\n".join(head + body_lines).strip("\n")


def _actual_on_right(failure: Failure, test_path: str) -> bool:
    """`assert expected == f(x)`: the side that calls something is the observed value."""
    for frame in reversed(failure.frames):
        if frame.path != test_path:
            continue
        code = " ".join(line.strip() for line in frame.code)
        try:
            node = ast.parse(code).body[0]
        except (SyntaxError, IndexError):
            return False
        if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1:
            calls = [any(isinstance(n, ast.Call) for n in ast.walk(side))
                     for side in (node.test.left, node.test.comparators[0])]
            return calls == [False, True]
        return False
    return False


def observed(failure: Failure | None, test_path: str = "") -> tuple[str, dict[str, str]]:
    """("eq", {got, want}) when pytest showed an equality, else ("error", {message})."""
    if failure is None:
        return "error", {"message": "the check fails"}
    for line in failure.error_lines:
        m = _EQ.match(line.strip())
        if m and len(m.group(1)) < 200 and len(m.group(2)) < 200:
            got, want = m.group(1), m.group(2)
            if _actual_on_right(failure, test_path):
                got, want = want, got
            return "eq", {"got": got, "want": want}
    lines: list[str] = []
    for line in failure.error_lines:  # chained exceptions repeat their message: keep it once
        if line.strip() and line not in lines:
            lines.append(line)
    lines = lines[:MAX_MESSAGE_LINES]
    return "error", {"message": "\n".join(lines) or failure.exc_type or "the check fails"}


def _representative(tests: list[FailedTest]) -> FailedTest:
    """An equality assertion reads best; then a test whose code we can show; then any."""
    def score(t: FailedTest) -> tuple[int, int, str]:
        kind, _ = observed(t.failure, t.path)
        return (0 if kind == "eq" else 1, 0 if t.source else 1, t.test_id)
    return min(tests, key=score)


def statements(project: str, version: str, tests: list[FailedTest], where: list[tuple[str, str]],
               seed: int = 0) -> dict[int, str]:
    """The four hint-level variants of one bug report (the same wording at every level);
    `where` lists the (file, function) pairs that level 3 names."""
    rng = random.Random(seed)
    main = _representative(tests)
    kind, values = observed(main.failure, main.path)
    parts0 = [rng.choice(_OPENINGS).format(project=project, version=version)]
    parts0.append(rng.choice(_OBSERVED_EQ if kind == "eq" else _OBSERVED_ERR).format(**values))
    snippet = reproduction(main)
    parts1 = list(parts0)
    if snippet:
        parts1.insert(1, rng.choice(_REPRO).format(snippet=snippet))
    named = [t.test_id for t in tests][:MAX_TESTS_NAMED]
    more = len(tests) - len(named)
    tests_line = ("These tests fail: " + ", ".join(f"`{t}`" for t in named)
                  + (f" (and {more} more)" if more > 0 else "") + ".")
    parts2 = parts1 + [tests_line]
    places = [f"`{function}` in `{path}`" for path, function in dict.fromkeys(where)]
    parts3 = parts2 + ["The problem seems to be in " + " and ".join(places) + "."]
    return {level: "\n\n".join(parts) for level, parts in enumerate((parts0, parts1, parts2, parts3))}
