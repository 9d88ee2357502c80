"""Multi-turn probe (current tree): episodes of a policy on TRAIN tasks with a preset's episode
settings, and the per-turn numbers that choose the multi-turn demo's settings.

    PYTHONPATH=. .venv/bin/python docs/probes/multiturn_probe.py --preset cpu-demo-multiturn \
        --per-project 4 --samples 4 --temperature 0.5 [--set KEY=VALUE ...] [--model base]

Tasks are taken round-robin over the train projects; eval-split tasks are refused.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections import defaultdict

from swerl.config import load_config
from swerl.store import open_store
from training import data, stages
from training.evaluation import turn_breakdown
from training.run import RunContext


def spread(tasks, per_project: int):
    by_project = defaultdict(list)
    for t in tasks:
        by_project[t.project].append(t)
    return [t for p in sorted(by_project) for t in by_project[p][:per_project]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="cpu-demo-multiturn")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--per-project", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.5)
    ap.add_argument("--model", default="base")
    ap.add_argument("--run-id", default="probe-multiturn")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = load_config(args.preset, args.set)
    ctx = RunContext(cfg=cfg, store=open_store(cfg.storage), run_id=args.run_id)
    tasks = spread(data.load_split(ctx, "train"), args.per_project)
    if any(t.split != "train" for t in tasks):
        raise SystemExit("refused: an eval-split task reached the probe")
    sampling = cfg.rollout.sampling.model_copy(update={"temperature": args.temperature})
    t0 = time.monotonic()
    stats = stages.rollouts(ctx, f"probe-T{args.temperature}", 0, tasks, args.samples, args.model,
                            spec=stages.episode_spec(cfg), sampling=sampling)
    graded = [t for t in stats.trajectories if t.status != "error"]
    by_turn, mean_turns, fmt = turn_breakdown(graded)
    solved_tasks = {t.task_id for t in graded if t.status == "resolved"}
    print(json.dumps({"tasks": len(tasks), "projects": len({t.project for t in tasks}), "episodes": len(graded),
                      "errors": len(stats.trajectories) - len(graded),
                      "resolved": sum(t.status == "resolved" for t in graded), "tasks_solved": len(solved_tasks),
                      "resolved_by_turn": by_turn, "mean_turns_resolved": mean_turns,
                      "format_errors_by_turn": fmt, "mean_turns": sum(t.num_turns for t in graded) / max(len(graded), 1),
                      "exit_reasons": {r: sum(t.exit_reason == r for t in graded) for r in {t.exit_reason for t in graded}},
                      "wall_s": round(time.monotonic() - t0, 1)}, indent=1))


if __name__ == "__main__":
    main()
