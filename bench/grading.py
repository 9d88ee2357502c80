"""How much grading costs on top of simply running the tests.

    python -m bench.grading [--n 5] [--task INSTANCE_ID ...]

The baseline is what any harness must pay at least: a fresh container of the instance image
running the test command (`docker run --rm IMAGE bash -lc TEST_CMD`), with the same CPU and
memory limits as the sandbox, otherwise the comparison measures the CPU quota instead of the
grader. Runs are interleaved so both sides see the same machine load. Target: ratio <= 1.1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

from environments.grading import grade
from environments.records import TaskInstance
from swerl.config import EnvironmentConfig


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def raw_run(image: str, test_cmd: str, env_cfg: EnvironmentConfig) -> float:
    t0 = time.monotonic()
    subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--label", "swerl=1", "--cpus", str(env_cfg.cpus),
         "--memory", env_cfg.memory, image, "bash", "-lc", test_cmd],
        capture_output=True, check=False,
    )
    return time.monotonic() - t0


def bench_grading(task: TaskInstance, n: int = 5, env_cfg: EnvironmentConfig | None = None,
                  patch: str | None = None) -> dict:
    """p50/p95 wall time of `grade(task, patch)` (default: the gold patch) against the raw run."""
    env_cfg = env_cfg or EnvironmentConfig()
    if not task.image:
        raise ValueError(f"{task.instance_id}: task.image is empty (build it with ensure_images)")
    patch = task.patch if patch is None else patch
    raw, ours = [], []
    for _ in range(n):
        raw.append(raw_run(task.image, task.test_cmd, env_cfg))
        t0 = time.monotonic()
        result = grade(task, patch, env_cfg)
        ours.append(time.monotonic() - t0)
        if result.status == "error":
            raise RuntimeError(f"{task.instance_id}: grading failed: {result.error_reason}")
    out = {"instance_id": task.instance_id, "n": n}
    for name, xs in (("raw", raw), ("grade", ours)):
        out[f"{name}_p50_s"] = round(statistics.median(xs), 3)
        out[f"{name}_p95_s"] = round(_percentile(xs, 0.95), 3)
    out["ratio_p50"] = round(out["grade_p50_s"] / out["raw_p50_s"], 3)
    out["ratio_p95"] = round(out["grade_p95_s"] / out["raw_p95_s"], 3)
    return out


def main() -> None:
    from bench.fixture_tasks import load_fixture_tasks
    from environments.images import ensure_images

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--task", nargs="*", help="fixture instance ids (default: all)")
    args = ap.parse_args()
    tasks = [t for t in load_fixture_tasks() if not args.task or t.instance_id in args.task]
    for t, tag in zip(tasks, ensure_images(tasks, progress=lambda line: None).values()):
        t.image = tag
        print(json.dumps(bench_grading(t, args.n)), flush=True)


if __name__ == "__main__":
    main()
