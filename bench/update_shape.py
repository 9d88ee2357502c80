"""One DAPO update in cpu-demo-1turn's shape with the real Trainer (fp32, checkpointing on), to compare
commits (run it in each checkout): 4 tasks x 8 replies of 16 tokens behind prompts of 1,115
tokens whose first 770 are common to all tasks; old-logprob scoring, then 2 optimizer steps of 16.

    python -m bench.update_shape        (or: swerl bench update)
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch

from bench.train import dapo_shaped_samples, load_bench_model
from swerl.config import DAPOConfig, DAPOStage, SFTConfig
from training.dapo import dapo_trainer, iteration_update


def bench_update(seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    model, name = load_bench_model()
    samples = dapo_shaped_samples(groups=4, group_size=8, prompt=1115, reply=16, vocab=model.config.vocab_size,
                                  common=770)
    stage = DAPOStage(batch_size=16, lr=2e-5, max_turns=1, l_thr=1)
    cfg = DAPOConfig(stages=[stage], train=SFTConfig(dtype="float32"))
    trainer = dapo_trainer(model, cfg, stage, total_steps=2, progress=False)
    t0 = time.perf_counter()
    m = iteration_update(trainer, samples, cfg, stage, seed=seed)
    return {"model": name, "update_s": round(time.perf_counter() - t0, 1), "steps": m["steps"],
            "tokens": m["tokens"], "loss": m["loss"], "grad_norm": m["grad_norm"]}


if __name__ == "__main__":
    print(json.dumps(bench_update()))
