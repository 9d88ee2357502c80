"""bench.real_instances's table: one line per repo, version and Python, counted from the grade
reports and the curation report, rows that did not import counted as errors (the bench itself
builds a dozen environments: too slow for `make test`)."""

import json
from pathlib import Path

import pytest

from bench.real_instances import SAMPLE, markdown, python_label, summary_rows, totals
from environments.records import TaskInstance

pytestmark = pytest.mark.unit


def _task(iid: str, repo: str, version: str, release: str, wanted: str) -> TaskInstance:
    return TaskInstance(instance_id=iid, repo=repo, base_commit="0" * 40, problem_statement="p", patch="", test_patch="",
                        FAIL_TO_PASS=[], PASS_TO_PASS=[], version=version, meta={"env_spec": {"python": release}, "env_recipe": {"python": wanted}})


def test_the_table_counts_verdicts_errors_and_kept_tasks_per_repo_version_and_python():
    rows = [{"instance_id": i, "repo": r, "version": v} for i, r, v in
            [("a-1", "o/a", "1.0"), ("a-2", "o/a", "1.0"), ("b-1", "o/b", "2.3"), ("c-1", "o/c", "0.1")]]
    tasks = {t.instance_id: t for t in [_task("a-1", "o/a", "1.0", "bullseye", "3.9"),
                                        _task("a-2", "o/a", "1.0", "bullseye", "3.9"),
                                        _task("b-1", "o/b", "2.3", "bookworm", "3.10")]}
    gold = {"resolved_ids": ["a-1", "b-1"], "error_ids": ["a-2"]}
    empty = {"resolved_ids": ["b-1"], "error_ids": []}
    curation = {"reasons": {"validation": {"b-1": "empty patch resolves"}}}
    lines = summary_rows(rows, tasks, {"c-1": "c-1: no environment recipe"}, gold, empty, curation)
    assert lines == [
        {"repo": "o/a", "version": "1.0", "python": "3.9", "n": 2, "gold_resolved": 1, "empty_resolved": 0,
         "errors": 1, "kept": 2},
        {"repo": "o/b", "version": "2.3", "python": "3.10->3.11", "n": 1, "gold_resolved": 1, "empty_resolved": 1,
         "errors": 0, "kept": 0},
        {"repo": "o/c", "version": "0.1", "python": "?", "n": 1, "gold_resolved": 0, "empty_resolved": 0,
         "errors": 1, "kept": 0},
    ]
    assert totals(lines) == {"repo": "all", "version": "", "python": "", "n": 4, "gold_resolved": 2,
                             "empty_resolved": 1, "errors": 2, "kept": 2}
    table = markdown(lines).splitlines()
    assert table[0] == "| repo | version | python | n | gold_resolved | empty_resolved | errors | kept |"
    assert table[3] == "| o/b | 2.3 | 3.10->3.11 | 1 | 1 | 1 | 0 | 0 |"


def test_python_label_says_when_a_spec_got_a_nearer_python():
    assert python_label(_task("x", "o/x", "1", "bullseye", "3.9")) == "3.9"
    assert python_label(_task("x", "o/x", "1", "bullseye", "3.6")) == "3.6->3.9"
    assert python_label(_task("x", "o/x", "1", "trixie", "")) == "3.13"


def test_the_shipped_sample_has_20_plus_rows_from_4_plus_repos_each_with_its_repository():
    rows = [json.loads(line) for line in (SAMPLE / "instances.jsonl").read_text().splitlines()]
    repos = {r["repo"] for r in rows}
    assert len(rows) >= 20 and len(repos) >= 4
    assert all(isinstance(r["FAIL_TO_PASS"], str) and json.loads(r["FAIL_TO_PASS"]) for r in rows)
    assert {Path(p).name for p in SAMPLE.glob("*.git.tar.gz")} == {f"{r.replace('/', '__')}.git.tar.gz" for r in repos}
