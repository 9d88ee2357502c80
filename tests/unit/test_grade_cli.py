"""`swerl grade` with bad input: one line per problem, the good predictions graded, no traceback.
The grader itself is replaced here (tests/integration/test_evaluate_grade.py runs it for real)."""

import json

import pytest

from environments.records import GradeResult, TaskInstance
from flows import cli, cli_data

pytestmark = pytest.mark.unit


def task(iid: str) -> TaskInstance:
    return TaskInstance(instance_id=iid, repo="o/r", base_commit="0" * 40, problem_statement="...", patch="",
                        test_patch="", FAIL_TO_PASS=["t.py::t"], PASS_TO_PASS=[], image="img")


@pytest.fixture
def graded(monkeypatch):
    """The instance ids the (fake) grader was asked to grade."""
    seen: list[str] = []

    def fake_grade(t, patch, env_cfg, image=None):
        seen.append(t.instance_id)
        return GradeResult(t.instance_id, "resolved" if patch else "unresolved", bool(patch), bool(patch))

    monkeypatch.setattr("environments.grading.grade_prediction", fake_grade)
    monkeypatch.setattr(cli_data, "tasks_with_images", lambda path: [task("a__b-1"), task("c__d-2")])
    return seen


def test_garbage_lines_are_listed_and_the_good_ones_graded(tmp_path, graded, capsys):
    preds = tmp_path / "preds.jsonl"
    preds.write_bytes(b"\n".join([
        json.dumps({"instance_id": "a__b-1", "model_patch": "diff --git a/x b/x\n"}).encode(),
        b"{not json", b"[1]", b"3", b'{"model_patch": ""}', b'{"instance_id": {"x": 1}}',
        b'{"instance_id": "c__d-2", "model_patch": ["p"]}', b'{"instance_id": "c__d-2", "model_patch": "\xff"}',
        b'{"instance_id": "c__d-2", "model_pa',
        json.dumps({"instance_id": "c__d-2", "model_patch": ""}).encode(),
    ]))
    report = tmp_path / "report.json"
    rc = cli.main(["grade", "--tasks", "t.jsonl", "--predictions", str(preds), "--report", str(report)])
    out, err = capsys.readouterr()
    assert rc == 0 and sorted(graded) == ["a__b-1", "c__d-2"]  # the first c__d-2 line is bad, the last kept
    assert "Traceback" not in out + err
    for n in range(2, 10):
        assert f"skipping bad prediction at line {n}: " in err
    saved = json.loads(report.read_text())
    assert saved["resolved_ids"] == ["a__b-1"] and saved["unresolved_ids"] == ["c__d-2"]
    assert len(saved["invalid_predictions"]) == 8


def test_nothing_graded_exits_non_zero_and_a_missing_file_is_one_line(tmp_path, graded, capsys):
    preds = tmp_path / "preds.jsonl"
    preds.write_text("garbage\n")
    assert cli.main(["grade", "--tasks", "t.jsonl", "--predictions", str(preds), "--report",
                     str(tmp_path / "r.json")]) == 1
    assert "nothing was graded" in capsys.readouterr().err
    assert cli.main(["grade", "--tasks", "t.jsonl", "--predictions", str(tmp_path / "none.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("swerl: ") and err.count("\n") == 1 and "No such file" in err
