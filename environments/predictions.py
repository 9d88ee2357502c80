"""SWE-bench predictions files, read defensively: every bad entry is reported with its line
number and reason, every good one is kept.

A predictions file comes from outside (another harness, a hand-edited file, a truncated copy);
one bad line must neither crash `swerl grade` nor lose the verdicts of the others. Formats:
`.jsonl` (one object per line) or `.json` (a list of objects, or an object keyed by id).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable


@dataclass
class PredictionsReport:
    predictions: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # "line N: reason" (or "item N" in a .json)


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def check_prediction(obj: Any) -> str | None:
    """Why `obj` is not a usable prediction, or None."""
    if not isinstance(obj, dict):
        return f"{_type_name(obj)}, not a JSON object"
    if "instance_id" not in obj:
        return "no instance_id"
    if not isinstance(obj["instance_id"], str) or not obj["instance_id"].strip():
        return f"instance_id must be a non-empty string, got {_type_name(obj['instance_id'])}"
    for key in ("model_patch", "model_name_or_path"):
        if obj.get(key) is not None and not isinstance(obj[key], str):
            return f"{key} must be a string or null, got {_type_name(obj[key])}"
    return None


def _parse_json(text: str) -> tuple[Any, str | None]:
    try:
        return json.loads(text), None
    except json.JSONDecodeError as e:
        return None, f"not JSON ({e.msg}; column {e.colno})"
    except RecursionError:
        return None, "nested too deeply to read"


Item = tuple[str, Any, str | None]  # where, the parsed value, why it could not be parsed


def _collect(items: Iterable[Item], report: PredictionsReport) -> PredictionsReport:
    """Keep the valid items, in order; a repeated instance_id keeps its first prediction."""
    seen: dict[str, str] = {}
    for where, obj, why in items:
        why = why or check_prediction(obj)
        if why is None and obj["instance_id"] in seen:
            why = f"instance_id {obj['instance_id']!r} already given at {seen[obj['instance_id']]}"
        if why:
            report.errors.append(f"{where}: {why}")
            continue
        seen[obj["instance_id"]] = where
        report.predictions.append(obj)
    return report


def _jsonl_items(data: bytes) -> Iterable[Item]:
    for n, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            yield f"line {n}", None, f"not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
            continue
        yield f"line {n}", *_parse_json(line)


def read_predictions(source: str | Path | Iterable[dict[str, Any]]) -> PredictionsReport:
    """The valid predictions of a file (or an iterable of dicts) and one message per bad entry.
    A file that cannot be read at all raises OSError / ValueError with a one-line message."""
    report = PredictionsReport()
    if not isinstance(source, (str, Path)):
        return _collect(((f"item {i}", p, None) for i, p in enumerate(source, 1)), report)
    data = Path(source).read_bytes()
    if not str(source).endswith(".json"):
        return _collect(_jsonl_items(data), report)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{source}: not UTF-8 (byte at offset {e.start})") from None
    whole, why = _parse_json(text)
    if why:
        raise ValueError(f"{source}: {why}")
    if isinstance(whole, dict):
        return _collect(((f"key {k!r}", v, None) for k, v in whole.items()), report)
    if isinstance(whole, list):
        return _collect(((f"item {i}", p, None) for i, p in enumerate(whole, 1)), report)
    raise ValueError(f"{source}: {_type_name(whole)}, not a list or object of predictions")
