"""Curation says why a project yields nothing, and refuses to save an empty split."""

import pytest

from environments.curation.curate import empty_split
from environments.curation.projects import Project
from environments.curation.runner import SuiteRun, first_failure

pytestmark = pytest.mark.unit

COLLECTION_LOG = """\
==================================== ERRORS ====================================
_____________________ ERROR collecting tests/test_core.py ______________________
ImportError while importing test module '/testbed/tests/test_core.py'.
E   ModuleNotFoundError: No module named 'tests.helpers'
=========================== short test summary info ============================
ERROR tests/test_core.py - ModuleNotFoundError: No module named 'tests.helpers'
FAILED tests/test_other.py::test_a - AssertionError: assert 1 == 2
"""


def test_the_cause_is_the_collection_error_then_the_first_failure():
    run = SuiteRun({"tests/test_core.py": "ERROR", "tests/test_other.py::test_a": "FAILED"}, COLLECTION_LOG, 2,
                   False, 1.0)
    assert first_failure(run) == "ERROR tests/test_core.py - ModuleNotFoundError: No module named 'tests.helpers'"
    run.status = {"tests/test_other.py::test_a": "FAILED"}
    assert first_failure(run) == "FAILED tests/test_other.py::test_a - AssertionError: assert 1 == 2"
    assert first_failure(SuiteRun({}, "", 4, False, 0.1)) == "exit code 4, empty log"


def test_an_empty_split_names_each_project_and_why():
    projects = [Project(name="a", version="1", split="train"), Project(name="b", version="2", split="train")]
    message = empty_split("train", projects, {}, {"a==1": "RunnerError: a==1: no test passes deterministically; ERROR x"})
    assert message.startswith("the train split is empty, nothing was saved: a==1: RunnerError")
    assert "b==2: 0 tasks kept (candidates by outcome: none)" in message
