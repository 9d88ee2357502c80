"""`swerl evaluate` then `swerl grade` on its predictions: the same verdict for every instance.

The evaluation grades each episode's patch inside the rollout; `swerl grade` grades the written
SWE-bench predictions again in fresh containers, the way an outside reader would. They can only
agree if the predictions carry exactly the patches that were graded, against the same tasks.
The default model's patches are mostly empty, so the file also gets the gold fix of one task
and a plausible wrong fix of another, whose in-rollout verdicts come from the path an episode's
patch takes (`SWEEnv.grade`): both sides must agree on non-empty patches too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from environments.images import ensure_images
from environments.records import load_tasks
from environments.swe_env import SWEEnv
from swerl.config import load_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "fixtures" / "tasks.jsonl"
RUN_ID = "eval-grade-test"
GOLD, WRONG = "semver__prerelease-numeric-order", "humanize__intcomma-negative"


def swerl(cwd: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    out = subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=1200)
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
    return out.stdout


def test_grade_reproduces_the_evaluations_verdicts(tmp_path):
    printed = swerl(tmp_path, "evaluate", "--preset", "smoke", "--run-id", RUN_ID, "--runs", "1",
                    "--set", "eval.max_tasks=2", "--set", "eval.k=[1]", "--set", "rollout.max_turns=1",
                    "--set", "eval.sampling.max_new_tokens=16")
    eval_dir = tmp_path / ".swerl" / "store" / "runs" / RUN_ID / "eval" / "base"
    preds_file = eval_dir / "predictions-run0.jsonl"
    assert "Pass@1  " in printed and " ± " in printed and "by project" in printed
    assert str(preds_file) in printed, "the printout says where the predictions are"

    preds = [json.loads(line) for line in preds_file.read_text().splitlines()]
    assert len(preds) == 2 and all(set(p) == {"instance_id", "model_name_or_path", "model_patch"} for p in preds)
    ours = json.loads((eval_dir / "report-run0.json").read_text())["instances"]
    assert set(ours) == {p["instance_id"] for p in preds}
    assert all(v["status"] != "error" for v in ours.values()), ours  # an infra error proves nothing here

    tasks = {t.instance_id: t for t in load_tasks(str(FIXTURES)).tasks}
    assert not {GOLD, WRONG} & set(ours)
    wrong = tasks[WRONG].patch.replace(r'r"^(-?\d+)(\d{3})"', r'r"^(-\d+)(\d{3})"')  # breaks positive numbers
    assert wrong != tasks[WRONG].patch
    extra = [{"instance_id": GOLD, "model_name_or_path": "gold", "model_patch": tasks[GOLD].patch},
             {"instance_id": WRONG, "model_name_or_path": "gold", "model_patch": wrong}]
    mixed = tmp_path / "predictions.jsonl"
    mixed.write_text("".join(json.dumps(p) + "\n" for p in preds + extra))

    swerl(tmp_path, "grade", "--preset", "smoke", "--tasks", str(FIXTURES), "--predictions", str(mixed),
          "--report", str(tmp_path / "graded.json"))
    graded = json.loads((tmp_path / "graded.json").read_text())["instances"]
    assert {iid: graded[iid]["status"] for iid in ours} == {iid: v["status"] for iid, v in ours.items()}
    for iid in ours:
        assert graded[iid]["tests_status"] == ours[iid]["tests_status"], iid
    assert graded[GOLD]["status"] == "resolved"
    assert graded[WRONG]["status"] == "unresolved" and graded[WRONG]["patch_applied"]

    env_cfg = load_config("smoke").environment
    images = ensure_images([tasks[GOLD], tasks[WRONG]])
    for p in extra:
        task = tasks[p["instance_id"]]
        task.image = images[task.instance_id]
        in_rollout = SWEEnv(task, env_cfg).grade(p["model_patch"])
        assert in_rollout.status == graded[task.instance_id]["status"], task.instance_id
        assert in_rollout.tests_status == graded[task.instance_id]["tests_status"], task.instance_id
