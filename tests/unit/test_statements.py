import ast
import json
import re
from pathlib import Path

import pytest

from environments.curation.pytest_output import failure_report, failures_by_test, head_line, parse_failures
from environments.curation.repro import build
from environments.curation.statements import FailedTest, observe, reproduction, statements, title
from environments.curation.synth import describe
from environments.log_parsers import parse_pytest
from environments.records import TaskInstance

pytestmark = pytest.mark.unit

DATA = Path(__file__).parent.parent / "data" / "curation"
LOG = (DATA / "pytest_tb_short.log").read_text()  # a real `pytest -rA --tb=short` run
TESTS_SRC = (DATA / "shapes_tests.txt").read_text()  # the test module of that run
MUTATED_LINE = "return w * h + 1"  # the library line the "bug" is on (shapes.py)
FAILED = ["tests/test_shapes.py::test_area[2-3-6]", "tests/test_shapes.py::test_area[0-5-0]",
          "tests/test_shapes.py::test_area_square", "tests/test_shapes.py::TestParse::test_type"]
# Tasks of the demo datasets whose statements read badly before (quoted `self.assertEqual`,
# `from whatever import _`, "the check fails" when pytest's section title was long, chained
# exceptions), with what they were written from: pytest's report of the failing tests (-vv),
# their parameters and test files.
REAL = {case["instance_id"]: case for case in json.loads((DATA / "real_failures.json").read_text())}


def failed(tid: str, params: dict | None = None) -> FailedTest:
    return FailedTest(tid, failures_by_test(LOG, FAILED)[tid], TESTS_SRC, params or {})


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
    assert typ.exc_type == typ.cause_type == "AttributeError"
    assert [f.path for f in typ.frames] == ["tests/test_shapes.py", "shapes.py"]
    # passed tests have no section; the statuses still come from the -rA summary
    assert "TestParse.test_parse" not in parse_failures(LOG)
    assert parse_pytest(LOG)["tests/test_shapes.py::TestParse::test_parse"] == "PASSED"


def test_long_section_titles_and_bare_exception_names_are_read():
    # pytest pads a title to 80 columns, down to one underscore a side for a long id
    case = REAL["isodate__0.7.2__drop_branch__f51bc5dbf7"]
    (tid,) = case["FAIL_TO_PASS"]
    assert len(head_line(tid)) > 76 and f"_ {head_line(tid)} _" in case["log"]
    assert failures_by_test(case["log"], [tid])[tid].exc_type == "TypeError"
    log = "=== FAILURES ===\n___ test_x ___\nt.py:3: in test_x\n    f()\nE   Failed: DID NOT RAISE ValueError\n"
    assert parse_failures(log)["test_x"].exc_type == "Failed"


def test_chained_exceptions_keep_the_last_as_the_failure_and_the_first_as_its_cause():
    case = REAL["schema__0.7.8__drop_statement__13612ab782"]
    fail = failures_by_test(case["log"], ["test_schema.py::test_dict_key_error"])["test_schema.py::test_dict_key_error"]
    assert (fail.exc_type, fail.cause_type) == ("AssertionError", "SchemaUnexpectedTypeError")
    assert fail.error_lines[0].startswith("assert '' == ")  # not the messages of the caught ones
    assert [f.line for f in fail.frames if f.path == "test_schema.py"] == [435]


def test_failure_report_keeps_only_the_named_tests_sections():
    report = failure_report(LOG, ["tests/test_shapes.py::test_area_square"])
    assert set(parse_failures(report)) == {"test_area_square"}
    assert parse_failures(report)["test_area_square"].error_lines == ["assert 16 == 17", " +  where 17 = area(4, 4)"]
    assert failure_report(LOG, ["tests/test_shapes.py::TestParse::test_parse"]) == ""


