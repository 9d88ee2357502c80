"""One DAPO update in cpu-demo's shape with the real Trainer (fp32 here, checkpointing on), to compare commits:
4 tasks x 8 samples; each prompt = 770 common tokens (instructions + example) + 345 own; replies
16 tokens; batch 16 -> old-logprob scoring + 2 optimizer steps."""
import json, random, sys, time, torch
from transformers import AutoModelForCausalLM
from swerl.model_cache import resolve_model
from swerl.config import DAPOConfig, DAPOStage, TrainConfig
from training.dapo import iteration_update
from training.trajectory import TrainingSample
from training.trainer import Trainer
torch.set_num_threads(2)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(resolve_model("default"), attn_implementation="sdpa")
rng = random.Random(0)
system = [rng.randrange(1000, 40000) for _ in range(770)]
samples = []
for g in range(4):
    prompt = system + [rng.randrange(1000, 40000) for _ in range(345)]
    for k in range(8):
        reply = [rng.randrange(1000, 40000) for _ in range(16)]
        lp = [0.0] * len(prompt) + [-1.0] * 16
        samples.append(TrainingSample(prompt + reply, [0] * len(prompt) + [1] * 16, lp, [len(prompt)],
                                      advantage=1.0 if k % 2 else -1.0))
stage = DAPOStage(batch_size=16, lr=2e-5, max_turns=1, l_thr=1)
cfg = DAPOConfig(stages=[stage], train=TrainConfig(dtype="float32"))
t = Trainer(model, cfg.train, total_steps=2, lr=stage.lr, schedule="constant", progress=False)
t0 = time.perf_counter()
m = iteration_update(t, samples, cfg, stage, seed=0)
print(json.dumps({"code": sys.argv[1] if len(sys.argv) > 1 else "this checkout", "update_s": round(time.perf_counter() - t0, 1), "steps": m["steps"],
                  "tokens": m["tokens"], "loss": m["loss"], "grad_norm": m["grad_norm"]}), flush=True)
