"""The task loader: every wrong field named with its type, bad lines reported by number and
skipped, nothing in a file able to crash the load."""

import json

import pytest

from environments.records import MAX_NESTING, TaskFormatError, TaskInstance, load_tasks

pytestmark = pytest.mark.unit


def record(**kw) -> dict:
    rec = {"instance_id": "o__r-1", "repo": "o/r", "base_commit": "a" * 40, "problem_statement": "it breaks",
           "patch": "diff --git a/x b/x\n", "test_patch": "", "FAIL_TO_PASS": ["t::a"], "PASS_TO_PASS": []}
    rec.update(kw)
    return rec


@pytest.mark.parametrize("field, value, message", [
    ("test_cmd", 5, "field test_cmd: expected a string, got a number (5)"),
    ("image", ["x"], "field image: expected a string, got a list"),
    ("repo", {"a": 1}, "field repo: expected a string, got an object"),
    ("log_parser", True, "field log_parser: expected a string, got a boolean"),
    ("hints_text", [], "field hints_text: expected a string, got a list"),
    ("instance_id", 7, "field instance_id: expected a string, got a number (7)"),
    ("instance_id", " ", "field instance_id: empty"),
    ("FAIL_TO_PASS", "[1, 2]", "field FAIL_TO_PASS: expected a list of test ids (strings), item 0 is a number (1)"),
    ("PASS_TO_PASS", {"t": 1}, "field PASS_TO_PASS: expected a list of test ids, got an object"),
    ("PASS_TO_PASS", ["t", None], "field PASS_TO_PASS: expected a list of test ids (strings), item 1 is null"),
    ("meta", [1], "field meta: expected an object, got a list"),
])
def test_each_wrong_typed_field_gets_its_own_message(field, value, message):
    with pytest.raises(TaskFormatError) as e:
        TaskInstance.from_dict(record(**{field: value}))
    assert str(e.value) == message


def test_upstream_numbers_and_nulls_load_as_text():
    t = TaskInstance.from_dict(record(version=0.12, created_at=None, hints_text=None, test_cmd=None))
    assert (t.version, t.created_at, t.hints_text) == ("0.12", "", "")
    assert t.test_cmd == TaskInstance.__dataclass_fields__["test_cmd"].default  # null: our default


def test_a_file_of_bad_lines_reports_each_by_number_and_keeps_the_good_ones(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000  # json.loads raises RecursionError on this
    nested_meta = json.dumps(record(instance_id="o__r-deep", meta=_nest(MAX_NESTING + 5)))
    lines = [
        json.dumps(record(instance_id="o__r-1")).encode(),
        b'{"instance_id": "o__r-2", "repo": "\xff\xfe"}',  # not UTF-8
        deep.encode(),
        json.dumps(record(instance_id="o__r-3", test_cmd=5)).encode(),
        b"",
        b"{truncated",
        b"5",
        nested_meta.encode(),
        json.dumps(record(instance_id="o__r-1")).encode(),  # a repeat
        json.dumps(record(instance_id="o__r-4")).encode(),
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    report = load_tasks(path)
    assert [t.instance_id for t in report.tasks] == ["o__r-1", "o__r-4"]
    assert report.errors == [
        f"{path}:2: not valid UTF-8",
        f"{path}:3: invalid JSON (nested too deeply)",
        f"{path}:4: field test_cmd: expected a string, got a number (5)",
        f"{path}:6: invalid JSON (Expecting property name enclosed in double quotes at column 2)",
        f"{path}:7: record is not a JSON object (got a number (5))",
        f"{path}:8: record nests lists/objects more than {MAX_NESTING} deep",
        f"{path}:9: instance_id o__r-1 repeats line 1",
    ]
    assert all("\n" not in e for e in report.errors)


def _nest(depth: int) -> dict:
    d: dict = {}
    for _ in range(depth):
        d = {"x": d}
    return d


def test_a_loaded_record_round_trips(tmp_path):
    t = TaskInstance.from_dict(record(extra_field={"k": [1, 2]}, version="1.0"))
    assert t.meta["upstream"] == {"extra_field": {"k": [1, 2]}}
    assert TaskInstance.from_dict(t.to_dict()) == t
