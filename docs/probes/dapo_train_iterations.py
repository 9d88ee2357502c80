"""Per DAPO iteration of a run: resolved episodes, those at turn 2, and format errors per turn,
read from the run's stored DAPO rollouts: `rollouts/dapo-*` only, which hold train tasks alone
(evaluation rollouts live in `rollouts/eval-*` and are never opened).

    PYTHONPATH=. .venv/bin/python docs/probes/dapo_train_iterations.py RUN_ID [RUN_ID ...]
"""

from __future__ import annotations

import json
import sys

from swerl.config import load_config
from swerl.store import open_store


def main(run_ids: list[str]) -> None:
    store = open_store(load_config("cpu-demo-multiturn").storage)
    for run in run_ids:
        by_iter: dict[str, list[dict]] = {}
        for k in store.ls(f"runs/{run}/rollouts"):
            stage, iteration = k.split("/rollouts/", 1)[1].split("/")[:2]
            if stage.startswith("dapo-") and k.endswith(".json"):
                by_iter.setdefault(f"{stage}/{iteration}", []).append(json.loads(store.get_bytes(k)))
        for it, eps in sorted(by_iter.items()):
            turns = [t for e in eps for t in e["turns"]]
            fmt = sum(bool(t["format_error"]) for t in turns) / max(len(turns), 1)
            res = sum(e["status"] == "resolved" for e in eps)
            at2 = sum(e["status"] == "resolved" and e["num_turns"] == 2 for e in eps)
            print(f"{run} {it}: {len(eps)} episodes, resolved {res} ({res / len(eps):.1%}; {at2} at turn 2), "
                  f"format errors per turn {fmt:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
