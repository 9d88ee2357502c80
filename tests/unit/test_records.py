import pytest

from environments.records import TaskInstance, at_hint_level

pytestmark = pytest.mark.unit


def _task(**meta) -> TaskInstance:
    return TaskInstance(instance_id="p__1__m__x", repo="p", base_commit="", patch="", test_patch="", problem_statement="level 1",
                        FAIL_TO_PASS=["t"], PASS_TO_PASS=[], meta=meta)


def test_a_task_is_restated_at_the_configured_hint_level():
    t = _task(hint_level=1, statements={"0": "level 0", "1": "level 1", "3": "level 3 names f in p.py"})
    three = at_hint_level(t, 3)
    assert three.problem_statement == "level 3 names f in p.py" and three.meta["hint_level"] == 3
    assert t.problem_statement == "level 1" and t.meta["hint_level"] == 1  # the original is untouched
    assert at_hint_level(t, 1) is t
    assert at_hint_level(t, 2) is t  # no such level stored: unchanged
    assert at_hint_level(_task(), 3).problem_statement == "level 1"  # imported tasks have none


def test_the_curriculum_selects_kinds_and_level_then_caps():
    from swerl.config import DataConfig
    from training.data import select_tasks

    def t(i, project, modifier):
        return TaskInstance(instance_id=f"{project}__1__{modifier}__{i}", repo=project, base_commit="", patch="",
                            test_patch="", problem_statement="l1", FAIL_TO_PASS=["t"], PASS_TO_PASS=[],
                            meta={"modifier": modifier, "project": project, "hint_level": 1,
                                  "statements": {"1": "l1", "3": f"l3 {i}"}})

    tasks = [t(0, "a", "swap_args"), t(1, "a", "flip_compare"), t(2, "a", "swap_args"),
             t(3, "b", "swap_args+flip_compare"), t(4, "b", "swap_args"), t(5, "c", "")]
    got = select_tasks(tasks, DataConfig(hint_level=3, modifiers=["swap_args"], max_tasks_per_project=1))
    assert [x.instance_id for x in got] == ["a__1__swap_args__0", "b__1__swap_args__4"]
    assert [x.problem_statement for x in got] == ["l3 0", "l3 4"]
    assert len(select_tasks(tasks, DataConfig(max_tasks=4))) == 4
    assert len(select_tasks(tasks, DataConfig(modifiers=["swap_args", "flip_compare"]))) == 5


BUG_PATCH = """diff --git a/p/m.py b/p/m.py
--- a/p/m.py
+++ b/p/m.py
@@ -3,3 +3,3 @@ def f(a, b):
     x = 1
-    return a - b
+    return b - a
"""


def test_hint_level_4_adds_the_wrong_line_and_falls_back_to_3():
    t = _task(hint_level=1, bug_patch=BUG_PATCH, statements={"1": "level 1", "3": "level 3 names f in p/m.py"})
    four = at_hint_level(t, 4)
    assert four.problem_statement == "level 3 names f in p/m.py\n\nThis line looks wrong: `return b - a`"
    assert four.meta["hint_level"] == 4 and "a - b" not in four.problem_statement  # never the fix
    dropped = BUG_PATCH.replace("+    return b - a\n", "")  # a removed statement: no wrong line to show
    three = at_hint_level(_task(hint_level=1, bug_patch=dropped, statements={"3": "level 3"}), 4)
    assert three.problem_statement == "level 3" and three.meta["hint_level"] == 3
    assert at_hint_level(_task(), 4).problem_statement == "level 1"  # imported: unchanged


def test_exact_hint_level_drops_tasks_that_cannot_be_stated_at_it():
    from swerl.config import DataConfig
    from training.data import select_tasks

    one_line = _task(hint_level=1, bug_patch=BUG_PATCH, statements={"3": "level 3"})
    dropped = _task(hint_level=1, bug_patch=BUG_PATCH.replace("+    return b - a\n", ""), statements={"3": "level 3"})
    tasks = [one_line, dropped, _task()]  # the last is imported: no statements at all
    assert len(select_tasks(tasks, DataConfig(hint_level=4, max_tasks_per_project=9))) == 3
    (kept,) = select_tasks(tasks, DataConfig(hint_level=4, exact_hint_level=True, max_tasks_per_project=9))
    assert kept.meta["hint_level"] == 4 and kept.problem_statement.endswith("`return b - a`")
