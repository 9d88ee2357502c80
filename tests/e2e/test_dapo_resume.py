"""Kill `swerl dapo` (SIGKILL, the whole process group) during its second iteration and run it
again: it resumes at iteration 2 from iteration 1's checkpoint, reuses iteration 2's finished
episodes, and neither skips nor repeats an iteration.

Real model, real containers, the smoke preset with two episodes at a time: the kill follows the
iteration's first finished episode, so at most its first pair is done (batched decoding can end
a pair together) and the second is in flight. A fresh working directory is the embedded store.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CMD = [sys.executable, "-m", "flows.cli", "dapo", "--preset", "smoke", "--iterations", "2",
       "--set", "rollout.concurrency=2"]
EPISODES_PER_ITERATION = 4  # smoke: 2 problems x group of 2


def _run_dir(cwd: Path) -> Path | None:
    runs = list((cwd / ".swerl" / "store" / "runs").glob("*"))
    return runs[0] if runs else None


def _episodes(run: Path | None, iteration: int) -> dict[str, bytes]:
    if run is None:
        return {}
    d = run / "rollouts" / "dapo-s1" / str(iteration)
    return {p.name: p.read_bytes() for p in d.glob("*.json") if not p.name.startswith(".")} if d.is_dir() else {}


def _complete(run: Path, name: str) -> bool:
    return (run / "checkpoints" / name / "_COMPLETE").exists()


def test_killed_dapo_resumes_at_the_iteration_it_was_in(tmp_path):
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.skip("docker is not available")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log1 = open(tmp_path / "first.log", "w")
    first = subprocess.Popen(CMD, cwd=tmp_path, env=env, stdout=log1, stderr=subprocess.STDOUT,
                             start_new_session=True)
    deadline = time.monotonic() + 1500
    try:
        while first.poll() is None and time.monotonic() < deadline:
            if len(_episodes(_run_dir(tmp_path), 1)) >= 1:
                break
            time.sleep(0.2)
        assert first.poll() is None, "dapo ended before its second iteration could be killed:\n" + \
            (tmp_path / "first.log").read_text()[-4000:]
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        log1.close()
    run = _run_dir(tmp_path)
    assert run is not None
    done_before = _episodes(run, 1)
    assert 1 <= len(done_before) < EPISODES_PER_ITERATION, "the kill should land inside iteration 2"
    assert _complete(run, "dapo-s1-0") and not _complete(run, "dapo-s1-1")
    info_before = (run / "checkpoints" / "dapo-s1-0" / "swerl.json").read_bytes()
    iter1_before = _episodes(run, 0)

    again = subprocess.run(CMD, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500)
    out = again.stdout + again.stderr
    (tmp_path / "again.log").write_text(out)
    assert again.returncode == 0, out[-6000:]
    assert _run_dir(tmp_path) == run, "the re-run must find the same run id"
    # iteration 1 was not redone: its checkpoint and episodes are the same bytes
    assert "dapo-s1-0: checkpoint already complete" in out
    assert (run / "checkpoints" / "dapo-s1-0" / "swerl.json").read_bytes() == info_before
    assert _episodes(run, 0) == iter1_before
    # iteration 2 reused its finished episodes and ran only the rest, from iteration 1's weights
    reused = [int(m) for m in re.findall(r'dapo-s1/1 rollouts: \{[^}]*"reused": (\d+)', out)]
    assert reused == [len(done_before)], out[-4000:]
    after = _episodes(run, 1)
    assert len(after) == EPISODES_PER_ITERATION
    assert all(after[k] == v for k, v in done_before.items()), "a finished episode was rewritten"
    assert {json.loads(v)["policy_version"] for v in after.values()} == {"dapo-s1-0"}
    info = json.loads((run / "checkpoints" / "dapo-s1-1" / "swerl.json").read_text())
    assert info["parent"] == "dapo-s1-0" and info["iteration"] == 1
    assert not (run / "checkpoints" / "dapo-s1-2").exists(), "no iteration beyond the cap"
    print(f"\nkilled after {len(done_before)} of {EPISODES_PER_ITERATION} episodes of iteration 2; "
          f"re-run reused them and finished dapo-s1-1")
