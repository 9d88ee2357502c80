"""Grading decisions that need no container: which files are restored, and output -> verdict."""

import pytest

from environments.grading import (
    APPLY_FAILED, LOG_FOLLOWS, TEST_APPLY_FAILED, TEST_EXIT, grading_script, out_of_scope, patch_files, scope_script,
    task_test_files,
    run_report, verdict,
)
from environments.records import GradeResult, TaskInstance
from swerl.config import EnvironmentConfig

pytestmark = pytest.mark.unit

TEST_PATCH = """\
diff --git a/tests/test_new.py b/tests/test_new.py
new file mode 100644
--- /dev/null
+++ b/tests/test_new.py
@@ -0,0 +1,2 @@
+def test_new():
+    assert True
diff --git a/tests/unit/test_old.py b/tests/unit/test_old.py
--- a/tests/unit/test_old.py
+++ b/tests/unit/test_old.py
@@ -1 +1 @@
-x = 1
+x = 2
"""


def make_task(**kw) -> TaskInstance:
    base = dict(
        instance_id="p__bug-1", repo="someone/p", base_commit="0" * 40, problem_statement="...",
        patch="", test_patch=TEST_PATCH, FAIL_TO_PASS=["tests/test_new.py::test_new"],
        PASS_TO_PASS=["tests/unit/test_old.py::test_a", "tests/unit/test_old.py::test_b[x y]"],
    )
    return TaskInstance(**{**base, **kw})


def output(*summary: str, code: int = 1) -> str:
    """What `grading_script` prints: stage markers, then the test log."""
    body = "\n".join(summary)
    return f"Applied patch src/p.py cleanly.\n{TEST_EXIT}{code}\n{LOG_FOLLOWS}\n{body}\n"


def test_patch_files_lists_both_sides_without_dev_null():
    assert patch_files(TEST_PATCH) == ["tests/test_new.py", "tests/unit/test_old.py"]


def test_test_files_cover_test_patch_and_test_ids_only():
    task = make_task(PASS_TO_PASS=["other/test_x.py::TestC::test_m[a::b]", "test_y (django.Style)"])
    assert task_test_files(task) == ["tests/test_new.py", "tests/unit/test_old.py", "other/test_x.py"]


def test_out_of_scope_reads_the_listing_and_numstat():
    listing = "pkg/__init__.py\0pkg/core.py\0tests/test_core.py\0\n>>>>> swerl: numstat follows\n"
    task = make_task()
    assert out_of_scope(task, "", listing + "1\t1\tpkg/core.py\0") == []
    assert out_of_scope(task, "", listing + "1\t0\tpytest.py\0") == ["pytest.py: outside the source directories pkg/"]
    assert out_of_scope(task, "", listing + "error: No valid patches in input") is None
    assert "git apply --numstat -z" in scope_script()


def test_grading_script_restores_then_applies_then_runs():
    script = grading_script(make_task(test_cmd="python -m pytest -rA tests"), True, 60)
    order = [script.index(s) for s in ("model.patch", "git checkout -q HEAD", "test.patch", "timeout -k 5 60s",
                                       TEST_EXIT, LOG_FOLLOWS)]
    assert order == sorted(order)


def test_all_pass_is_resolved_with_swebench_report_shape():
    r = verdict(make_task(), output("PASSED tests/test_new.py::test_new", "PASSED tests/unit/test_old.py::test_a",
                                    "PASSED tests/unit/test_old.py::test_b[x y]", code=0))
    assert (r.status, r.resolved, r.patch_applied) == ("resolved", True, True)
    assert r.tests_status == {
        "FAIL_TO_PASS": {"success": ["tests/test_new.py::test_new"], "failure": []},
        "PASS_TO_PASS": {"success": ["tests/unit/test_old.py::test_a", "tests/unit/test_old.py::test_b[x y]"],
                         "failure": []},
    }


def test_a_missing_or_failing_test_is_a_failure():
    r = verdict(make_task(), output("XFAIL tests/test_new.py::test_new - known", "FAILED tests/unit/test_old.py::test_a"))
    assert r.status == "unresolved" and not r.resolved
    assert r.tests_status["FAIL_TO_PASS"]["success"] == ["tests/test_new.py::test_new"]  # XFAIL counts
    assert r.tests_status["PASS_TO_PASS"]["failure"] == [
        "tests/unit/test_old.py::test_a", "tests/unit/test_old.py::test_b[x y]"]


