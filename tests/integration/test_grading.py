"""Grading on the hand-made fixtures, in real containers.

The first run builds the fixtures' images (a few minutes, PyPI needed); they are cached by
content tag, so later runs only grade (about a minute on 2 cores).
"""

import dataclasses
import os
import subprocess

import pytest

from environments import images as images_mod
from bench.fixture_tasks import load_fixture_tasks
from environments.grading import EMPTY_PATCH_LOG, OUT_OF_SCOPE, grade, grade_many
from environments.images import EnvSpec, ensure_images, fetch_sdist, unpack_sdist
from environments.log_parsers import parse_log
from environments.sandbox import open_sandbox, session_id
from swerl.config import EnvironmentConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

ENV = EnvironmentConfig()


@pytest.fixture(scope="module")
def tasks():
    ts = load_fixture_tasks()
    tags = ensure_images(ts, progress=lambda line: None, workers=2)
    for t in ts:
        t.image = tags[t.instance_id]
    return {t.instance_id: t for t in ts}


def predictions(tasks, patch_of):
    return [{"instance_id": i, "model_name_or_path": "test", "model_patch": patch_of(t)} for i, t in tasks.items()]


def sandbox_patch(task, script: str, files: dict[str, str] | None = None, check_hack: bool = False) -> str:
    """The diff an agent would submit after writing `files` and running `script` in its sandbox.
    With `check_hack`, first checks that the change really makes the task's FAIL_TO_PASS tests
    pass there, so that grading has something to undo."""
    with open_sandbox(task.image, ENV) as sb:
        for path, text in (files or {}).items():
            sb.write_file(path, text)
        assert sb.run(script).exit_code == 0
        if check_hack:
            status = parse_log(sb.run(task.test_cmd).output, task.log_parser)
            assert all(status.get(t) == "PASSED" for t in task.FAIL_TO_PASS), "the hack should work in the sandbox"
        return sb.diff()


def test_fixtures_are_many_and_real(tasks):
    assert len(tasks) >= 6
    assert len({t.meta["env"] for t in tasks.values()}) >= 6  # distinct PyPI projects
    for t in tasks.values():
        assert t.FAIL_TO_PASS and t.meta["bug_patch"] and t.patch and t.problem_statement


def test_images_are_cached_by_tag(tasks, monkeypatch):
    def no_build(*a, **k):
        raise AssertionError("an existing image was rebuilt")

    monkeypatch.setattr(images_mod, "_docker_build", no_build)
    again = ensure_images(list(tasks.values()), progress=lambda line: None)
    assert again == {i: t.image for i, t in tasks.items()}


def test_instance_image_hides_history_and_matches_base_commit(tasks):
    task = tasks["toolz__get_in-typeerror"]
    with open_sandbox(task.image, ENV) as sb:
        log = sb.run("git log --format='%H|%an|%ad' --date=iso").output.strip().splitlines()
        status = sb.run("git status --porcelain").output
        owner = sb.run("whoami; stat -c %U toolz/dicttoolz.py").output.split()
        bytecode = sb.run("find . -name '*.pyc' -o -name __pycache__").output
    assert len(log) == 1
    head, author, date = log[0].split("|")
    assert head == task.base_commit and author == "swerl" and date.startswith("2000-01-01")
    assert status == "" and owner == ["swerl", "swerl"] and bytecode == ""


def test_gold_patches_resolve_every_fixture(tasks):
    report = grade_many(tasks, predictions(tasks, lambda t: t.patch), ENV, workers=2)
    assert report["error_ids"] == [], {i: report["instances"][i]["error_reason"] for i in report["error_ids"]}
    assert report["resolved_ids"] == sorted(tasks)
    for i, t in tasks.items():
        status = report["instances"][i]["tests_status"]
        assert status["FAIL_TO_PASS"]["success"] == t.FAIL_TO_PASS
        assert len(status["PASS_TO_PASS"]["success"]) == len(t.PASS_TO_PASS)


def test_empty_patches_resolve_nothing_and_are_not_errors(tasks):
    """A prediction's empty patch is unresolved with no test run (SWE-bench's rule); validation's
    direct `grade(task, "")` still runs the tests, and they fail as a valid task's must."""
    report = grade_many(tasks, predictions(tasks, lambda t: ""), ENV, workers=2)
    assert report["error_ids"] == []
    assert report["unresolved_ids"] == sorted(tasks) and report["empty_patch_ids"] == sorted(tasks)
    for i in tasks:
        assert report["instances"][i]["tests_status"] == {} and not report["instances"][i]["patch_applied"]
    task = next(iter(tasks.values()))
    ran = grade(task, "", ENV)
    assert ran.status == "unresolved" and ran.log != EMPTY_PATCH_LOG
    assert ran.tests_status["FAIL_TO_PASS"]["success"] == []
    assert ran.tests_status["PASS_TO_PASS"]["failure"] == []


