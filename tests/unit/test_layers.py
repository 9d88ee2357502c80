"""The house's import graph (tests/layers.py) keeps its shape: no circles, arrows only downwards,
the sandbox entered by its front door, no private names across modules, short functions."""

import pytest

from tests import layers

pytestmark = pytest.mark.unit


def test_no_circles_and_no_arrow_runs_up():
    g = layers.scan()
    assert layers.cycles(g) == []
    assert layers.layer_violations(g) == []


def test_functions_fit_one_screen():
    assert layers.long_functions() == []


def test_the_checker_sees_a_circle_and_an_upward_arrow(tmp_path):
    """It can fail: a planted circle and a planted upward import are both reported."""
    for pkg in layers.PACKAGES:
        (tmp_path / pkg).mkdir()
    (tmp_path / "swerl" / "a.py").write_text("from swerl import b\n")
    (tmp_path / "swerl" / "b.py").write_text("def f():\n    from swerl.a import x\n    from training import t\n")
    (tmp_path / "swerl" / "c.py").write_text("_hidden = 1\n")
    (tmp_path / "training" / "t.py").write_text("from swerl.c import _hidden\n")
    g = layers.scan(tmp_path)
    assert layers.cycles(g) == [["swerl.a", "swerl.b"]]
    bad = layers.layer_violations(g)
    assert any(v.startswith("swerl.b -> training.t") for v in bad)
    assert any("private _hidden" in v for v in bad)
