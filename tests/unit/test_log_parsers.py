"""Log parsers on pytest output recorded from the base image (pytest 7.2.1, `-rA`)."""

import pytest

from environments.log_parsers import output_section, parse_log, parse_pytest, strip_ansi

pytestmark = pytest.mark.unit

# The short summary of a file exercising every outcome, as pytest 7.2.1 printed it.
SUMMARY = """\
============================= test session starts ==============================
collected 12 items

test_s.py .FsxXFE.E...                                                   [100%]
=========================== short test summary info ============================
PASSED test_s.py::test_pass
PASSED test_s.py::test_teardown_err
PASSED test_s.py::test_param[negative int]
PASSED test_s.py::test_param[[x]]
PASSED test_s.py::TestC::test_m
SKIPPED [1] test_s.py:5: nope
XFAIL test_s.py::test_xfail - known
XPASS test_s.py::test_xpass known
ERROR test_s.py::test_error - RuntimeError: fixture
ERROR test_s.py::test_teardown_err - RuntimeError: teardown
FAILED test_s.py::test_fail - AssertionError: boom - dash
FAILED test_s.py::test_xpass_strict
FAILED test_s.py::test_param[a - b] - assert 2 != 2
==== 3 failed, 5 passed, 1 skipped, 1 xfailed, 1 xpassed, 2 errors in 0.23s ====
"""

EXPECTED = {
    "test_s.py::test_pass": "PASSED",
    "test_s.py::test_teardown_err": "ERROR",  # passed, then its teardown failed: the worse wins
    "test_s.py::test_param[negative int]": "PASSED",
    "test_s.py::test_param[[x]]": "PASSED",
    "test_s.py::TestC::test_m": "PASSED",
    "test_s.py::test_xfail": "XFAIL",
    "test_s.py::test_xpass": "XPASS",
    "test_s.py::test_error": "ERROR",
    "test_s.py::test_fail": "FAILED",
    "test_s.py::test_xpass_strict": "FAILED",
    "test_s.py::test_param[a - b]": "FAILED",
}

# The same run with `--color=yes` (humanize sets it in its addopts): codes inside the ids.
COLORED = (
    "\x1b[36m\x1b[1m=========================== short test summary info ============================\x1b[0m\n"
    "\x1b[32mPASSED\x1b[0m test_s.py::\x1b[1mtest_param[negative int]\x1b[0m\n"
    "\x1b[33mXPASS\x1b[0m test_s.py::\x1b[1mtest_xpass\x1b[0m known\n"
    "\x1b[31mFAILED\x1b[0m test_s.py::\x1b[1mtest_param[a - b]\x1b[0m - assert 2 != 2\n"
)

COLLECTION_ERROR = """\
==================================== ERRORS ====================================
___________________ ERROR collecting tests/test_filesize.py ____________________
E   ModuleNotFoundError: No module named 'humanize'
=========================== short test summary info ============================
ERROR tests/test_filesize.py
!!!!!!!!!!!!!!!!!!!! Interrupted: 1 error during collection !!!!!!!!!!!!!!!!!!!!
"""


def test_every_outcome_of_the_summary():
    assert parse_pytest(SUMMARY) == EXPECTED


def test_skipped_lines_name_no_test():
    assert not any(k.startswith("[") for k in parse_pytest(SUMMARY))


def test_colours_are_stripped_and_ids_with_spaces_kept():
    assert parse_pytest(COLORED) == {
        "test_s.py::test_param[negative int]": "PASSED",
        "test_s.py::test_xpass": "XPASS",
        "test_s.py::test_param[a - b]": "FAILED",
    }
    assert "\x1b" not in strip_ansi(COLORED)


def test_collection_error_is_kept_under_the_file():
    assert parse_pytest(COLLECTION_ERROR) == {"tests/test_filesize.py": "ERROR"}


def test_reason_with_brackets_does_not_extend_the_id():
    log = "FAILED t.py::test_a - KeyError: ['x']\nXFAIL t.py::test_b[1-2] - reason [see #12]\n"
    assert parse_pytest(log) == {"t.py::test_a": "FAILED", "t.py::test_b[1-2]": "XFAIL"}


def test_passed_line_with_a_reason_after_the_id():
    # what pytest 7.2 prints when a conftest hook flips a failed report to passed
    assert parse_pytest("PASSED t.py::test_get_in - Type...\n") == {"t.py::test_get_in": "PASSED"}


def test_unbalanced_bracket_in_an_id_falls_back_to_the_separator():
    assert parse_pytest("FAILED t.py::test_a[x[-y] - assert 0\n") == {"t.py::test_a[x[-y]": "FAILED"}


def test_progress_lines_and_prose_are_not_results():
    log = "PASSED\nFAILED\nThe test PASSED t.py::x\ntests/t.py::test_a PASSED [ 50%]\n"
    assert parse_pytest(log) == {}


def test_swebench_markers_delimit_the_test_output():
    log = "PASSED setup.py::noise\n+ : '>>>>> Start Test Output'\nPASSED t.py::a\n+ : '>>>>> End Test Output'\n"
    assert output_section(log).strip().splitlines()[1] == "PASSED t.py::a"
    assert output_section("PASSED t.py::a\n") == "PASSED t.py::a\n"


def test_look_alike_lines_printed_by_tests_before_the_summary_are_ignored():
    log = ("----------------------------- Captured stdout call -----------------------------\n"
           "PASSED t.py::test_f2p\n"
           "=========================== short test summary info ============================\n"
           "PASSED t.py::test_other\nERROR t.py - ImportError: boom\n")
    assert parse_log(log, "pytest") == {"t.py::test_other": "PASSED", "t.py": "ERROR"}


def test_swebench_parser_is_chosen_by_repo():
    log = "test_ascii (auth_tests.test_validators.UsernameValidatorsTests) ... ok\n"
    assert parse_log(log, "swebench", "django/django") == {
        "test_ascii (auth_tests.test_validators.UsernameValidatorsTests)": "PASSED"
    }


def test_unknown_parser_or_repo_is_an_error():
    with pytest.raises(ValueError, match="unknown log_parser"):
        parse_log("", "nose")
    with pytest.raises(ValueError, match="no parser for repo"):
        parse_log("", "swebench", "someone/unknown")
