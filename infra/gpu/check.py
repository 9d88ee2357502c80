"""GPU check: swerl's trainer on one GPU, in one process and as a 1-rank FSDP2 group.

A Qwen2.5-shaped model is built from its config (random weights, no download: throughput and
memory do not depend on the weights) and trained through `training.trainer.Trainer` on one
synthetic row of 16k and of 32k tokens: fp32 master weights, bf16 compute, activation
checkpointing, the chunked LM head, as `train.dtype: bfloat16` runs. Each case runs in its own
process (a clean peak-memory count); the FSDP cases go through `accelerate launch` with
infra/accelerate/fsdp.yaml, as the pipeline's process group does.

    python infra/gpu/check.py                      # one H200: 1.5B, 4 cases, about 3 minutes
    python infra/gpu/check.py --sizes 0.5b,1.5b    # both sizes
    python infra/gpu/check.py --dry-run            # CPU, tiny config, one short row (the tests)

Needs torch, transformers and accelerate (no pydantic: the trainer is given a plain config).
MFU counts useful FLOPs only: 6 x matmul parameters per token plus causal attention
6 x layers x hidden x seq_len; activation recomputation and the chunked head are overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

# Qwen2.5 shapes (config.json of the public checkpoints); "tiny" is the dry run's.
SIZES = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1024, tie_word_embeddings=True),
}
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12}  # dense
FSDP_CONFIG = REPO / "infra" / "accelerate" / "fsdp.yaml"
RESULT = "CHECK_RESULT "


@dataclass
class TrainSettings:
    """The trainer keys the Trainer reads (swerl.config.SFTConfig's), without pydantic."""

    lr: float = 1e-6
    micro_batch_tokens: int = 32768
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    gradient_checkpointing: bool = True
    dtype: str = "bfloat16"


def flops_per_token(cfg, params: int, seq_len: int) -> float:
    """Matmul parameters (the embedding lookup is none, a tied LM head counts once) + attention."""
    matmul = params if cfg.tie_word_embeddings else params - cfg.vocab_size * cfg.hidden_size
    return 6.0 * matmul + 6.0 * cfg.num_hidden_layers * cfg.hidden_size * seq_len


def worker(size: str, seq_len: int, steps: int, warmup: int, attn: str) -> dict:
    """One case in this process (under `accelerate launch` for FSDP): time `steps` optimizer steps."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from bench.synthetic import synthetic_samples
    from training.batching import micro_batches
    from training.trainer import Trainer, sft_loss

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    cfg = Qwen2Config(**SIZES[size], max_position_embeddings=max(seq_len, 32768))
    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    settings = TrainSettings(micro_batch_tokens=seq_len, dtype="bfloat16" if cuda else "float32")
    trainer = Trainer(model, settings, total_steps=steps + warmup, progress=False)
    batches = micro_batches(synthetic_samples([seq_len], vocab=cfg.vocab_size), [0], seq_len)
    for _ in range(warmup):
        trainer.step(batches, sft_loss)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        m = trainer.step(batches, sft_loss)
    if cuda:
        torch.cuda.synchronize()
    tps = steps * seq_len / (time.perf_counter() - t0)
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    peak = next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)
    out = {"device": name, "size": size, "params": params, "seq_len": seq_len,
           "fsdp": trainer.sharded, "processes": trainer.accelerator.num_processes,
           "tokens_per_s": tps, "mfu": tps * flops_per_token(cfg, params, seq_len) / peak if peak else None,
           "peak_gpu_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
           "peak_host_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
           "loss": m["loss"]}
    trainer.close()
    return out


def case_command(fsdp: bool, cuda: bool, args: list[str]) -> list[str]:
    if not fsdp:
        return [sys.executable, __file__, *args]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(FSDP_CONFIG),
            "--num_processes", "1", "--mixed_precision", "bf16" if cuda else "no",
            "--main_process_port", str(port), __file__, *args]


def run_case(fsdp: bool, size: str, seq_len: int, a: argparse.Namespace, cuda: bool) -> dict:
    """One case in a fresh process; its result line parsed, or its error with the output's tail."""
    args = ["--worker", "--size", size, "--seq-len", str(seq_len), "--steps", str(a.steps),
            "--warmup", str(a.warmup), "--attn", a.attn]
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    if not cuda:
        env["ACCELERATE_USE_CPU"] = "true"
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(case_command(fsdp, cuda, args), cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=a.case_timeout)
    except subprocess.TimeoutExpired:
        return {"size": size, "seq_len": seq_len, "fsdp": fsdp, "error": f"timed out after {a.case_timeout} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        return {"size": size, "seq_len": seq_len, "fsdp": fsdp, "error": f"exit {proc.returncode}",
                "tail": tail}
    return json.loads(lines[-1][len(RESULT):]) | {"wall_s": time.perf_counter() - t0}


def table(rows: list[dict]) -> str:
    head = f"{'size':>5} {'mode':>6} {'tokens':>7} {'tokens/s':>10} {'MFU':>6} {'peak GiB':>9}  note"
    out = [head]
    for r in rows:
        mode = "fsdp" if r.get("fsdp") else "single"
        if "error" in r:
            out.append(f"{r['size']:>5} {mode:>6} {r['seq_len']:>7} {'-':>10} {'-':>6} {'-':>9}  {r['error']}")
            continue
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
        mem = r["peak_gpu_mem_gib"] if r["peak_gpu_mem_gib"] is not None else r["peak_host_rss_gib"]
        note = "" if r["peak_gpu_mem_gib"] is not None else "host RSS (no GPU)"
        out.append(f"{r['size']:>5} {mode:>6} {r['seq_len']:>7} {r['tokens_per_s']:>10.0f} {mfu:>6} {mem:>9.2f}  {note}")
    return "\n".join(out)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny config, one 256-token row")
    ap.add_argument("--sizes", default="1.5b", help=f"comma-separated, of {', '.join(SIZES)}")
    ap.add_argument("--seq-lens", default="16384,32768")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--attn", default="sdpa", help="sdpa | flash_attention_2 | eager")
    ap.add_argument("--case-timeout", type=int, default=150, help="seconds per case")
    ap.add_argument("--out", type=Path, help="also write the results as JSON here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--size", default="1.5b", help=argparse.SUPPRESS)
    ap.add_argument("--seq-len", type=int, default=16384, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.dry_run:
        a.sizes, a.seq_lens, a.steps = "tiny", "256", 1
    unknown = [s for s in a.sizes.split(",") if s not in SIZES]
    if unknown:
        ap.error(f"unknown size {unknown[0]!r} (known: {', '.join(SIZES)})")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.worker:
        print(RESULT + json.dumps(worker(a.size, a.seq_len, a.steps, a.warmup, a.attn)), flush=True)
        return 0
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not a.dry_run:
        print("no CUDA device here: run with --dry-run for the CPU check", file=sys.stderr)
        return 2
    rows = [run_case(fsdp, size, int(n), a, cuda) for size in a.sizes.split(",")
            for n in a.seq_lens.split(",") for fsdp in (False, True)]
    print(table(rows))
    for r in rows:
        if "tail" in r:
            print(f"--- {r['size']} {r['seq_len']} fsdp={r['fsdp']}:\n" + "\n".join(r["tail"]), file=sys.stderr)
    if a.out:
        a.out.write_text(json.dumps(rows, indent=2))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
