"""Kill a rollout job (SIGKILL) mid-run, run it again: every finished episode is reused, none is
redone, and no sandbox container of either job is left behind.

The job itself is this module run as a script (`python -m tests.integration.test_rollout_resume
STORE SESSION_FILE [SWEEP_SESSION]`): real model, real docker, fixture tasks, a file:// store.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "runs/resume-test/rollouts/difficulty/0"
N_TASKS, SAMPLES = 3, 2


def job(store_uri: str, session_file: str, sweep_session: str | None) -> None:
    """One rollout job: what a pipeline stage does, small."""
    from environments.sandbox import cleanup_leaked, session_id
    from environments.swe_env import SWEEnv
    from swerl.config import EnvironmentConfig
    from swerl.store import Store
    from training.agent import AgentLimits, resolved_reward
    from bench.rollout import ready_fixture_tasks
    from training.inference.hf import HFBackend
    from training.inference.base import SamplingParams
    from training.rollout import RolloutSpec, TrajectorySink, collect

    Path(session_file).write_text(session_id())
    if sweep_session:  # what the killed job left behind; scoped to it (other runs share this docker)
        print("swept:", cleanup_leaked(session=sweep_session), file=sys.stderr)
    env = EnvironmentConfig(sandbox="docker", command_timeout_s=30, test_timeout_s=180)
    spec = RolloutSpec(limits=AgentLimits(max_turns=2, max_context_tokens=4096, max_new_tokens=48),
                       sampling=SamplingParams(max_new_tokens=48, seed=0), action_format="tools+file",
                       concurrency=2)
    stats = collect(ready_fixture_tasks(N_TASKS), SAMPLES, HFBackend("default", seed=0),
                    lambda t: SWEEnv(t, env, "tools+file", observation_max_chars=2000), spec, resolved_reward,
                    sink=TrajectorySink(Store(store_uri), PREFIX), progress=False)
    print(json.dumps({"reused": stats.reused, "episodes": stats.episodes,
                      "errors": [t.error_reason for t in stats.trajectories if t.status == "error"]}))


def _containers(session: str) -> list[str]:
    res = subprocess.run(["docker", "ps", "-aq", "--filter", "label=swerl", "--filter",
                          f"label=swerl.session={session}"], capture_output=True, text=True, check=True)
    return res.stdout.split()


def _records(root: Path) -> dict[str, bytes]:
    d = root / PREFIX
    # hidden names are the store's in-flight temp files, not records
    return {p.name: p.read_bytes() for p in d.glob("*.json") if not p.name.startswith(".")} if d.is_dir() else {}


def test_killed_job_resumes_without_redoing_finished_episodes(tmp_path):
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.skip("docker is not available")
    from bench.rollout import ready_fixture_tasks

    ready_fixture_tasks(N_TASKS)  # build images here, not inside the timed job
    store = tmp_path / "store"
    cmd = [sys.executable, "-m", "tests.integration.test_rollout_resume", f"file://{store}"]
    first = subprocess.Popen([*cmd, str(tmp_path / "s1")], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 600
    while len(_records(store)) < 2 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first.poll() is None, f"the job ended before it could be killed: {first.communicate()[1][-2000:]}"
    assert len(_records(store)) >= 2, "no episode finished in time"
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    before = _records(store)
    s1 = (tmp_path / "s1").read_text()
    assert 2 <= len(before) < N_TASKS * SAMPLES, "the kill should land mid-run"

    again = subprocess.run([*cmd, str(tmp_path / "s2"), s1], cwd=ROOT, capture_output=True, text=True,
                           timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    result = json.loads(again.stdout.strip().splitlines()[-1])
    assert result["reused"] == len(before)
    assert result["episodes"] == N_TASKS * SAMPLES - len(before)  # only the unfinished ones ran
    assert result["errors"] == []
    after = _records(store)
    assert len(after) == N_TASKS * SAMPLES
    assert all(after[k] == v for k, v in before.items()), "a finished episode was rewritten"
    print(f"\nkilled after {len(before)} of {N_TASKS * SAMPLES} episodes; re-run: {result}")
    s2 = (tmp_path / "s2").read_text()
    assert _containers(s1) == [] and _containers(s2) == []


if __name__ == "__main__":
    job(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
