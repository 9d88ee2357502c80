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