def test_patch_that_does_not_apply_is_an_error_with_its_reason(tasks):
    task = tasks["boltons__format_int_list-duplicates"]
    stale = task.patch.replace("                contig_range.append(x)\n", "                contig_range.append(y)\n", 1)
    result = grade(task, stale, ENV)
    assert (result.status, result.resolved, result.patch_applied) == ("error", False, False)
    assert "patch does not apply" in result.error_reason and "boltons/strutils.py" in result.error_reason


def test_editing_the_tests_does_not_earn_a_pass(tasks):
    task = tasks["inflection__ordinal-hundreds"]  # F2P tests live in an existing file
    patch = sandbox_patch(task, "sed -i 's/^    assert ordinalized == .*/    assert True/' test_inflection.py",
                          check_hack=True)
    result = grade(task, patch, ENV)
    assert (result.status, result.resolved) == ("unresolved", False)
    assert result.error_reason.startswith(OUT_OF_SCOPE) and "test_inflection.py: a test file" in result.error_reason


def test_a_conftest_hook_that_flips_outcomes_is_removed(tasks):
    task = tasks["toolz__get_in-typeerror"]  # F2P test comes from test_patch
    conftest = (
        "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
        "def pytest_runtest_makereport(item, call):\n    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
    )
    patch = sandbox_patch(task, "git apply /tmp/t.patch",
                          {"conftest.py": conftest, "/tmp/t.patch": task.test_patch}, check_hack=True)
    assert "b/conftest.py" in patch
    result = grade(task, patch, ENV)
    assert (result.status, result.resolved) == ("unresolved", False)


def test_patch_breaking_the_import_is_unresolved_not_error(tasks):
    task = tasks["humanize__intcomma-negative"]
    patch = sandbox_patch(task, "echo 'def broken(:' >> src/humanize/number.py")
    result = grade(task, patch, ENV)
    assert (result.status, result.resolved) == ("unresolved", False), result.error_reason
    assert result.tests_status["PASS_TO_PASS"]["success"] == []


def test_a_run_past_the_test_timeout_is_an_error(tasks):
    task = tasks["inflection__ordinal-hundreds"]
    patch = sandbox_patch(task, "sed -i '1i import time; time.sleep(600)' inflection/__init__.py")
    result = grade(task, patch, ENV.model_copy(update={"test_timeout_s": 3.0}))
    assert result.status == "error" and "timed out" in result.error_reason, result.error_reason


def test_a_task_from_a_git_mirror_builds_and_grades(tasks, tmp_path):
    """SWE-bench-like layout: env image at one commit of a bare mirror, instance at base_commit."""
    fixture = tasks["inflection__ordinal-hundreds"]
    spec = EnvSpec.from_dict(fixture.meta["env_spec"])
    work = tmp_path / "work"
    unpack_sdist(fetch_sdist(spec.name, spec.version), work)
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t"]
    dated = {**os.environ, "GIT_AUTHOR_DATE": "2001-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2001-01-01T00:00:00Z"}

    def commit(msg: str) -> str:
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-qm", msg], check=True, env=dated)
        return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()

    subprocess.run(["git", "init", "-q", str(work)], check=True)
    env_commit = commit("release")
    subprocess.run([*git, "apply", "-"], input=fixture.meta["bug_patch"], text=True, check=True)
    base_commit = commit("regression")
    mirror = tmp_path / "mirror"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(mirror / "jpvanhal__inflection.git")], check=True)

    mirrored = EnvSpec(name="inflection", version=env_commit, source=f"mirror:{mirror}", repo="jpvanhal/inflection")
    meta = {k: v for k, v in fixture.meta.items() if k != "bug_patch"} | {"env_spec": mirrored.to_dict()}
    task = dataclasses.replace(fixture, instance_id="jpvanhal__inflection-1", base_commit=base_commit, meta=meta)
    task.image = ensure_images([task], progress=lambda line: None)[task.instance_id]
    assert grade(task, task.patch, ENV).status == "resolved"
    assert grade(task, "", ENV).status == "unresolved"
    with open_sandbox(task.image, ENV) as sb:
        assert sb.run("git log --oneline | wc -l").output.strip() == "1"  # upstream history is gone


def test_no_container_of_this_session_is_left():
    from environments.sandbox.docker import list_containers

    assert list_containers(session_id()) == []
