"""load_split: a train task whose own reference patch the grader refuses is dropped; eval keeps it."""

import logging

import pytest

from swerl.config import load_config
from training import data
from training.run import RunContext

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("split, dropped", [("train", True), ("eval", False)])
def test_refused_reference_patch(monkeypatch, caplog, split, dropped):
    ctx = RunContext(cfg=load_config("smoke"), store=None, run_id="t")
    monkeypatch.setattr(data, "ensure_images", lambda tasks, progress: {t.instance_id: "img" for t in tasks})
    seen = []

    def refuse_first(tasks, env_cfg):
        seen.extend(t.instance_id for t in tasks)
        return {tasks[0].instance_id: ["tools/x.py: outside the source directories pkg/"]}

    monkeypatch.setattr(data, "gold_out_of_scope", refuse_first)
    with caplog.at_level(logging.ERROR, logger="training.data"):
        got = [t.instance_id for t in data.load_split(ctx, split)]
    assert len(seen) == 3  # smoke's max_tasks
    assert got == (seen[1:] if dropped else seen)
    assert "the grader refuses its own reference patch (tools/x.py" in caplog.text
    assert ("skipping train task" if dropped else "keeping eval task") in caplog.text
