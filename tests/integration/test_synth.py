"""Real containers, real PyPI projects: synthesis end to end, and a SWE-bench-format task from a
local bare mirror. Image builds need PyPI (cached by content-hash tags afterwards)."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from environments.curation.curate import curate_project, curate_synth, load_result, project_cache_key, save_result
from environments.curation.dataset import load_dataset
from environments.curation.importers import import_tasks
from environments.curation.projects import by_key
from environments.curation.synth import ProjectResult, SynthOptions, synth_project
from environments.curation.validate import validate_tasks
from environments.grading import grade
from environments.images import base_for, build_env_image, ensure_images, fetch_sdist, unpack_sdist
from environments.records import TaskInstance
from environments.sandbox import session_id
from swerl.config import EnvironmentConfig, load_config
from swerl.store import Store

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ENV = EnvironmentConfig(test_timeout_s=300)


def own_containers() -> list[str]:
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=swerl.session={session_id()}"],
                         capture_output=True, text=True, check=True)
    return out.stdout.split()


@pytest.fixture(scope="module")
def inflection_env() -> str:
    project = by_key()["inflection==0.5.1"]
    spec = project.env_spec()
    return build_env_image(spec, base_for(spec), progress=lambda s: None)


OPTS = SynthOptions(max_tasks=2, determinism_runs=2, seed=1)


@pytest.fixture(scope="module")
def inflection_result(inflection_env):
    return synth_project(by_key()["inflection==0.5.1"], inflection_env, ENV, OPTS, progress=lambda s: None)


def test_synthesised_tasks_are_valid_on_their_instance_images(inflection_result):
    result = inflection_result
    assert 1 <= len(result.tasks) <= 2, result.stats
    assert result.stats["baseline_tests"] > 400 and result.stats["tried"] >= len(result.tasks)
    for t in result.tasks:
        assert t.FAIL_TO_PASS and not set(t.FAIL_TO_PASS) & set(t.PASS_TO_PASS)
        assert len(t.FAIL_TO_PASS) + len(t.PASS_TO_PASS) == result.stats["baseline_tests"]
        assert t.patch.startswith("diff --git a/inflection/__init__.py b/inflection/__init__.py")
        assert t.meta["bug_patch"].startswith("diff --git a/") and t.meta["bug_patch"] != t.patch
        assert t.problem_statement == t.meta["statements"]["1"] and len(t.base_commit) == 40
        removed = [line[1:].strip() for line in t.meta["bug_patch"].splitlines()
                   if line.startswith("+") and not line.startswith("+++")]
        for text in t.meta["statements"].values():  # the buggy line is never quoted
            assert not any(line and line in text for line in removed)
        assert "```python" in t.problem_statement and "assert " not in t.problem_statement
        assert result.evidence[t.instance_id]["log"]  # what the statement was written from, kept
    assert result.stats["timing_tests"] == 0 and set(result.test_sources) == {"test_inflection.py"}
    report = validate_tasks(result.tasks, ENV, workers=1, progress=lambda s: None)
    assert report.summary()["ok"] == len(result.tasks), report.to_dict()
    assert own_containers() == []


def test_a_previous_pipelines_result_is_upgraded_not_searched_again(tmp_path, inflection_result):
    """A SYNTH_VERSION 2 entry (no evidence, old statements) is restated: the same mutants and
    tests, statements written from one fresh run of each task's failing tests. A test id the
    suite no longer has (an old run's hash-seed-dependent name) leaves the task."""
    project = by_key()["inflection==0.5.1"]
    old_tasks = [TaskInstance.from_dict(t.to_dict()) for t in inflection_result.tasks]
    for t in old_tasks:
        t.problem_statement, t.meta["statements"] = "Something is off.\n\nthe check fails", {}
    old_tasks[0].PASS_TO_PASS.append("test_inflection.py::test_renamed[word-expected17]")
    store = Store(f"file://{tmp_path}/store")
    save_result(store, project_cache_key(project, OPTS, "2"), ProjectResult(project.key, old_tasks, {"suite_s": 3.0}))
    cfg = load_config("smoke")
    lines: list[str] = []
    new, hit = curate_project(project, OPTS, cfg, store, lines.append)
    assert not hit and any("restate: 0 timing-dependent tests, 1 named tests not found" in line for line in lines), lines
    assert new.stats["restated"]["reasons"] == {"ok": len(old_tasks)}
    for a, b in zip(new.tasks, inflection_result.tasks, strict=True):
        assert (a.instance_id, a.patch, a.FAIL_TO_PASS, a.PASS_TO_PASS) == \
            (b.instance_id, b.patch, b.FAIL_TO_PASS, b.PASS_TO_PASS)
        assert a.problem_statement == a.meta["statements"]["1"] and "the check fails" not in a.problem_statement
        assert "```python" in a.problem_statement
    again, hit = curate_project(project, OPTS, cfg, store, lines.append)  # now the current version's entry
    assert hit and [t.to_dict() for t in again.tasks] == [t.to_dict() for t in new.tasks]
    assert load_result(store, project_cache_key(project, OPTS)).evidence.keys() == {t.instance_id for t in new.tasks}
    assert own_containers() == []


def test_curate_synth_is_cached(tmp_path, inflection_env):
    cfg = load_config("smoke", ["data.max_tasks_per_project=1", "data.determinism_runs=1"])
    projects = ([by_key()["inflection==0.5.1"]], [])
    store = Store(f"file://{tmp_path}/store")
    train, eval_, stats = curate_synth(cfg, store, progress=lambda s: None, workers=1, validate="none",
                                       projects=projects)
    assert stats["errors"] == {} and train.counts["total"] == 1 and eval_.counts["total"] == 0
    again_train, _, again = curate_synth(cfg, store, progress=lambda s: None, workers=1, validate="none",
                                         projects=projects)
    assert again["cache_hits"] == ["inflection==0.5.1"] and again_train.hash == train.hash
    assert again["seconds"] < 60
    (loaded,) = load_dataset(store, cfg.data.train_dataset)
    assert loaded.meta["project"] == "inflection" and loaded.split == "train"
    assert own_containers() == []


BUGGY = "    if number in (11, 12, 13):\n"
FIXED = "    if number % 100 in (11, 12, 13):\n"
NEW_TEST = '''

def test_ordinal_hundreds():
    assert inflection.ordinalize(111) == "111th"
    assert inflection.ordinal(1012) == "th"
'''


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout


def test_swebench_format_task_from_a_local_bare_mirror(tmp_path):
    # a real project in two commits: the bug, then the fix with its test
    repo = tmp_path / "work"
    unpack_sdist(fetch_sdist("inflection", "0.5.1", progress=lambda s: None), repo)
    src = repo / "inflection" / "__init__.py"
    assert FIXED in src.read_text()
    src.write_text(src.read_text().replace(FIXED, BUGGY))
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    src.write_text(src.read_text().replace(BUGGY, FIXED))
    tests = repo / "test_inflection.py"
    tests.write_text(tests.read_text() + NEW_TEST)
    git(repo, "commit", "-qam", "fix ordinal for 111..113")
    patch = git(repo, "diff", base, "HEAD", "--", "inflection/__init__.py")
    test_patch = git(repo, "diff", base, "HEAD", "--", "test_inflection.py")
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(mirror / "jpvanhal__inflection.git")], check=True)
    shutil.rmtree(repo)

    record = {"instance_id": "jpvanhal__inflection-1", "repo": "jpvanhal/inflection", "base_commit": base,
              "patch": patch, "test_patch": test_patch, "problem_statement": "ordinalize(111) is 111st",
              "version": "0.5", "environment_setup_commit": base, "created_at": "2020-01-01",
              "FAIL_TO_PASS": json.dumps(["test_inflection.py::test_ordinal_hundreds"]),
              "PASS_TO_PASS": json.dumps(["test_inflection.py::test_camelize_with_lower_downcases_the_first_letter"])}
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(record) + "\n{broken\n")
    report = import_tasks(str(path), "swe-bench", repo_mirror=str(mirror))
    assert len(report.tasks) == 1 and len(report.errors) == 1 and ":2:" in report.errors[0]
    (task,) = report.tasks
    image = ensure_images([task], progress=lambda s: None)[task.instance_id]
    gold = grade(task, task.patch, ENV, image)
    assert gold.status == "resolved", (gold.error_reason, gold.log[-2000:])
    empty = grade(task, "", ENV, image)
    assert empty.status == "unresolved" and empty.tests_status["FAIL_TO_PASS"]["failure"] == task.FAIL_TO_PASS
    assert own_containers() == []
