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

from environments.hints import LINE_HINT, POINTER_HINT, line_statement, pointer_statement

Status = Literal["resolved", "unresolved", "error"]


class TaskFormatError(ValueError):
    """A task record that cannot be loaded; names the line (when known) and the field."""


IMAGE_ERROR = "image_error"  # meta key: why a task could get no image
MAX_NESTING = 64  # of `meta` and the upstream extras: deeper means a broken or hostile record


def _kind(value: Any) -> str:
    """The JSON name of a value's type, for messages (`5` is a number, `["x"]` a list)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _as_list(value: Any, name: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as e:
            raise TaskFormatError(f"field {name}: not a JSON list ({e.msg})") from None
        except RecursionError:
            raise TaskFormatError(f"field {name}: nested too deeply") from None
    if not isinstance(value, list):
        raise TaskFormatError(f"field {name}: expected a list of test ids, got {_kind(value)}")
    for i, x in enumerate(value):
        if not isinstance(x, str):
            raise TaskFormatError(f"field {name}: expected a list of test ids (strings), item {i} is {_kind(x)}")
    return list(value)


def _as_text(value: Any, name: str, lenient: bool) -> str:
    """A string field. `lenient` fields (version, created_at) also take what upstream files and
    Parquet readers give for them: numbers (`version: 0.12`) and datetimes."""
    if isinstance(value, str):
        return value
    if lenient and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if lenient and hasattr(value, "isoformat"):
        return value.isoformat()
    raise TaskFormatError(f"field {name}: expected a string, got {_kind(value)}")


def nesting_depth(value: Any, limit: int = MAX_NESTING) -> int:
    """How deeply lists and objects nest in `value`, counted without recursion (stops past `limit`)."""
    depth, level = 0, [value]
    while level and depth <= limit:
        nxt = []
        for v in level:
            if isinstance(v, dict):
                nxt.extend(v.values())
            elif isinstance(v, list):
                nxt.extend(v)
        level = nxt
        depth += 1 if nxt else 0
    return depth


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
    LENIENT = ("version", "created_at")  # upstream files give numbers and datetimes for these
    NULLABLE = ("hints_text", "version", "environment_setup_commit", "created_at", "test_patch")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TaskInstance":
        """A record from a dict; a wrong field raises TaskFormatError naming it and its type."""
        if not isinstance(d, dict):
            raise TaskFormatError(f"record is not a JSON object (got {_kind(d)})")
        for name in cls.REQUIRED:
            if name not in d or d[name] is None:
                raise TaskFormatError(f"field {name}: missing")
        if isinstance(d["instance_id"], str) and not d["instance_id"].strip():
            raise TaskFormatError("field instance_id: empty")
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for name, value in d.items():
            if name not in known or name in ("FAIL_TO_PASS", "PASS_TO_PASS", "meta"):
                continue
            if value is None and name in cls.NULLABLE:
                value = ""
            if value is None:  # a null in one of our own fields: its default
                continue
            kwargs[name] = _as_text(value, name, name in cls.LENIENT)
        kwargs["FAIL_TO_PASS"] = _as_list(d.get("FAIL_TO_PASS"), "FAIL_TO_PASS")
        kwargs["PASS_TO_PASS"] = _as_list(d.get("PASS_TO_PASS"), "PASS_TO_PASS")
        kwargs.setdefault("test_patch", "")
        meta = d.get("meta") or {}
        if not isinstance(meta, dict):
            raise TaskFormatError(f"field meta: expected an object, got {_kind(meta)}")
        extra = {k: v for k, v in d.items() if k not in known}
        if nesting_depth(meta) > MAX_NESTING or nesting_depth(extra) > MAX_NESTING:
            raise TaskFormatError(f"record nests lists/objects more than {MAX_NESTING} deep")
        if extra:  # keep unknown upstream fields instead of losing them
            upstream = meta.get("upstream", {})
            meta = {**meta, "upstream": {**(upstream if isinstance(upstream, dict) else {}), **extra}}
        kwargs["meta"] = meta
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def project(self) -> str:
        return self.meta.get("project") or self.repo

    @property
    def no_image_reason(self) -> str:
        """Why this task has no image ("" when it has one): what `images.build_images` said,
        kept in `meta["image_error"]`, so a grader reports it instead of a bare failure."""
        if self.image:
            return ""
        return self.meta.get(IMAGE_ERROR) or "no image (task.image is empty and no build was tried)"


@dataclass
class LoadReport:
    tasks: list[TaskInstance]
    errors: list[str]  # "path:line: field X: ..."


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, str | None]]:
    """(line number, text) of each non-blank line; text is None for a line that is not UTF-8,
    so one bad line is reported by its number instead of stopping the whole file."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield lineno, None
                continue
            if line.strip():
                yield lineno, line


def parse_record(line: str | None) -> TaskInstance:
    """One JSONL line as a TaskInstance; every way it can be wrong is a TaskFormatError."""
    if line is None:
        raise TaskFormatError("not valid UTF-8")
    try:
        data = json.loads(line)
    except json.JSONDecodeError as e:
        raise TaskFormatError(f"invalid JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise TaskFormatError("invalid JSON (nested too deeply)") from None
    return TaskInstance.from_dict(data)


def at_hint_level(task: TaskInstance, level: int) -> TaskInstance:
    """The same task stated at another hint level (curation stores every level's statement in
    `meta["statements"]`), so a curriculum picks its level at load time without re-curating.
    Tasks without that level (imported ones) are returned unchanged. Levels 4 and 5 (the wrong
    line quoted, or pointed at by file and number) are derived from level 3 and the bug patch; a
    bug that is not a one-line change stays at level 3, and its meta says so."""
    statements = task.meta.get("statements") or {}
    text = statements.get(str(level))
    if text is None and level in (LINE_HINT, POINTER_HINT) and "3" in statements:
        bug = task.meta.get("bug_patch") or ""
        text = (line_statement(statements["3"], bug) if level == LINE_HINT
                else pointer_statement(statements["3"], bug, task.meta.get("mutations") or []))
        if text is None:
            return at_hint_level(task, 3)
    if text is None or task.meta.get("hint_level") == level:
        return task
    d = task.to_dict()
    d["problem_statement"] = text
    d["meta"] = {**task.meta, "hint_level": level}
    return TaskInstance.from_dict(d)


def load_tasks(path: str | Path) -> LoadReport:
    """Load every good line of a tasks JSONL file; bad lines (and repeated instance ids) are
    reported as `path:line: reason` and skipped, never fatal."""
    tasks, errors, seen = [], [], {}
    for lineno, line in iter_jsonl(path):
        try:
            task = parse_record(line)
        except TaskFormatError as e:
            errors.append(f"{path}:{lineno}: {e}")
            continue
        if task.instance_id in seen:
            errors.append(f"{path}:{lineno}: instance_id {task.instance_id} repeats line {seen[task.instance_id]}")
            continue
        seen[task.instance_id] = lineno
        tasks.append(task)
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
