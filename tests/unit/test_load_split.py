"""load_split: a train task whose own reference patch the grader refuses is dropped; eval keeps it.
A task without an image is reported and skipped; the others go on."""

import logging

import pytest

from environments.images import ImageSet
from swerl.config import load_config
from training import data
from training.run import RunContext

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("split, dropped", [("train", True), ("eval", False)])
def test_refused_reference_patch(monkeypatch, caplog, split, dropped):
    ctx = RunContext(cfg=load_config("smoke"), store=None, run_id="t")
    built = []

    def build_images(tasks, progress, workers):
        built.extend(t.instance_id for t in tasks)
        return ImageSet(images={t.instance_id: "img" for t in tasks[1:]},
                        errors={tasks[0].instance_id: "no image: pip failed"},
                        details={tasks[0].instance_id: "pip failed: no matching distribution"})

    monkeypatch.setattr(data, "build_images", build_images)
    seen = []

    def refuse_first(tasks, env_cfg, cache):
        seen.extend(t.instance_id for t in tasks)
        return {tasks[0].instance_id: ["tools/x.py: outside the source directories pkg/"]}

    monkeypatch.setattr(data, "gold_out_of_scope", refuse_first)
    with caplog.at_level(logging.ERROR, logger="training.data"):
        got = [t.instance_id for t in data.load_split(ctx, split)]
    assert len(built) == 3  # smoke's max_tasks
    assert seen == built[1:]  # the task without an image is not checked
    assert got == (seen[1:] if dropped else seen)
    assert f"skipping task {built[0]}: its image could not be built: pip failed: no matching" in caplog.text
    assert "the grader refuses its own reference patch (tools/x.py" in caplog.text
    assert ("skipping train task" if dropped else "keeping eval task") in caplog.text
