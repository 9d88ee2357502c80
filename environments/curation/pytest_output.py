"""What a failing test showed, read from pytest's `--tb=short` FAILURES / ERRORS sections.

Per-test statuses come from `environments.log_parsers` (the `-rA` summary); this module adds the
*why* that curation needs: the exception type (to drop mutants whose only symptom is an
ImportError / AttributeError / NameError) and the assertion text and test-side frames (to write a
problem statement from what the user would see). Library frames are kept apart from test frames
so that a statement never quotes the mutated source line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from environments.log_parsers import strip_ansi

_BANNER = re.compile(r"^={3,} ?(.*?) ?={3,}$")
# pytest pads a section title with underscores to the terminal width (80 columns in a sandbox),
# down to a single one on each side for a long parametrised id.
_HEADER = re.compile(r"^_+ (.+?) _+$")
_FRAME = re.compile(r"^(\S.*?):(\d+): in (\S+)$")
_EXC = re.compile(
    r"^E\s+((?:[A-Za-z_][\w.]*?)?(?:Error|error|Exception|Exit|Warning|Interrupt|Iteration|Failed|Fail))\b(?::|$)")
_ADDR = re.compile(r" at 0x[0-9a-f]+")
_PHASE = re.compile(r"^ERROR at (setup|teardown) of ")
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


@dataclass
class Frame:
    path: str
    line: int
    function: str
    code: list[str] = field(default_factory=list)  # the source lines pytest printed


@dataclass
class Failure:
    """One test's failure. With chained exceptions (`During handling of the above exception`)
    the last one is what failed the test: `exc_type`, `error_lines` and `frames` are its;
    `cause_type` is the first one's, the root cause (the same when nothing is chained)."""

    head: str  # pytest's head line, e.g. "TestX.test_y[1]"
    exc_type: str  # "AssertionError", "TypeError", ... ("" when it cannot be told)
    error_lines: list[str]  # the `E   ` lines, prefix removed, memory addresses masked
    frames: list[Frame]
    setup_error: bool = False  # the failure happened in a fixture (ERROR at setup of ...)
    cause_type: str = ""

    @property
    def message(self) -> str:
        return "\n".join(self.error_lines).strip()


def head_line(test_id: str) -> str:
    """pytest's section title for a node id: `a/b.py::C::t[x]` -> `C.t[x]`."""
    return test_id.split("::", 1)[1].replace("::", ".") if "::" in test_id else test_id


def _sections(log: str) -> list[tuple[str, list[str]]]:
    """(head, lines) for every test section inside the FAILURES and ERRORS blocks."""
    out: list[tuple[str, list[str]]] = []
    inside = False
    current: list[str] | None = None
    for line in strip_ansi(log).splitlines():
        banner = _BANNER.match(line)
        if banner:
            inside = banner.group(1) in ("FAILURES", "ERRORS")
            current = None
            continue
        if not inside:
            continue
        head = _HEADER.match(line)
        if head:
            current = []
            out.append((head.group(1), current))
        elif current is not None:
            current.append(line)
    return out


def _exc_type(error_lines: list[str]) -> str:
    """The type on the first line of an exception's `E` lines (later, indented lines are its
    message's continuation and may quote other names)."""
    for line in error_lines:
        if not line.strip() or line[0].isspace():
            continue
        if line.startswith("assert "):  # pytest's rewritten assertion
            return "AssertionError"
        m = _EXC.match("E   " + line)
        if m:  # `pkg.mod.MyError` -> `MyError`, but `re.error` stays itself
            name = m.group(1).rsplit(".", 1)[-1]
            return name if name[0].isupper() else m.group(1)
        return ""
    return ""


def parse_failures(log: str) -> dict[str, Failure]:
    """Head line -> Failure, for the tests that failed or errored in `log`."""
    failures: dict[str, Failure] = {}
    for head, lines in _sections(log):
        setup = head.startswith(("ERROR at setup of ", "ERROR at teardown of "))
        name = _PHASE.sub("", head)
        frames: list[Frame] = []
        errors: list[str] = []
        cause = None
        for line in lines:
            fm = _FRAME.match(line)
            if line.startswith(_CHAINED):  # what follows is the exception that failed the test
                cause = _exc_type(errors) if cause is None else cause
                frames, errors = [], []
            elif fm:
                frames.append(Frame(fm.group(1), int(fm.group(2)), fm.group(3)))
            elif line.startswith("E ") or line == "E":
                errors.append(_ADDR.sub("", line[1:].strip(" ") if len(line) < 5 else line[4:]))
            elif frames and line.startswith("    ") and not errors:
                frames[-1].code.append(line[4:])
        if name not in failures or (failures[name].setup_error and not setup):
            exc = _exc_type(errors)
            failures[name] = Failure(name, exc, errors, frames, setup, exc if cause is None else cause)
    return failures


def failures_by_test(log: str, test_ids: list[str]) -> dict[str, Failure]:
    """Node id -> Failure for the given ids (ids without a section are left out)."""
    parsed = parse_failures(log)
    return {t: parsed[head_line(t)] for t in test_ids if head_line(t) in parsed}


def failure_report(log: str, test_ids: list[str]) -> str:
    """The FAILURES / ERRORS sections of `test_ids` alone, as a log `parse_failures` reads: what a
    task's statement is written from, small enough to keep with the task (the rest of a run's
    log is passes and summary lines)."""
    wanted = {head_line(t) for t in test_ids}
    out = ["=== FAILURES ==="]
    for head, lines in _sections(log):
        if _PHASE.sub("", head) in wanted:
            out += [f"___ {head} ___", *lines]
    return "\n".join(out) + "\n" if len(out) > 1 else ""
