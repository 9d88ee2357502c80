"""Test logs -> {test id: status}, with SWE-bench's status names (PASSED, FAILED, ERROR, ...).

`pytest` (our default) reads pytest's `-rA` short summary. It differs from SWE-bench's pytest
parser in one way that matters for our tasks: a test id may contain spaces (parametrize ids such
as `test_x[negative int]` or `test_y[a - b]`); SWE-bench's splits on whitespace and loses them.
The id is read up to its balanced closing bracket instead. Colours (`--color=yes` in a project's
addopts) are stripped first.

`swebench` means "the SWE-bench parser for this repository": their parsers (django's unittest
format, sympy's, ...) are used as they are, so verdicts on SWE-bench tasks match theirs.
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Callable

from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT
from swebench.harness.log_parsers import MAP_REPO_TO_PARSER

StatusMap = dict[str, str]
Parser = Callable[[str, str, str], StatusMap]  # (log, repo, instance_id) -> status map

STATUSES = ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS")
# When a test shows up twice (a pass then a teardown ERROR), the worse outcome is kept.
_SEVERITY = {"PASSED": 0, "XFAIL": 1, "XPASS": 2, "SKIPPED": 3, "FAILED": 4, "ERROR": 5}
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (.+?)\s*$")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def output_section(log: str) -> str:
    """The part of a SWE-bench evaluation log between its start/end markers, or the whole log
    without them. Only for recorded SWE-bench logs: in our own grading the tests' output could
    print these markers itself."""
    if START_TEST_OUTPUT in log and END_TEST_OUTPUT in log:
        return log.split(START_TEST_OUTPUT, 1)[1].split(END_TEST_OUTPUT, 1)[0]
    return log


def _node_id(rest: str) -> str:
    """The test id at the start of `rest`; what follows it is a reason (` - msg` or ` msg`,
    even after PASSED when a plugin left a longrepr on a passing report)."""
    bracket, space = rest.find("["), rest.find(" ")
    if bracket == -1 or (space != -1 and space < bracket):
        return rest if space == -1 else rest[:space]
    depth = 0
    for i in range(bracket, len(rest)):
        depth += {"[": 1, "]": -1}.get(rest[i], 0)
        if depth == 0:
            return rest[: i + 1]
    return rest.split(" - ", 1)[0]  # unbalanced brackets in the id: fall back to the separator


def parse_pytest(log: str) -> StatusMap:
    """Statuses from pytest's `-rA` summary lines (`PASSED id`, `FAILED id - msg`, ...).

    Only the lines after pytest's last "short test summary info" header are read when there is
    one: earlier, captured output of the tests themselves could hold look-alike lines.

    `SKIPPED [n] file:line: reason` lines name no test and are ignored, as in SWE-bench: a
    skipped test is simply absent. A collection error (`ERROR tests/test_x.py`) is kept under
    the file's path.
    """
    results: StatusMap = {}
    lines = strip_ansi(log).splitlines()
    summary = [i for i, line in enumerate(lines) if "short test summary info" in line]
    for line in lines[summary[-1]:] if summary else lines:
        m = _SUMMARY_LINE.match(line)
        if not m:
            continue
        status, rest = m.groups()
        if status == "SKIPPED" and rest.startswith("["):
            continue
        test = _node_id(rest)
        if test and _SEVERITY[status] >= _SEVERITY[results.get(test, "PASSED")]:
            results[test] = status
    return results


def parse_swebench(log: str, repo: str, instance_id: str = "") -> StatusMap:
    """SWE-bench's own parser for `repo`."""
    try:
        parser = MAP_REPO_TO_PARSER[repo]
    except KeyError:
        raise ValueError(f"log_parser=swebench: SWE-bench has no parser for repo {repo!r}") from None
    spec = SimpleNamespace(instance_id=instance_id, repo=repo)  # some parsers read these
    return parser(log, spec)


PARSERS: dict[str, Parser] = {
    "pytest": lambda log, repo, iid: parse_pytest(log),
    "swebench": parse_swebench,
}


def parse_log(log: str, parser: str, repo: str = "", instance_id: str = "") -> StatusMap:
    """Parse `log` with the parser a task names (`task.log_parser`)."""
    if parser not in PARSERS:
        raise ValueError(f"unknown log_parser {parser!r} (known: {', '.join(sorted(PARSERS))})")
    return PARSERS[parser](log, repo, instance_id)