def test_observe_orients_observed_and_expected_by_the_test_code():
    obs = observe(failed(FAILED[0]).failure, failed(FAILED[0]).repro())
    assert (obs.kind, obs.got, obs.want) == ("eq", "7", "6")
    # `assert 16 == area(4, 4)`: the call is on the right, so 17 is what the user got
    t = failed("tests/test_shapes.py::test_area_square")
    assert (observe(t.failure, t.repro()).got, observe(t.failure, t.repro()).want) == ("17", "16")
    t = failed("tests/test_shapes.py::TestParse::test_type")
    obs = observe(t.failure, t.repro())
    assert obs.kind == "error" and "has no attribute 'split'" in obs.message


def test_reproduction_writes_parameters_in_and_checks_as_printed_values():
    snippet = reproduction(failed(FAILED[0], {"w": "2", "h": "3", "expected": "6"}))
    assert snippet == "from shapes import area\n\nprint(area(2, 3))  # expected: 6"
    ns: dict = {"area": lambda w, h: w * h, "print": lambda *a: None}
    exec(snippet.split("\n\n", 1)[1], ns)  # runnable against a correct area()


def test_reproduction_of_a_method_stops_at_the_failing_line_and_rewrites_raises():
    assert reproduction(failed("tests/test_shapes.py::TestParse::test_type")).endswith("parse_size(None)")
    assert reproduction(FailedTest("tests/test_shapes.py::TestParse::test_type", None, None)) is None
    bad = build(TESTS_SRC, "tests/test_shapes.py::TestParse::test_bad")
    assert bad is not None and bad.raises == "ValueError"
    assert bad.code.endswith("# expected: the next line raises ValueError\nparse_size('3y4')")
    assert "pytest" not in bad.code


def test_reproduction_slices_away_steps_the_failing_check_does_not_need():
    src = ("from lib import make, other\n\ndef test_x():\n    a = make(1)\n    b = other(2)\n"
           "    assert b.ok\n    a.grow()\n    assert a.size == 3\n")
    r = build(src, "t.py::test_x", [("test_x", 8)])
    assert r is not None
    assert r.code == "from lib import make\n\na = make(1)\na.grow()\nprint(a.size)  # expected: 3"
    assert r.call == "a.grow()" and r.expected == "3"


def test_reproduction_inlines_a_failing_helper_and_simple_fixtures():
    src = ("import pytest\nfrom lib import parse, Box\n\n@pytest.fixture\ndef box():\n    return Box(3)\n\n"
           "def _check(text, want):\n    assert parse(text) == want\n\n"
           "def test_y(box):\n    box.fill()\n    _check('a b', ['a', 'b'])\n")
    r = build(src, "t.py::test_y", [("test_y", 13), ("_check", 9)])
    assert r is not None
    assert r.code == "from lib import parse\n\nprint(parse('a b'))  # expected: ['a', 'b']"
    r = build(src.replace("_check('a b', ['a', 'b'])", "assert box.size == 4"), "t.py::test_y", [("test_y", 13)])
    assert r is not None
    assert r.code.splitlines()[-3:] == ["box = Box(3)", "box.fill()", "print(box.size)  # expected: 4"]


def describe_real(case: dict) -> TaskInstance:
    task = TaskInstance(case["instance_id"], f"pypi/{case['project']}", "", "", "", "", case["FAIL_TO_PASS"], [],
                        version=case["version"],
                        meta={"project": case["project"], "mutations": case["mutations"], "hint_level": 1})
    return describe(task, {"log": case["log"], "params": case["params"]}, case["sources"])


STATEMENT_CASES = [c for c in REAL if c != "python-slugify__9.2.0__flip_compare__b89c4daff1"]