def test_patch_that_does_not_apply_is_an_error_with_the_reason():
    out = f"{APPLY_FAILED}\nerror: patch failed: src/p.py:3\nerror: src/p.py: patch does not apply\n"
    r = verdict(make_task(), out)
    assert (r.status, r.resolved, r.patch_applied) == ("error", False, False)
    assert "patch does not apply" in r.error_reason and "src/p.py:3" in r.error_reason


def test_test_patch_that_does_not_apply_is_an_error():
    r = verdict(make_task(), f"{TEST_APPLY_FAILED}\nerror: tests/unit/test_old.py: patch does not apply\n")
    assert r.status == "error" and r.patch_applied and "test_patch" in r.error_reason


@pytest.mark.parametrize("code", [124, 137])
def test_timeout_is_an_error(code):
    r = verdict(make_task(), output("PASSED tests/test_new.py::test_new", code=code))
    assert r.status == "error" and "timed out" in r.error_reason


def test_output_cut_short_is_an_error():
    r = verdict(make_task(), "Applied patch src/p.py cleanly.\n")
    assert r.status == "error" and "did not finish" in r.error_reason


def test_markers_printed_by_the_tests_cannot_fake_a_stage():
    forged = output(APPLY_FAILED, f"{TEST_EXIT}124", "FAILED tests/test_new.py::test_new", code=1)
    r = verdict(make_task(), forged)
    assert (r.status, r.error_reason) == ("unresolved", "")


def test_no_expected_test_in_the_log_is_an_error():
    r = verdict(make_task(), output("bash: line 1: pytest: command not found", code=127))
    assert r.status == "error" and "none of the task's 3 tests" in r.error_reason and "127" in r.error_reason


def test_collection_error_caused_by_the_patch_is_unresolved():
    r = verdict(make_task(), output("ERROR tests/test_new.py - SyntaxError: invalid syntax",
                                    "!!!! Interrupted: 1 error during collection !!!!", code=2))
    assert (r.status, r.resolved) == ("unresolved", False)
    assert len(r.tests_status["FAIL_TO_PASS"]["failure"]) == 1


def test_run_report_in_swebench_shape():
    tasks = {i: make_task(instance_id=i) for i in ("a", "b", "c", "d")}
    preds = [{"instance_id": i, "model_name_or_path": "m", "model_patch": "" if i == "b" else "diff"} for i in "abc"]
    results = [GradeResult("a", "resolved", True, True, log="x"), GradeResult("b", "unresolved", False, False),
               GradeResult("c", "error", False, False, error_reason="sandbox: gone")]
    rep = run_report(tasks, preds, results)
    assert (rep["resolved_ids"], rep["unresolved_ids"], rep["error_ids"]) == (["a"], ["b"], ["c"])
    assert rep["empty_patch_ids"] == ["b"] and rep["incomplete_ids"] == ["d"]
    assert (rep["total_instances"], rep["submitted_instances"], rep["completed_instances"]) == (4, 3, 2)
    assert rep["model_name_or_path"] == "m" and "log" not in rep["instances"]["a"]
    assert rep["instances"]["c"]["error_reason"] == "sandbox: gone"


def test_an_empty_patch_is_unresolved_without_a_container(monkeypatch):
    """SWE-bench does not run empty patches; validation's `grade(task, "")` still does."""
    import environments.grading as grading

    ran: list[str] = []
    monkeypatch.setattr(grading, "open_sandbox", lambda *a, **k: ran.append("sandbox") or 1 / 0)
    t = TaskInstance(instance_id="i", repo="r", base_commit="c", problem_statement="p", patch="P",
                     test_patch="", FAIL_TO_PASS=["t::a"], PASS_TO_PASS=[], image="img")
    for patch in ("", "  \n", None):
        v = grading.grade_prediction(t, patch, EnvironmentConfig())
        assert (v.status, v.resolved, v.patch_applied) == ("unresolved", False, False)
        assert v.log == grading.EMPTY_PATCH_LOG and not v.error_reason
    assert ran == []
    with pytest.raises(ZeroDivisionError):  # a real patch goes to a sandbox
        grading.grade_prediction(t, "diff --git a/x b/x\n", EnvironmentConfig())
    assert ran == ["sandbox"]
