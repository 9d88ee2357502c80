"""Test ids must not change between runs: a task names its tests by id (FAIL_TO_PASS,
PASS_TO_PASS), and a test the grader no longer finds is a failure. pytest ids a parameter it
cannot print by position, so a parametrize list built from a set changes ids with the string
hash seed (isodate 0.7.2's `expected17`). Every test run swerl makes fixes the seed."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from environments.curation.runner import ProjectRunner
from environments.grading import grading_script
from environments.records import TaskInstance
from environments.sandbox import TEST_ENV, run_env_prefix

pytestmark = pytest.mark.unit

HASH_ORDERED = '''
import pytest

WORDS = list({"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"})


@pytest.mark.parametrize("word,box", [(w, [w]) for w in WORDS])
def test_word(word, box):
    assert box == [word]
'''


def collected_ids(project: Path, prefix: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    out = subprocess.run(["bash", "-c", f"{prefix} {sys.executable} -m pytest -q --collect-only -p no:cacheprovider"],
                         cwd=project, env=env, capture_output=True, text=True, check=True)
    return sorted(line for line in out.stdout.splitlines() if "::" in line)


def test_ids_change_with_the_hash_seed_unless_it_is_fixed(tmp_path: Path):
    (tmp_path / "test_words.py").write_text(HASH_ORDERED)
    fixed = [collected_ids(tmp_path, run_env_prefix()) for _ in range(3)]
    assert fixed[0] == fixed[1] == fixed[2]
    free = {tuple(collected_ids(tmp_path, "")) for _ in range(4)}
    assert len(free) > 1, "this project's ids should depend on the hash seed, or the test shows nothing"


def test_grading_and_synthesis_runs_fix_the_seed():
    task = TaskInstance(instance_id="p__bug-1", repo="someone/p", base_commit="0" * 40, problem_statement="...",
                        patch="", test_patch="", FAIL_TO_PASS=[], PASS_TO_PASS=[], test_cmd="python -m pytest -rA tests")
    line = next(x for x in grading_script(task, True, 60).splitlines() if "timeout -k 5" in x)
    assert line.startswith(run_env_prefix() + " timeout")
    runner = ProjectRunner(None, "python -m pytest", ["tests"])  # type: ignore[arg-type]  # no run here
    script = runner._script(None, 60, [], {})
    assert all(f"{k}={v}" in script for k, v in TEST_ENV.items())
