"""Per DAPO iteration of a run: resolved episodes, those at turn 2, and format errors per turn,
read from the run's stored DAPO rollouts: `rollouts/dapo-*` only, which hold train tasks alone
(evaluation rollouts live in `rollouts/eval-*` and are never opened).

    PYTHONPATH=. .venv/bin/python docs/probes/dapo_train_iterations.py RUN_ID [RUN_ID ...]
"""

from __future__ import annotations

import itertools
import sys

from swerl.config import load_config
from swerl.store import open_store
from training.run import RunContext, stored_trajectories


def main(run_ids: list[str]) -> None:
    cfg = load_config("cpu-demo-multiturn")
    store = open_store(cfg.storage)
    for run in run_ids:
        ctx = RunContext(cfg=cfg, store=store, run_id=run, progress=False)
        for stage in itertools.count(1):
            it = 0
            while eps := stored_trajectories(ctx, f"dapo-s{stage}/{it}/"):
                turns = [t for e in eps for t in e.turns]
                fmt = sum(bool(t.format_error) for t in turns) / max(len(turns), 1)
                res = sum(e.status == "resolved" for e in eps)
                at2 = sum(e.status == "resolved" and e.num_turns == 2 for e in eps)
                print(f"{run} dapo-s{stage}/{it}: {len(eps)} episodes, resolved {res} ({res / len(eps):.1%}; "
                      f"{at2} at turn 2), format errors per turn {fmt:.3f}")
                it += 1
            if it == 0:
                break


if __name__ == "__main__":
    main(sys.argv[1:])
