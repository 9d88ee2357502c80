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
