import pytest

from environments.curation.filters import changed_lines, environment_only, static_reason
from environments.records import GradeResult, TaskInstance

pytestmark = pytest.mark.unit


def _patch(files: int, lines_each: int = 1) -> str:
    body = "".join(f"-a{j}\n+b{j}\n" for j in range(lines_each))
    return "".join(f"diff --git a/f{i}.py b/f{i}.py\n--- a/f{i}.py\n+++ b/f{i}.py\n@@ -1 +1 @@\n{body}" for i in range(files))


def _task(**kw) -> TaskInstance:
    d = {"instance_id": "o__r-1", "repo": "o/r", "base_commit": "", "problem_statement": "it breaks",
         "patch": _patch(1), "test_patch": "", "FAIL_TO_PASS": ["t.py::a", "t.py::b"], "PASS_TO_PASS": []}
    return TaskInstance.from_dict({**d, **kw})


def test_size_and_statement_filters_need_no_container():
    assert changed_lines(_patch(2, 3)) == 12
    assert static_reason(_task()) is None
    assert static_reason(_task(problem_statement=" \n")) == ("statement", "empty problem statement")
    assert static_reason(_task(patch=_patch(7))) is None
    assert static_reason(_task(patch=_patch(8)))[0] == "size"
    assert static_reason(_task(patch=_patch(1, 249))) is None  # 498 changed lines
    assert static_reason(_task(patch=_patch(1, 250)))[1].endswith("changes 500 lines (limits: 7, <500)")


def _empty_run(log: str) -> GradeResult:
    return GradeResult("o__r-1", "unresolved", False, False, log=log,
                       tests_status={"FAIL_TO_PASS": {"success": [], "failure": ["t.py::a", "t.py::b"]}})


def test_failing_only_by_import_errors_is_the_environments_fault():
    env = ("=========================== short test summary info ============================\n"
           "FAILED t.py::a - ModuleNotFoundError: No module named 'numpy'\n"
           "ERROR t.py::b - fixture 'mocker' not found\n")
    assert environment_only(_task(), _empty_run(env)).startswith("every FAIL_TO_PASS test fails by an environment error")
    real = env.replace("ERROR t.py::b - fixture 'mocker' not found", "FAILED t.py::b - AssertionError: 1 != 2")
    assert environment_only(_task(), _empty_run(real)) == ""
    assert environment_only(_task(), _empty_run("INTERNALERROR> boom\n")) == ""  # no per-test cause: kept
