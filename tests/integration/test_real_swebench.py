"""A real SWE-bench instance end to end, offline: marshmallow-code__marshmallow-1343 (SWE-bench
full/Verified, version 2.20, Python 3.9), its row as the dataset gives it, its repository as a
git bundle of the base and environment-setup commits (tests/data/swebench_real). Import with
`--repo-mirror`, offline build on the bullseye base (swebench's own spec: `pip install -e
'.[dev]'`, `pytest -rA`), grading: gold resolves, empty does not; the paper's filters; and
`swerl grade` on a file where some tasks can get no image."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from environments.curation.filters import filter_tasks
from environments.curation.importers import import_tasks
from environments.grading import grade
from environments.images import build_images
from swerl.config import load_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DATA = Path(__file__).resolve().parents[1] / "data" / "swebench_real"
IID = "marshmallow-code__marshmallow-1343"


@pytest.fixture(scope="module")
def mirror(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mirror")
    subprocess.run(["git", "clone", "-q", "--bare", str(DATA / "marshmallow-code__marshmallow.bundle"),
                    str(root / "marshmallow-code__marshmallow.git")], check=True)
    return root


@pytest.fixture(scope="module")
def imported(mirror):
    report = import_tasks(str(DATA / "instances.jsonl"), "swe-bench-verified", repo_mirror=str(mirror))
    assert report.errors == []
    (task,) = report.tasks
    return task


def test_the_row_imports_with_swebenchs_spec_and_builds_offline_on_python_3_9(imported):
    task = imported
    assert task.meta["env_recipe"]["origin"] == "swebench" and task.meta["env_spec"]["python"] == "bullseye"
    assert "python_substitution" not in task.meta  # 3.9 is what bullseye ships
    assert task.test_cmd == "pytest -rA tests/test_marshalling.py" and task.log_parser == "swebench"
    lines: list[str] = []
    t0 = time.monotonic()
    got = build_images([task], progress=lines.append)
    assert got.errors == {} and got.routes == {IID: "built"}
    assert any("registry not reachable" in line or "not available" in line for line in lines) or \
        not any("prebuilt" in line for line in lines)
    cached: list[str] = []
    t1 = time.monotonic()
    again = build_images([task], progress=cached.append)
    print(f"[real-swebench] build {t1 - t0:.1f} s (cold or partly cached), cached {time.monotonic() - t1:.1f} s")
    assert again.images == got.images and not any(line.startswith("building") for line in cached)
    out = subprocess.run(["docker", "run", "--rm", "--network", "none", got.images[IID], "python", "-c",
                          "import sys, marshmallow; print(sys.version.split()[0], marshmallow.__version__)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["3.9.2", "2.20.0"]
    env = load_config("smoke").environment
    gold = grade(task, task.patch, env, got.images[IID])
    empty = grade(task, "", env, got.images[IID])
    assert gold.status == "resolved", gold.error_reason or gold.tests_status
    assert empty.status == "unresolved"
    assert empty.tests_status["FAIL_TO_PASS"]["failure"] == task.FAIL_TO_PASS
    assert len(empty.tests_status["PASS_TO_PASS"]["success"]) == len(task.PASS_TO_PASS) == 24


def test_the_papers_filters_count_each_drop_with_its_reason(imported):
    base = imported.to_dict()
    blank = {**base, "instance_id": "x__blank-1", "problem_statement": "  "}
    files = "".join(f"diff --git a/f{i}.py b/f{i}.py\n--- a/f{i}.py\n+++ b/f{i}.py\n@@ -1 +1 @@\n-a\n+b\n" for i in range(8))
    big = {**base, "instance_id": "x__big-1", "patch": files}
    from environments.records import TaskInstance

    tasks = [TaskInstance.from_dict(d) for d in (base, blank, big)]
    report = filter_tasks(tasks, load_config("smoke").environment, reruns=1, progress=lambda line: None)
    assert [t.instance_id for t in report.kept] == [IID]
    assert report.summary()["dropped_by"] == {"statement": 1, "size": 1, "image": 0, "infra": 0, "validation": 0,
                                             "deterministic": 0, "environment": 0}
    assert report.dropped["size"]["x__big-1"].startswith("gold patch touches 8 files")


def test_swerl_grade_reports_tasks_without_an_image_and_grades_the_rest(imported, tmp_path):
    rows = [imported.to_dict(),
            {**imported.to_dict(), "instance_id": "nobody__nothing-1", "repo": "nobody/nothing", "meta": {}},
            {**imported.to_dict(), "instance_id": "bad__spec-1",
             "meta": {**imported.meta, "env_spec": {**imported.meta["env_spec"], "python": "jessie"}}}]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    preds = tmp_path / "preds.jsonl"
    preds.write_text("".join(json.dumps({"instance_id": r["instance_id"], "model_name_or_path": "gold",
                                         "model_patch": r["patch"]}) + "\n" for r in rows))
    out = subprocess.run([sys.executable, "-m", "flows.cli", "grade", "--tasks", str(tasks), "--predictions", str(preds),
                          "--report", str(tmp_path / "report.json")],
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["resolved_ids"] == [IID]
    assert report["error_ids"] == ["bad__spec-1", "nobody__nothing-1"]
    reasons = {iid: report["instances"][iid]["error_reason"] for iid in report["error_ids"]}
    assert "swebench has no spec for nobody/nothing" in reasons["nobody__nothing-1"]
    assert "'jessie' is not a Debian release" in reasons["bad__spec-1"]
    print("[real-swebench] grade:", out.stdout.strip())