@pytest.mark.parametrize("iid", STATEMENT_CASES)
def test_real_statements_read_like_bug_reports(iid):
    task = describe_real(REAL[iid])
    texts = task.meta["statements"]
    assert task.problem_statement == texts["1"]
    code = re.search(r"```python\n(.*?)\n```", texts["1"], re.S)
    assert code is not None, texts["1"]
    ast.parse(code.group(1))  # the reproduction is Python
    removed = [line[1:].strip() for line in REAL[iid]["bug_patch"].splitlines()
               if line[:1] in "+-" and not line.startswith(("+++", "---")) and len(line.strip()) > 8]
    for level in "012":
        text = texts[level]
        title = text.split("\n", 1)[0]
        assert title and not title.startswith(("I ", "Something", "There")) and len(title) < 200, title
        for bad in ("self.assert", "self.fail", "the check fails", "pytest says", "import _", "__swerl"):
            assert bad not in text, (bad, text)
        assert not re.search(r"^\s*assert ", text, re.M), text  # checks are prose or printed values
        assert not re.search(r"^from \S+ import .*\b_\w", text, re.M), text  # no private names
        assert not any(line in text for line in removed), text  # never the bug nor the fix
    assert "```python" not in texts["0"] and "```python" in texts["1"]
    assert REAL[iid]["FAIL_TO_PASS"][0] in texts["2"] and "in `" in texts["3"]


def test_real_statement_contents():
    funcy = describe_real(REAL["funcy__2.1__invert_condition__4ee263e011"]).problem_statement
    assert "from funcy.tree import ltree_nodes" in funcy and "whatever" not in funcy  # `import *` spelled out
    assert "print(ltree_nodes([1, 2, [3, [4]], 5]))" in funcy and "It returns `[]`" in funcy
    slug = describe_real(REAL["python-slugify__9.2.0__change_constant__0454048e2d"]).problem_statement
    assert "def modern(text, **kwargs):" in slug  # the test file's helper, copied in
    assert "print(modern(" in slug and "# expected: " in slug
    iso = describe_real(REAL["isodate__0.7.2__drop_branch__f51bc5dbf7"]).problem_statement
    assert iso.startswith("`dur1 - dur2` raises TypeError") and "unsupported operand type" in iso
    cache = describe_real(REAL["cachetools__8.0.2__drop_statement__417d735f6a"]).problem_statement
    assert "timer = Timer()" in cache or "cache.expire(" in cache  # the setup the failing check needs
    schema = describe_real(REAL["schema__0.7.8__drop_statement__13612ab782"]).problem_statement
    assert "schema.SchemaUnexpectedTypeError" not in schema.split("\n", 1)[0]  # the caught one is not the symptom


def test_hint_levels_add_information_and_never_quote_the_fix():
    tests = [failed(t) for t in FAILED]
    texts = statements("shapes", "1.0", tests, [("shapes.py", "area")], seed=3)
    assert sorted(texts) == [0, 1, 2, 3]
    # the representative failure is one whose reproduction runs as it is (test_area's needs w, h)
    assert texts[0].split("\n", 1)[0] == "`area(4, 4)` returns `17` instead of `16`"
    assert "```python" not in texts[0] and "test_shapes" not in texts[0] and "shapes.py" not in texts[0]
    assert "```python" in texts[1] and "tests/test_shapes.py::" not in texts[1]
    assert "tests/test_shapes.py::test_area[2-3-6]" in texts[2] and "`area` in `shapes.py`" not in texts[2]
    assert "`area` in `shapes.py`" in texts[3]
    two = statements("shapes", "1.0", tests, [("shapes.py", "area"), ("shapes.py", "parse_size")], seed=3)
    assert two[3].endswith("in `area` in `shapes.py` and `parse_size` in `shapes.py`.")
    for level in range(3):
        assert texts[level].split("\n\n")[0] in texts[level + 1]
    for text in texts.values():
        assert MUTATED_LINE not in text and "w * h" not in text


def test_titles_name_the_symptom():
    t = failed("tests/test_shapes.py::TestParse::test_type")
    assert title(observe(t.failure, t.repro()), t.repro(), "shapes") == "`parse_size(None)` raises AttributeError"
    assert title(observe(None, None), None, "shapes") == "Wrong result from shapes"


def test_statements_are_deterministic_per_seed_and_vary_across_seeds():
    tests = [failed(t) for t in FAILED]
    a = statements("shapes", "1.0", tests, [("shapes.py", "area")], seed=1)
    assert a == statements("shapes", "1.0", tests, [("shapes.py", "area")], seed=1)
    openings = {statements("shapes", "1.0", tests, [("shapes.py", "area")], seed=s)[0].split("\n\n")[1]
                for s in range(20)}
    assert len(openings) > 1
