"""swerl's verdict equals the `swebench` package's on real test logs: the gold and empty runs of
the shipped real instances (tests/data/swebench_real/logs, recorded from
tests/integration/test_real_swebench.py's grading, which also checks parity on fresh logs)."""

import json
from pathlib import Path

import pytest

from environments.grading import judge_swebench_log
from environments.records import TaskInstance
from environments.swebench_specs import recipe
from tests.swebench_reference import swebench_verdict

pytestmark = pytest.mark.unit

DATA = Path(__file__).resolve().parent.parent / "data" / "swebench_real"
ROWS = {r["instance_id"]: r for r in map(json.loads, (DATA / "instances.jsonl").read_text().splitlines())}
LOGS = sorted((DATA / "logs").glob("*.log"))


@pytest.mark.parametrize("log", LOGS, ids=[p.stem for p in LOGS])
def test_swerl_and_swebench_agree_on_a_real_log(log):
    iid, run = log.stem.rsplit(".", 1)
    row = ROWS[iid]
    task = TaskInstance.from_dict(row)
    task.log_parser = recipe(task)[3]
    ours, ref = judge_swebench_log(task, log.read_text()), swebench_verdict(row, log)
    assert ours.resolved == ref["resolved"] == (run == "gold")
    assert ours.tests_status == {k: ref["tests_status"][k] for k in ("FAIL_TO_PASS", "PASS_TO_PASS")}


def test_every_shipped_instance_has_both_logs():
    assert {p.stem for p in LOGS} == {f"{i}.{r}" for i in ROWS for r in ("gold", "empty")}
