"""swerl's verdicts on SWE-bench evaluation logs equal those of swebench's own harness.

The reference side is swebench 4.1.0's `get_eval_report` (log file -> parser by repo -> report
-> resolution), the path `run_evaluation` takes; swerl's side is `judge_swebench_log` on the
same log, for the same instance loaded as a TaskInstance (with `log_parser` set to `swebench`,
and also to swerl's own `pytest` parser where SWE-bench's parser for the repo reads `-rA`).
"""

import json
from pathlib import Path

import pytest

from environments.grading import judge_swebench_log
from environments.records import TaskInstance
from tests.swebench_reference import swebench_verdict as reference_verdict

pytestmark = pytest.mark.unit

DATA = Path(__file__).resolve().parent.parent / "data" / "swebench_logs"
INSTANCES = [json.loads(line) for line in (DATA / "instances.jsonl").read_text().splitlines() if line.strip()]
# repos whose SWE-bench parser reads pytest's -rA summary: swerl's own parser must agree there too
PYTEST_REPOS = {"astropy/astropy", "pytest-dev/pytest", "psf/requests"}


def swebench_verdict(instance: dict) -> dict:
    return reference_verdict(instance, DATA / f"{instance['instance_id']}.log")


def swerl_verdict(instance: dict, parser: str):
    task = TaskInstance.from_dict(instance)
    task.log_parser = parser
    return judge_swebench_log(task, (DATA / f"{instance['instance_id']}.log").read_text())


CASES = [(i, "swebench") for i in INSTANCES] + [(i, "pytest") for i in INSTANCES if i["repo"] in PYTEST_REPOS]


@pytest.mark.parametrize("instance,parser", CASES, ids=[f"{i['instance_id']}-{p}" for i, p in CASES])
def test_same_verdict_as_swebench(instance, parser):
    ours, ref = swerl_verdict(instance, parser), swebench_verdict(instance)
    assert ours.resolved == ref["resolved"]
    if ref["patch_successfully_applied"]:
        assert ours.status in ("resolved", "unresolved")
        assert ours.tests_status == {k: ref["tests_status"][k] for k in ("FAIL_TO_PASS", "PASS_TO_PASS")}
    else:  # SWE-bench scores it "not resolved"; swerl says why it could not judge
        assert ours.status == "error" and "Patch Apply Failed" in ours.error_reason


def test_the_data_covers_the_cases_that_matter():
    """Guards the data set itself: each case below must stay represented."""
    verdicts = {i["instance_id"]: swebench_verdict(i) for i in INSTANCES}
    resolved = [k for k, v in verdicts.items() if v["resolved"]]
    unresolved = [k for k, v in verdicts.items() if v["patch_successfully_applied"] and not v["resolved"]]
    assert len(resolved) >= 2 and len(unresolved) >= 2
    assert any(not v["patch_successfully_applied"] for v in verdicts.values())
    logs = {i["instance_id"]: (DATA / f"{i['instance_id']}.log").read_text() for i in INSTANCES}
    assert any("\nXFAIL " in log for log in logs.values())
    missing = [i["instance_id"] for i in INSTANCES
               if any(t.split("::")[-1] not in logs[i["instance_id"]] for t in json.loads(i["PASS_TO_PASS"]))]
    assert missing, "an instance with a test missing from its log"
    assert {i["repo"] for i in INSTANCES} >= {"django/django", "sympy/sympy", "astropy/astropy"}
