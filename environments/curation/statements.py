"""Problem statements written the way a user reports a bug, from what the failing tests show.

A statement is a title, a sentence of context, a short reproduction (`repro.build`), and what
happened against what was expected, in prose. Everything comes from the *test side*: pytest's
report and the test's own code; the mutated line is never quoted, so the statement says what is
wrong, not where the fix is. Hint levels (all four in `meta["statements"]`):
  0  title and behaviour only: what happens and what was expected
  1  + the reproduction script
  2  + the failing tests' ids
  3  + the file and function to look at
(level 4, the wrong line quoted too, is derived at load time: environments/hints.py)
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from environments.curation.pytest_output import Failure
from environments.curation.repro import Repro, build

MAX_SNIPPET_LINES = 40  # a longer reproduction is left out (hint level 1 is then level 0)
MAX_MESSAGE_LINES = 12
MAX_LINE = 300  # a message line is cut here (pytest -vv prints compared values whole)
MAX_EQ_VALUE = 1000  # longer compared values are not worth quoting
MAX_TESTS_NAMED = 5
MAX_VALUE = 80  # longer observed / expected values go in a code block, not inline
MAX_TITLE_VALUE = 40  # longer ones are not repeated in the title
HINT_LEVELS = (0, 1, 2, 3)  # stored with every task (level 4 is derived: environments.hints)

_EQ = re.compile(r"^(?:AssertionError: )?assert (.+?) (?:==|is) (.+)$")
_UNITTEST_EQ = re.compile(r"^AssertionError: (?:\w+ differ: )?(.+?) != (.+)$")
_NOT_RAISED = (re.compile(r"^Failed: DID NOT (?:RAISE|WARN) (?:<class '([\w.]+)'>|(.+))"),
               re.compile(r"^AssertionError: (\w+) not (?:raised|triggered)"))

_OPENINGS = (
    "I think I found a bug in {project}.",
    "Something is off in {project} {version}.",
    "{project} {version} behaves unexpectedly for me.",
    "I ran into what looks like a regression in {project}.",
    "There seems to be a bug in {project} {version}.",
)
_REPRO = (
    "To reproduce:\n\n```python\n{code}\n```",
    "Minimal example:\n\n```python\n{code}\n```",
    "Here is what I run:\n\n```python\n{code}\n```",
)
_GOT_WANT = (
    "I get {got}, but I expected {want}.",
    "The result is {got} where it should be {want}.",
    "It returns {got} instead of {want}.",
)
_ERROR = (
    "It fails with:\n\n```\n{message}\n```",
    "This is what I see:\n\n```\n{message}\n```",
    "Instead of working, it gives:\n\n```\n{message}\n```",
)


@dataclass
class FailedTest:
    test_id: str  # pytest node id
    failure: Failure | None
    source: str | None = None  # the test module's source, for the reproduction
    params: dict[str, str] = field(default_factory=dict)  # parametrize name -> repr(value)
    sources: dict[str, str] = field(default_factory=dict)  # other test files, by path

    @property
    def path(self) -> str:
        return self.test_id.split("::", 1)[0]

    def code_path(self) -> str:
        """The file the test's code is in: its own, or the module of a mixin class it inherits
        (the traceback's frame of the test function says which)."""
        name = self.test_id.rsplit("::", 1)[-1].split("[", 1)[0]
        frames = self.failure.frames if self.failure else []
        return next((f.path for f in frames if f.function == name), self.path)

    def repro(self) -> Repro | None:
        path = self.code_path()
        source = self.source if path == self.path else self.sources.get(path)
        if not source:
            return None
        frames = [(f.function, f.line) for f in self.failure.frames if f.path == path] if self.failure else []
        return build(source, self.test_id, frames, self.params)


def reproduction(test: FailedTest) -> str | None:
    """The script of `test`'s reproduction (None when its code cannot be read)."""
    r = test.repro()
    return r.code if r else None


@dataclass
class Observation:
    """What the failing step showed: `kind` is "eq" (got / want values), "not_raised" (want =
    the exception), "error" (message), or "wrong" (an assertion without values)."""

    kind: str
    got: str = ""
    want: str = ""
    message: str = ""


_LOCALS = re.compile(r"\btest_\w*\.<locals>\.")  # `test_x.<locals>.f`: names the test, says nothing


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " ..."


def _message(failure: Failure) -> str:
    lines = [_cut(_LOCALS.sub("", line), MAX_LINE) for line in failure.error_lines if line.strip()]
    return "\n".join(lines[:MAX_MESSAGE_LINES] + (["..."] if len(lines) > MAX_MESSAGE_LINES else []))


def _untruncated(lines: list[str], left: str, right: str) -> tuple[str, str]:
    """pytest shortens long strings in `assert 'abc...xyz' == ...` and shows them whole in
    the diff under it (`- right`, `+ left`): take them from there when it is one line each."""
    if "..." not in left + right or not (left[:1] in "'\"" and right[:1] in "'\""):
        return left, right
    minus = [ln[4:] for ln in lines if ln.startswith("  - ")]
    plus = [ln[4:] for ln in lines if ln.startswith("  + ")]
    if len(minus) == 1 and len(plus) == 1:
        return repr(plus[0]), repr(minus[0])
    return left, right


def observe(failure: Failure | None, repro: Repro | None) -> Observation:
    """Read pytest's report of the failure, oriented by the reproduction's observed side."""
    if failure is None:
        return Observation("wrong")
    first = failure.error_lines[0].strip() if failure.error_lines else ""
    for pattern in _NOT_RAISED:
        m = pattern.match(first)
        if m:
            return Observation("not_raised", want=next(g for g in m.groups() if g))
    if failure.exc_type == "AssertionError":
        for line in failure.error_lines[:3]:
            m = _EQ.match(line.strip()) or _UNITTEST_EQ.match(line.strip())
            if m and len(m.group(1)) <= MAX_EQ_VALUE and len(m.group(2)) <= MAX_EQ_VALUE:
                got, want = _untruncated(failure.error_lines, m.group(1), m.group(2))
                if repro is not None and not repro.actual_first:
                    got, want = want, got
                return Observation("eq", got, want)
        return Observation("wrong", message=_message(failure))
    return Observation("error", message=_message(failure) or failure.exc_type)


def _code(value: str) -> str:
    return f"`{value}`" if "`" not in value else f"``{value}``"


def title(obs: Observation, repro: Repro | None, project: str) -> str:
    """One line naming the call and the symptom, like an issue title."""
    call = f"`{repro.call}`" if repro and repro.call else None
    # what the failing step evaluates (`dur1 - dur2`), else the library call it makes
    step = repro.observed if repro and repro.observed and re.search(r"\W", repro.observed) else None
    subject = f"`{step}`" if step else call or project
    if obs.kind == "eq" and repro and repro.indirect and call:  # what the step returns is not what failed
        return f"{call} passes `{_cut(obs.got, MAX_TITLE_VALUE)}` where `{_cut(obs.want, MAX_TITLE_VALUE)}` is expected"
    if obs.kind == "eq" and obs.got == obs.want:
        return f"{subject} returns a value that is not equal to the expected one"
    if obs.kind in ("eq", "wrong") and call and repro and not repro.observed_code \
            and not (obs.kind == "eq" and len(obs.got) <= MAX_TITLE_VALUE and len(obs.want) <= MAX_TITLE_VALUE):
        subject = call  # `excinfo.args[0]` says less than the call that produced it
    returns = subject == call or bool(repro and repro.observed_call)
    if obs.kind == "eq" and len(obs.got) <= MAX_TITLE_VALUE and len(obs.want) <= MAX_TITLE_VALUE:
        return f"{subject} {'returns' if returns else 'is'} {_code(obs.got)} instead of {_code(obs.want)}"
    if obs.kind == "eq" or obs.kind == "wrong":
        if subject == project:
            return f"Wrong result from {project}"
        return f"{subject} returns a wrong result" if returns else f"{subject} is not what it should be"
    if obs.kind == "not_raised":
        return f"{subject} does not raise {obs.want}"
    first = obs.message.splitlines()[0] if obs.message else ""
    exc = first.split(":", 1)[0].strip()
    if re.fullmatch(r"[\w.]+\.[A-Z]\w*", exc):  # `marshmallow.exceptions.ValidationError`
        exc = exc.rsplit(".", 1)[1]
    exc = _cut(exc, 60) or "an error"
    return f"{subject} raises {exc}" if subject != project else f"{exc} in {project}"


def behaviour(obs: Observation, repro: Repro | None, rng: random.Random) -> str:
    """Observed against expected, in prose."""
    want = repro.expected if repro else None
    if obs.kind == "eq":
        if obs.got == obs.want:  # equal reprs, unequal values
            return (f"It returns {_code(obs.got)}, which prints like the expected value but does not "
                    f"compare equal to it.")
        if max(len(obs.got), len(obs.want)) <= MAX_VALUE:
            return rng.choice(_GOT_WANT).format(got=_code(obs.got), want=_code(obs.want))
        return f"I get:\n\n```\n{obs.got}\n```\n\nbut I expected:\n\n```\n{obs.want}\n```"
    if obs.kind == "not_raised":
        return f"I expected it to raise `{obs.want}`, but nothing is raised."
    if obs.kind == "error":
        text = rng.choice(_ERROR).format(message=obs.message)
        if repro and repro.raises:
            return f"I expected `{repro.raises}`, but it fails differently:\n\n```\n{obs.message}\n```"
        if want and len(want) <= MAX_VALUE:
            return text + f"\n\nI expected it to return `{want}`."
        return text
    # an assertion that failed without an equality: say what pytest showed, in words
    said = _assertion_prose(obs.message)
    if want and len(want) <= MAX_VALUE:
        return f"I expected {_code(want)}, but that is not what I get." + (f" {said}" if said else "")
    return said or "It does not give the result I expect (see the comment in the example)."


_WHERE = re.compile(r"^\s*\+\s+where (.+?) = (.+)$")
_COMPARE = re.compile(r"^assert (.+?) (not in|in|is not|is|!=|<=|>=|<|>) (.+)$")


def _assertion_prose(message: str) -> str:
    """pytest's report of a failed `assert` (`assert False` / `+ where False = f(x)`, `assert
    'a' in 'xyz'`) as a sentence; "" when it is not one of those."""
    lines = message.splitlines()
    first = lines[0].removeprefix("AssertionError: ") if lines else ""
    if first == "Regex pattern did not match.":  # pytest.raises(..., match=...)
        said = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        if "Expected regex" in said and "Actual message" in said:
            return (f"It raises, but with the message {_cut(said['Actual message'], MAX_VALUE)}, which does not "
                    f"match {_cut(said['Expected regex'], MAX_VALUE)}.")
    where = [m.groups() for m in map(_WHERE.match, lines[1:]) if m]
    m = re.match(r"^assert (not )?(.+)$", first)
    if m and where and where[0][0] == m.group(2):
        value, expr = where[0]
        hope = "a false value" if m.group(1) else "a true value"
        return f"`{_cut(expr, MAX_VALUE)}` gives `{_cut(value, MAX_VALUE)}`, where I expected {hope}."
    m = _COMPARE.match(first)
    if m:
        a, op, b = (_cut(x, MAX_VALUE) for x in m.groups())
        return {"in": f"`{a}` is not in `{b}`.", "not in": f"`{a}` is in `{b}`, though it should not be.",
                "is": f"I get `{a}` where I expected `{b}`.", "is not": f"Both are `{a}`.",
                "!=": f"Both are `{a}`, though they should differ."}.get(op, f"`{a} {op} {b}` does not hold.")
    return ""


def _score(test: FailedTest) -> tuple[int, int, int, int, str]:
    """Prefer a failure that shows values, with a reproduction that runs on its own (no
    fixture or helper it cannot define), a short one."""
    repro = test.repro()
    obs = observe(test.failure, repro)
    rank = {"eq": 0, "not_raised": 1, "error": 2, "wrong": 3}[obs.kind]
    if repro is None:
        return (rank, 1, 1, 10_000, test.test_id)
    return (rank, 0 if repro.call else 1, len(repro.undefined), len(repro.code.splitlines()), test.test_id)


def statements(project: str, version: str, tests: list[FailedTest], where: list[tuple[str, str]],
               seed: int = 0) -> dict[int, str]:
    """The four hint-level variants of one bug report (the same wording at every level);
    `where` lists the (file, function) pairs that level 3 names."""
    rng = random.Random(seed)
    main = min([t for t in tests if t.failure] or tests, key=_score)
    repro = main.repro()
    obs = observe(main.failure, repro)
    head = [title(obs, repro, project), rng.choice(_OPENINGS).format(project=project, version=version)]
    said = behaviour(obs, repro, rng)
    parts0 = head + [said]
    parts1 = list(parts0)
    if repro and repro.code and len(repro.code.splitlines()) <= MAX_SNIPPET_LINES:
        parts1 = head + [rng.choice(_REPRO).format(code=repro.code), said]
    named = [t.test_id for t in tests][:MAX_TESTS_NAMED]
    more = len(tests) - len(named)
    tests_line = ("These tests fail: " + ", ".join(f"`{t}`" for t in named)
                  + (f" (and {more} more)" if more > 0 else "") + ".")
    parts2 = parts1 + [tests_line]
    places = [f"`{function}` in `{path}`" for path, function in dict.fromkeys(where)]
    parts3 = parts2 + ["The problem seems to be in " + " and ".join(places) + "."]
    return {level: "\n\n".join(parts) for level, parts in enumerate((parts0, parts1, parts2, parts3))}
