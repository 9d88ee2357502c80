from pathlib import Path

import pytest

from environments.curation.pytest_output import failures_by_test, head_line, parse_failures
from environments.curation.statements import FailedTest, observed, reproduction, statements
from environments.log_parsers import parse_pytest

pytestmark = pytest.mark.unit

DATA = Path(__file__).parent.parent / "data" / "curation"
LOG = (DATA / "pytest_tb_short.log").read_text()  # a real `pytest -rA --tb=short` run
TESTS_SRC = (DATA / "shapes_tests.txt").read_text()  # the test module of that run
MUTATED_LINE = "return w * h + 1"  # the library line the "bug" is on (shapes.py)
FAILED = ["tests/test_shapes.py::test_area[2-3-6]", "tests/test_shapes.py::test_area[0-5-0]",
          "tests/test_shapes.py::test_area_square", "tests/test_shapes.py::TestParse::test_type"]


def test_head_line_matches_pytest_section_titles():
    assert head_line("tests/a.py::TestX::test_y[1-2]") == "TestX.test_y[1-2]"
    assert head_line("tests/a.py::test_z") == "test_z"


def test_parse_failures_reads_types_messages_and_frames():
    fails = failures_by_test(LOG, FAILED)
    assert set(fails) == set(FAILED)
    area = fails["tests/test_shapes.py::test_area[2-3-6]"]
    assert area.exc_type == "AssertionError"
    assert area.error_lines[0] == "assert 7 == 6"
    assert [(f.path, f.line) for f in area.frames] == [("tests/test_shapes.py", 8)]
    typ = fails["tests/test_shapes.py::TestParse::test_type"]
    assert typ.exc_type == "AttributeError"
    assert [f.path for f in typ.frames] == ["tests/test_shapes.py", "shapes.py"]
    # passed tests have no section; the statuses still come from the -rA summary
    assert "TestParse.test_parse" not in parse_failures(LOG)
    assert parse_pytest(LOG)["tests/test_shapes.py::TestParse::test_parse"] == "PASSED"


def test_observed_orients_expected_and_actual_by_the_call_side():
    fails = failures_by_test(LOG, FAILED)
    kind, v = observed(fails["tests/test_shapes.py::test_area[2-3-6]"], "tests/test_shapes.py")
    assert (kind, v) == ("eq", {"got": "7", "want": "6"})
    # `assert 16 == area(4, 4)`: the call is on the right, so 17 is what the user got
    kind, v = observed(fails["tests/test_shapes.py::test_area_square"], "tests/test_shapes.py")
    assert (kind, v) == ("eq", {"got": "17", "want": "16"})
    kind, v = observed(fails["tests/test_shapes.py::TestParse::test_type"], "tests/test_shapes.py")
    assert kind == "error" and "has no attribute 'split'" in v["message"]


def test_reproduction_turns_parameters_into_assignments_and_adds_imports():
    fails = failures_by_test(LOG, FAILED)
    t = FailedTest("tests/test_shapes.py::test_area[2-3-6]", fails["tests/test_shapes.py::test_area[2-3-6]"],
                   TESTS_SRC, {"w": "2", "h": "3", "expected": "6"})
    snippet = reproduction(t)
    assert snippet == "from shapes import area, parse_size\n\nw = 2\nh = 3\nexpected = 6\nassert area(w, h) == expected"
    ns: dict = {"area": lambda w, h: w * h}
    exec(snippet.split("\n\n", 1)[1], ns)  # runnable against a correct area()


def test_reproduction_of_a_method_stops_at_the_failing_line():
    fails = failures_by_test(LOG, FAILED)
    tid = "tests/test_shapes.py::TestParse::test_type"
    assert reproduction(FailedTest(tid, fails[tid], TESTS_SRC)).endswith("parse_size(None)")
    assert reproduction(FailedTest(tid, fails[tid], None)) is None


def test_hint_levels_add_information_and_never_quote_the_fix():
    fails = failures_by_test(LOG, FAILED)
    tests = [FailedTest(t, fails[t], TESTS_SRC) for t in FAILED]
    texts = statements("shapes", "1.0", tests, [("shapes.py", "area")], seed=3)
    assert sorted(texts) == [0, 1, 2, 3]
    assert "```python" not in texts[0] and "test_shapes" not in texts[0] and "shapes.py" not in texts[0]
    assert "```python" in texts[1] and "tests/test_shapes.py::" not in texts[1]
    assert "tests/test_shapes.py::test_area[2-3-6]" in texts[2] and "`area` in `shapes.py`" not in texts[2]
    assert "`area` in `shapes.py`" in texts[3]
    two = statements("shapes", "1.0", tests, [("shapes.py", "area"), ("shapes.py", "parse_size")], seed=3)
    assert two[3].endswith("in `area` in `shapes.py` and `parse_size` in `shapes.py`.")
    for level in range(3):
        assert texts[level] in texts[level + 1] or texts[level].split("\n\n")[0] in texts[level + 1]
    for text in texts.values():
        assert MUTATED_LINE not in text and "w * h" not in text
    assert "`1`" in texts[0] and "`0`" in texts[0]  # observed vs expected of test_area[0-5-0]


def test_statements_are_deterministic_per_seed_and_vary_across_seeds():
    fails = failures_by_test(LOG, FAILED)
    tests = [FailedTest(t, fails[t], TESTS_SRC) for t in FAILED]
    a = statements("shapes", "1.0", tests, [("shapes.py", "area")], seed=1)
    assert a == statements("shapes", "1.0", tests, [("shapes.py", "area")], seed=1)
    openings = {statements("shapes", "1.0", tests, [("shapes.py", "area")], seed=s)[0].split("\n")[0] for s in range(20)}
    assert len(openings) > 1
