"""The `swebench` package's own verdict on a test log: the reference that swerl's grading is
held to (tests/unit/test_swebench_equivalence.py, tests/integration/test_real_swebench.py)."""

from __future__ import annotations

import json
from pathlib import Path

from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT
from swebench.harness.grading import get_eval_report
from swebench.harness.test_spec import test_spec as swebench_spec  # not `TestSpec`: pytest would collect it


def _ids(value) -> list[str]:
    return json.loads(value) if isinstance(value, str) else list(value)


def swebench_verdict(instance: dict, log_path: str | Path) -> dict:
    """swebench 4.1.0's `get_eval_report` on a recorded `test_output.txt`-shaped log: the path
    `run_evaluation` takes (log file -> parser by repo -> report -> resolution)."""
    spec = swebench_spec.TestSpec(
        instance_id=instance["instance_id"], repo=instance["repo"], version=instance["version"],
        repo_script_list=[], eval_script_list=[], env_script_list=[], arch="x86_64",
        FAIL_TO_PASS=_ids(instance["FAIL_TO_PASS"]), PASS_TO_PASS=_ids(instance["PASS_TO_PASS"]),
        language="py", docker_specs={}, namespace=None,
    )
    prediction = {"instance_id": instance["instance_id"], "model_name_or_path": "m", "model_patch": "diff"}
    return get_eval_report(spec, prediction, str(log_path), True)[instance["instance_id"]]


def as_eval_log(test_log: str) -> str:
    """A test command's output inside SWE-bench's markers, as its harness records it."""
    return f"{START_TEST_OUTPUT}\n{test_log}\n{END_TEST_OUTPUT}\n"
