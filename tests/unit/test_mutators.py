import ast
import difflib
from pathlib import Path

import pytest

from environments.curation.mutators import (
    MODIFIERS,
    Mutation,
    apply_mutations,
    find_mutations,
    functions,
    still_parses,
)

pytestmark = pytest.mark.unit

SAMPLE = (Path(__file__).parent.parent / "data" / "curation" / "sample_module.py.txt").read_text()


def changed_lines(old: str, new: str) -> list[str]:
    return [line for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def of_kind(kind: str, source: str = SAMPLE) -> list[Mutation]:
    return [m for m in find_mutations(source, "pkg/sample.py") if m.kind == kind]


def test_every_modifier_fires_on_the_sample():
    kinds = {m.kind for m in find_mutations(SAMPLE, "pkg/sample.py")}
    assert kinds == set(MODIFIERS)


def test_every_mutant_parses_and_differs():
    muts = find_mutations(SAMPLE, "pkg/sample.py")
    assert len(muts) > 30
    for m in muts:
        new = m.apply(SAMPLE)
        assert new != SAMPLE, m
        assert still_parses(SAMPLE, [m]), m


@pytest.mark.parametrize("kind, before, after", [
    ("flip_compare", "    if value < low:", "    if value >= low:"),
    ("boundary_shift", "    if value < low:", "    if value <= low:"),
    ("swap_boolop", "        if self.enabled and by > 0:", "        if self.enabled or by > 0:"),
    ("swap_binop", "    for i in range(len(items) - n + 1):", "    for i in range(len(items) + n + 1):"),
    ("off_by_one", "        out.append(items[i:i + n])", "        out.append(items[i + 1:i + n])"),
    ("change_constant", "        self.enabled = True", "        self.enabled = False"),
    ("invert_condition", "    return words[0] if words and not text.startswith(\"#\") else \"\"",
     "    return words[0] if not (words and not text.startswith(\"#\")) else \"\""),
    ("swap_args", "    value = mapping.get(key, default)", "    value = mapping.get(default, key)"),
])
def test_token_level_edits_change_exactly_one_line(kind, before, after):
    found = [changed_lines(SAMPLE, m.apply(SAMPLE)) for m in of_kind(kind)]
    assert [f"-{before}", f"+{after}"] in found


def test_drop_branch_removes_elif_and_keeps_else_attached():
    elifs = [m for m in of_kind("drop_branch") if m.description == "remove elif-block"]
    assert elifs
    new = elifs[0].apply(SAMPLE)
    ns: dict = {}
    exec(compile(ast.parse(new), "x", "exec"), ns)
    assert ns["clamp"](5, 0, 3) == 5  # the `> high` arm is gone, else still returns value
    assert ns["clamp"](-1, 0, 3) == 0


def test_drop_statement_removes_whole_lines_only():
    drops = of_kind("drop_statement")
    descs = {m.description for m in drops}
    assert "remove augmented assignment" in descs and "remove call" in descs
    assert "remove re-assignment" in descs  # `value = str(value)` after `value = ...`
    for m in drops:
        assert m.replacement == ""
        removed = [line for line in changed_lines(SAMPLE, m.apply(SAMPLE)) if line.startswith("-")]
        assert removed and all(not line.startswith("+") for line in changed_lines(SAMPLE, m.apply(SAMPLE)))
    # `label = "café"; words = ...` shares its line: never dropped (it would drop both)
    assert not any("café" in line for m in drops for line in changed_lines(SAMPLE, m.apply(SAMPLE)))


def test_byte_offsets_survive_non_ascii_text_on_the_same_line():
    src = 'def f(text):\n    s = "éé"; return text[1:] if s else None\n'
    muts = find_mutations(src, "m.py")
    slices = [m for m in muts if m.kind == "off_by_one"]
    assert slices and slices[0].apply(src) == 'def f(text):\n    s = "éé"; return text[2:] if s else None\n'


def test_behaviour_actually_changes():
    src = "def lt(a, b):\n    return a < b\n"
    (flip,) = [m for m in find_mutations(src, "m.py") if m.kind == "flip_compare"]
    ns: dict = {}
    exec(flip.apply(src), ns)
    assert ns["lt"](1, 2) is False


def test_docstrings_fstrings_and_module_level_code_are_left_alone():
    src = ('X = 1 + 2\n\n'
           'def f(a):\n    """a < b and c"""\n    return f"{a + 1}"\n')
    assert find_mutations(src, "m.py") == []


def test_only_lines_selects_functions_by_first_line_including_decorators():
    tree = ast.parse(SAMPLE)
    bump = next(node for name, node in functions(tree) if name == "Counter.bump")
    first = min([bump.lineno] + [d.lineno for d in bump.decorator_list])
    assert first == bump.lineno - 1  # the decorator's line, as code.co_firstlineno reports it
    muts = find_mutations(SAMPLE, "pkg/sample.py", only_lines={first})
    assert muts and {m.function for m in muts} == {"Counter.bump"}
    assert all(m.func_line == first for m in muts)


def test_keys_are_stable_and_distinct():
    a = find_mutations(SAMPLE, "pkg/sample.py")
    b = find_mutations(SAMPLE, "pkg/sample.py")
    assert [m.key for m in a] == [m.key for m in b]
    assert len({m.key for m in a}) == len(a)


def test_apply_several_and_refuse_overlaps():
    muts = [m for m in find_mutations(SAMPLE, "pkg/sample.py") if m.kind in ("flip_compare", "change_constant")]
    far = [muts[0], next(m for m in muts if m.lineno > muts[0].lineno + 5)]
    new = apply_mutations(SAMPLE, far)
    assert len(changed_lines(SAMPLE, new)) == 4
    same_spot = [m for m in of_kind("flip_compare") if m.lineno == muts[0].lineno][:1] * 2
    with pytest.raises(ValueError):
        apply_mutations(SAMPLE, same_spot)


def test_unparseable_source_gives_no_mutations():
    assert find_mutations("def f(:\n", "m.py") == []


# ---- choosing and judging candidates (pure parts of environments.curation.synth)

from environments.curation.runner import SuiteRun  # noqa: E402
from environments.curation.synth import Candidate, SynthOptions, combine, judge, order_candidates  # noqa: E402


def singles() -> list[Candidate]:
    return [Candidate([m], [f"t.py::test_{m.function}"]) for m in find_mutations(SAMPLE, "pkg/sample.py")]


def test_order_candidates_visits_every_function_before_repeating_one():
    cands = singles()
    ordered = order_candidates(cands, seed=7)
    assert sorted(c.key for c in ordered) == sorted(c.key for c in cands)
    n_functions = len({c.mutations[0].func_line for c in cands})
    first = [c.mutations[0].func_line for c in ordered[:n_functions]]
    assert len(set(first)) == n_functions
    assert [c.key for c in order_candidates(cands, seed=7)] == [c.key for c in ordered]
    assert [c.key for c in order_candidates(cands, seed=8)] != [c.key for c in ordered]


def test_combine_takes_bugs_from_different_functions_and_unites_their_tests():
    combos = combine(singles(), 2, seed=1)
    assert combos and combine(singles(), 1, seed=1) == singles()
    for c in combos:
        assert len(c.mutations) == 2 and len({m.func_line for m in c.mutations}) == 2
        assert c.tests == sorted({f"t.py::test_{m.function}" for m in c.mutations})
        assert "+" in c.kind or len({m.kind for m in c.mutations}) == 1
        apply_mutations(SAMPLE, c.mutations)  # never overlapping


def run_with(status: dict, log: str = "", code: int = 1, timed_out: bool = False) -> SuiteRun:
    return SuiteRun(status, log, code, timed_out, 1.0)


FAIL_LOG = """=================================== FAILURES ===================================
_________________________________ test_a _________________________________
t.py:3: in test_a
    assert f() == 1
E   assert 2 == 1
_________________________________ test_b _________________________________
t.py:6: in test_b
    g()
E   AttributeError: 'X' object has no attribute 'y'
=========================== short test summary info ============================
"""


def test_judge_reasons():
    opts = SynthOptions(max_failing_share=0.5)
    tests = ["t.py::test_a", "t.py::test_b"]
    assert judge(run_with({}, timed_out=True, code=124), tests, 10, opts)[0] == "timeout"
    assert judge(run_with({"t.py::test_a": "PASSED"}, code=2), tests, 10, opts)[0] == "runner_crash"
    assert judge(run_with({"t.py": "ERROR"}), tests, 10, opts)[0] == "collection_error"
    assert judge(run_with({t: "PASSED" for t in tests}, code=0), tests, 10, opts)[0] == "no_failure"
    both = {t: "FAILED" for t in tests}
    assert judge(run_with(both, FAIL_LOG), tests, 3, opts)[0] == "too_many_failures"  # 2 of 3 > 50 %
    assert judge(run_with(both, FAIL_LOG), tests, 10, opts) == ("ok", set(tests))
    only_b = {"t.py::test_a": "PASSED", "t.py::test_b": "FAILED"}
    assert judge(run_with(only_b, FAIL_LOG), tests, 10, opts) == ("trivial_error", {"t.py::test_b"})
    missing = {"t.py::test_a": "FAILED"}  # test_b absent from the log counts as not passing
    assert judge(run_with(missing, FAIL_LOG), tests, 10, opts)[1] == set(tests)


def test_mutants_failing_mostly_with_module_not_found_are_trivial():
    import json
    from pathlib import Path

    from environments.curation.synth import is_trivial

    # a real one: `backend != 'auto'` flipped; 9 of its 10 reported failures are
    # "ModuleNotFoundError: No module named 'auto'", one asserts on a mock's call
    case = next(c for c in json.loads((Path(__file__).parent.parent / "data" / "curation" / "real_failures.json")
                                      .read_text()) if c["instance_id"].endswith("b89c4daff1"))
    failing = set(case["FAIL_TO_PASS"])
    run = run_with({t: "FAILED" for t in failing}, case["log"])
    assert is_trivial(run, failing)
    assert judge(run, sorted(failing), 100, SynthOptions())[0] == "trivial_error"
    mostly_behaviour = run_with({"t.py::test_a": "FAILED", "t.py::test_b": "FAILED"}, FAIL_LOG)
    assert not is_trivial(mostly_behaviour, {"t.py::test_a", "t.py::test_b"})  # 1 of 2 is not "mostly"
    assert not is_trivial(run_with({"t.py::x": "FAILED"}, ""), {"t.py::x"})  # nothing readable: not trivial
