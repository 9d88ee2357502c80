"""Task and grading records, with SWE-bench's field names and meanings unchanged.

A SWE-bench / SWE-rebench JSONL line loads as-is; our own fields have defaults so that the
official files need no conversion. SWE-bench stores FAIL_TO_PASS / PASS_TO_PASS as JSON-encoded
strings in some releases and as lists in others: both are accepted.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator, Literal

from environments.hints import LINE_HINT, line_statement

Status = Literal["resolved", "unresolved", "error"]


class TaskFormatError(ValueError):
    """A task record that cannot be loaded; names the line (when known) and the field."""


def _as_list(value: Any, name: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as e:
            raise TaskFormatError(f"field {name}: not a JSON list ({e.msg})") from None
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise TaskFormatError(f"field {name}: expected a list of test ids")
    return list(value)


@dataclass
class TaskInstance:
    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str  # the gold fix
    test_patch: str
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str]
    hints_text: str = ""
    version: str = ""
    environment_setup_commit: str = ""
    created_at: str = ""
    # ours
    image: str = ""  # instance image ref (repo at base_commit under /testbed)
    test_cmd: str = "python -m pytest -rA -p no:cacheprovider"
    log_parser: str = "pytest"
    source: str = ""
    split: str = "train"
    meta: dict[str, Any] = field(default_factory=dict)

    REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement", "patch")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TaskInstance":
        if not isinstance(d, dict):
            raise TaskFormatError("record is not a JSON object")
        for name in cls.REQUIRED:
            if name not in d or d[name] is None:
                raise TaskFormatError(f"field {name}: missing")
            if not isinstance(d[name], str):
                raise TaskFormatError(f"field {name}: expected a string")
        known = {f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {k: v for k, v in d.items() if k in known}
        extra = {k: v for k, v in d.items() if k not in known}
        kwargs["FAIL_TO_PASS"] = _as_list(d.get("FAIL_TO_PASS"), "FAIL_TO_PASS")
        kwargs["PASS_TO_PASS"] = _as_list(d.get("PASS_TO_PASS"), "PASS_TO_PASS")
        kwargs.setdefault("test_patch", "")
        for name in ("hints_text", "version", "environment_setup_commit", "created_at", "test_patch"):
            if kwargs.get(name) is None:
                kwargs[name] = ""
            elif not isinstance(kwargs[name], str):
                kwargs[name] = str(kwargs[name])
        meta = kwargs.get("meta") or {}
        if not isinstance(meta, dict):
            raise TaskFormatError("field meta: expected an object")
        if extra:  # keep unknown upstream fields instead of losing them
            meta = {**meta, "upstream": {**meta.get("upstream", {}), **extra}}
        kwargs["meta"] = meta
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def project(self) -> str:
        return self.meta.get("project") or self.repo


@dataclass
class LoadReport:
    tasks: list[TaskInstance]
    errors: list[str]  # "path:line: field X: ..."


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, str]]:
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                yield lineno, line


def at_hint_level(task: TaskInstance, level: int) -> TaskInstance:
    """The same task stated at another hint level (curation stores every level's statement in
    `meta["statements"]`), so a curriculum picks its level at load time without re-curating.
    Tasks without that level (imported ones) are returned unchanged. Level 4 (the wrong line
    named) is derived from level 3 and the bug patch; a bug that is not a one-line change stays
    at level 3, and its meta says so."""
    statements = task.meta.get("statements") or {}
    text = statements.get(str(level))
    if text is None and level == LINE_HINT and str(LINE_HINT - 1) in statements:
        text = line_statement(statements[str(LINE_HINT - 1)], task.meta.get("bug_patch") or "")
        if text is None:
            return at_hint_level(task, LINE_HINT - 1)
    if text is None or task.meta.get("hint_level") == level:
        return task
    d = task.to_dict()
    d["problem_statement"] = text
    d["meta"] = {**task.meta, "hint_level": level}
    return TaskInstance.from_dict(d)


def load_tasks(path: str | Path) -> LoadReport:
    """Load every good line of a tasks JSONL file; bad lines are reported, never fatal."""
    tasks, errors = [], []
    for lineno, line in iter_jsonl(path):
        try:
            tasks.append(TaskInstance.from_dict(json.loads(line)))
        except json.JSONDecodeError as e:
            errors.append(f"{path}:{lineno}: invalid JSON ({e.msg})")
        except TaskFormatError as e:
            errors.append(f"{path}:{lineno}: {e}")
        except TypeError as e:
            errors.append(f"{path}:{lineno}: {e}")
    return LoadReport(tasks, errors)


def dump_tasks(tasks: list[TaskInstance], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for t in tasks:
            fh.write(json.dumps(t.to_dict()) + "\n")


@dataclass
class ExecResult:
    exit_code: int  # -1 when no code is known (timeout, dead sandbox)
    output: str  # stdout+stderr interleaved, capped
    timed_out: bool = False
    truncated_bytes: int = 0  # how much the cap cut
    duration_s: float = 0.0


@dataclass
class GradeResult:
    """One verdict, in the shape of SWE-bench's per-instance report."""

    instance_id: str
    status: Status
    resolved: bool
    patch_applied: bool
    tests_status: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    test_results: dict[str, str] = field(default_factory=dict)  # test id -> PASSED/FAILED/...
    error_reason: str = ""
    log: str = ""
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
