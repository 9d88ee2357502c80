"""The gold scope check's verdicts on disk: a second check of the same tasks starts no sandbox
and gives the same answer; a changed patch, image or rule set is checked again; a damaged file
is a miss."""

from dataclasses import replace
from types import SimpleNamespace

import pytest

from environments import grading
from environments.records import TaskInstance
from environments.scope_cache import ScopeCache
from swerl.config import EnvironmentConfig

pytestmark = pytest.mark.unit


def task(iid: str, patch: str) -> TaskInstance:
    return TaskInstance(instance_id=iid, repo="o/r", base_commit=iid, problem_statement="p", patch=patch,
                        image=f"swerl-inst.{iid}:abc", test_patch="", FAIL_TO_PASS=["tests/test_a.py::t"], PASS_TO_PASS=[])


class FakeSandbox:
    opened = 0

    def __init__(self, image, cfg, snapshot_git):
        FakeSandbox.opened += 1
        self.patch = ""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def write_file(self, path, text):
        self.patch = text

    def run(self, script):
        return SimpleNamespace(output=self.patch)


def fake_scope(task, patch, output):
    """Stands in for the rule: a patch touching tools/ is outside the source."""
    return ["tools/x.py: outside"] if "tools/" in output else []


@pytest.fixture
def fakes(monkeypatch):
    FakeSandbox.opened = 0
    monkeypatch.setattr(grading, "open_sandbox", FakeSandbox)
    monkeypatch.setattr(grading, "out_of_scope", fake_scope)


def test_second_check_starts_no_sandbox_and_agrees(tmp_path, fakes):
    tasks = [task("a", "--- a/pkg/a.py\n"), task("b", "--- a/tools/x.py\n"), task("c", "")]
    cache = grading.scope_cache(tmp_path)
    first = grading.gold_out_of_scope(tasks, EnvironmentConfig(), cache=cache)
    assert first == {"b": ["tools/x.py: outside"]} and FakeSandbox.opened == 2  # the empty patch: none
    again = grading.gold_out_of_scope(tasks, EnvironmentConfig(), cache=grading.scope_cache(tmp_path))
    assert again == first and FakeSandbox.opened == 2
    moved = [replace(tasks[0], patch="--- a/tools/y.py\n"), replace(tasks[1], image="swerl-inst.b:new")]
    assert grading.gold_out_of_scope(moved, EnvironmentConfig(), cache=cache) == {
        "a": ["tools/x.py: outside"], "b": ["tools/x.py: outside"]}
    assert FakeSandbox.opened == 4


def test_other_rules_and_damaged_files_are_misses(tmp_path):
    t = task("a", "--- a/pkg/a.py\n")
    cache = ScopeCache(tmp_path, "rules-1", grading.task_test_files)
    assert cache.get(t) is None
    cache.put(t, ["why"])
    assert cache.get(t) == ["why"]
    assert ScopeCache(tmp_path, "rules-2", grading.task_test_files).get(t) is None
    [path] = tmp_path.rglob("*.json")
    path.write_text("{not json")
    assert cache.get(t) is None


def test_the_rules_digest_follows_the_rule_source(tmp_path, monkeypatch):
    before = grading.scope_cache(tmp_path).rules
    monkeypatch.setattr(grading, "scope_script", lambda: "cd /testbed && git ls-files")
    assert grading.scope_cache(tmp_path).rules != before
