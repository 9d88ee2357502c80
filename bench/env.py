"""Measurements behind `swerl bench env`: what one agent action and one sandbox start cost.

The number that matters is the per-action overhead: an episode is tens of actions, a DAPO
iteration thousands of episodes. `bench_exec` compares one `exec` through the persistent shell
with a raw `docker exec` of the same command (target: ratio <= 0.1).
"""

from __future__ import annotations

import statistics
import subprocess
import time
from typing import Sequence

from environments.base_image import ensure_base_image
from environments.sandbox import open_sandbox
from swerl.config import EnvironmentConfig


def percentiles(samples: Sequence[float], qs: Sequence[int] = (50, 95)) -> dict[str, float]:
    """n, mean, min, max and nearest-rank percentiles (p50, p95, ...) of `samples`."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    out = {"n": float(len(ordered)), "mean": statistics.fmean(ordered),
           "min": ordered[0], "max": ordered[-1]}
    for q in qs:
        rank = max(1, -(-q * len(ordered) // 100))  # ceil(q/100 * n), 1-based
        out[f"p{q}"] = ordered[rank - 1]
    return out


def _ms(samples: list[float]) -> dict[str, float]:
    return {k: (v if k == "n" else round(v * 1000, 3)) for k, v in percentiles(samples).items()}


def bench_exec(n: int = 200, image: str | None = None, cfg: EnvironmentConfig | None = None,
               starts: int = 10, cmd: str = "echo hi") -> dict:
    """p50/p95 of `exec(cmd)` through swerl vs `docker exec CID bash -c cmd`, and of starts."""
    cfg = cfg or EnvironmentConfig()
    if cfg.sandbox != "docker":
        raise ValueError("bench_exec compares against raw `docker exec`: needs sandbox=docker")
    image = image or ensure_base_image(progress=lambda line: None)
    start_s, close_s = [], []
    for _ in range(starts):
        t0 = time.perf_counter()
        sb = open_sandbox(image, cfg)
        t1 = time.perf_counter()
        sb.close()
        start_s.append(t1 - t0)
        close_s.append(time.perf_counter() - t1)
    swerl_s, raw_s = [], []
    with open_sandbox(image, cfg) as sb:
        for _ in range(n):
            t0 = time.perf_counter()
            res = sb.exec(cmd)
            swerl_s.append(time.perf_counter() - t0)
            if res.exit_code != 0:
                raise RuntimeError(f"benchmark command failed: {res.output}")
        raw = ["docker", "exec", "-u", sb.user, "-w", sb.workdir, sb.cid, "bash", "-c", cmd]
        for _ in range(n):
            t0 = time.perf_counter()
            subprocess.run(raw, check=True, capture_output=True)
            raw_s.append(time.perf_counter() - t0)
    swerl, rawp = _ms(swerl_s), _ms(raw_s)
    return {
        "image": image,
        "command": cmd,
        "exec_swerl_ms": swerl,
        "exec_raw_docker_ms": rawp,
        "ratio_p50": round(swerl["p50"] / rawp["p50"], 4),
        "ratio_p95": round(swerl["p95"] / rawp["p95"], 4),
        "start_ms": _ms(start_s),  # docker create + start + shell handshake
        "close_ms": _ms(close_s),
    }


if __name__ == "__main__":
    import json

    print(json.dumps(bench_exec(), indent=2))
