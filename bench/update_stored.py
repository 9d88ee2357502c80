"""One DAPO update over a run's stored train iteration under two sets of settings: where an
update's time goes on real multi-turn samples (a synthetic shape misses their lengths). Reads
`rollouts/dapo-*` of the run only (train tasks), loads the policy those rollouts came from in
fp32, and times ``iteration_update`` with the first DAPO stage's settings, the run's seed and a
fresh optimizer (the pipeline's first iteration exactly; later ones carry AdamW state over).

    python -m bench.update_stored RUN_ID --policy rft-0 [--iteration dapo-s1/0]
        [--preset cpu-demo-multiturn] [--a KEY=VALUE ...] [--b KEY=VALUE ...]

e.g. --a dapo.old_logprobs=trainer --a dapo.train.gradient_checkpointing=true
     --b dapo.old_logprobs=sampler --b dapo.train.gradient_checkpointing=false
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

from swerl.config import load_config
from swerl.store import open_store
from training.dapo import dapo_trainer, iteration_update, samples_from_groups
from training.run import RunContext, model_dir, stored_trajectories
from training.stages import prompt_groups
from training.update_job import pad_id_of


def one_update(preset: str, overrides: list[str], run_id: str, iteration: str, policy: str) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = load_config(preset, overrides=overrides)
    ctx = RunContext(cfg=cfg, store=open_store(cfg.storage), run_id=run_id, progress=False)
    episodes = stored_trajectories(ctx, f"{iteration}/")
    if not episodes:
        raise SystemExit(f"no stored episodes under rollouts/{iteration}/ of run {run_id}")
    stage = cfg.dapo.stages[0]
    # the update's batch cap as the pipeline applies it; the store does not keep the draw order,
    # so a capped bench keeps the first groups by task name, not the first drawn
    samples, groups = samples_from_groups(prompt_groups(episodes), cfg.dapo.adv_delta, stage.max_groups_kept)
    path = model_dir(ctx, policy)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    trainer = dapo_trainer(model, cfg.dapo, stage, -(-len(samples) // stage.batch_size),
                           cfg.rollout.sampling.temperature, progress=True,
                           pad_id=pad_id_of(AutoTokenizer.from_pretrained(path)))
    t0 = time.perf_counter()
    m = iteration_update(trainer, samples, cfg.dapo, stage, group_stats=groups, seed=cfg.seed,
                         temperature=cfg.rollout.sampling.temperature)
    keys = ("steps", "tokens", "loss", "grad_norm", "mismatch/kl_k3", "mismatch/abs_diff_mean")
    return {"settings": overrides, "episodes": len(episodes), "samples": len(samples),
            "update_s": round(time.perf_counter() - t0, 1), **{k: m[k] for k in keys},
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_id")
    ap.add_argument("--policy", required=True, help="the checkpoint the iteration's rollouts came from")
    ap.add_argument("--iteration", default="dapo-s1/0", help="stored rollouts: dapo-s{stage}/{iteration}")
    ap.add_argument("--preset", default="cpu-demo-multiturn")
    ap.add_argument("--a", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--b", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--side", choices=["a", "b"], help="run one side in this process")
    args = ap.parse_args()
    if not args.iteration.startswith("dapo-"):
        raise SystemExit("only DAPO train rollouts (dapo-*) are read here")
    if args.side:
        overrides = args.a if args.side == "a" else args.b
        print(json.dumps(one_update(args.preset, overrides, args.run_id, args.iteration, args.policy)), flush=True)
        return
    for side in ("a", "b"):  # peak RSS is per process: each side in its own
        subprocess.run([sys.executable, "-m", "bench.update_stored", *sys.argv[1:], "--side", side], check=True)


if __name__ == "__main__":
    main()
