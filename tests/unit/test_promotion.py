import pytest

from training.promotion import decide

pytestmark = pytest.mark.unit


def _report(rates, h="h1"):
    return {"per_task": rates, "pass@1": sum(rates.values()) / len(rates), "dataset_hash": h}


def test_first_version_is_promoted():
    assert decide(_report({"a": 0.0}), None, 0.05).promote


def test_clearly_better_promoted_tied_not():
    champ = _report({f"t{i}": 0.1 for i in range(10)})
    better = _report({f"t{i}": 0.9 for i in range(10)})
    tied = _report({f"t{i}": 0.1 for i in range(10)})
    d = decide(better, champ, 0.05)
    assert d.promote and d.p_value == pytest.approx(1 / 1024)
    d2 = decide(tied, champ, 0.05)
    assert not d2.promote and d2.p_value == 1.0
    assert d2.tags()["swerl.promotion.decision"] == "rejected"


def test_different_eval_sets_are_not_compared():
    d = decide(_report({"a": 1.0}, "h1"), _report({"a": 0.0}, "h2"), 0.05)
    assert not d.promote and "differ" in d.reason


def test_worse_challenger_is_not_promoted():
    champ = _report({f"t{i}": 0.9 for i in range(10)})
    worse = _report({f"t{i}": 0.1 for i in range(10)})
    d = decide(worse, champ, 0.05)
    assert not d.promote and d.reason.startswith("not better") and d.delta == pytest.approx(-0.8)


def test_manual_override_promotes_and_says_so():
    champ = _report({f"t{i}": 0.5 for i in range(10)})
    tied = _report({f"t{i}": 0.5 for i in range(10)})
    d = decide(tied, champ, 0.05, manual=True)
    assert d.promote and d.manual and d.p_value == 1.0 and d.reason.startswith("manual override")
    assert d.tags()["swerl.promotion.manual"] == "true"
    assert decide(_report({"a": 1.0}, "h1"), _report({"a": 0.0}, "h2"), 0.05, manual=True).promote


def test_pairing_uses_only_tasks_graded_on_both_sides():
    """A task the champion lost to infra errors (absent from per_task) is not a free win."""
    champ = {"per_task": {f"t{i}": 0.5 for i in range(4)}, "pass@1": 0.5, "dataset_hash": "h1"}
    chall = _report({**{f"t{i}": 0.5 for i in range(4)}, **{f"x{i}": 1.0 for i in range(8)}})
    d = decide(chall, champ, 0.05)
    assert not d.promote and d.paired_tasks == 4 and d.p_value == 1.0
    assert decide(chall, {**champ, "per_task": {}}, 0.05).reason.endswith("no task graded in both evaluations")


def test_small_but_consistent_gain_is_significant_only_with_enough_tasks():
    few = decide(_report({f"t{i}": 0.6 for i in range(4)}), _report({f"t{i}": 0.4 for i in range(4)}), 0.05)
    many = decide(_report({f"t{i}": 0.6 for i in range(8)}), _report({f"t{i}": 0.4 for i in range(8)}), 0.05)
    assert not few.promote and few.p_value == pytest.approx(1 / 16)
    assert many.promote and many.p_value == pytest.approx(1 / 256)
