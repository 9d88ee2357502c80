"""Trainer tokens/s and MFU for a Qwen2-style model on one GPU, through swerl's own Trainer.

The model is built from its config (random weights, no download): throughput does not depend on
the weights. fp32 master weights + bf16 autocast, as `train.dtype: bfloat16` trains.

    python infra/gpu/bench_mfu.py --size 0.5b            # one H200
    python infra/gpu/bench_mfu.py --tiny                 # CPU smoke run of the same path

MFU counts useful FLOPs only: 6 x (matmul parameters) per token for forward + backward, plus
causal attention 6 x layers x hidden x seq_len per token; the recomputation done by activation
checkpointing and by the chunked LM head is overhead and is not counted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, Qwen2Config  # noqa: E402

from swerl.config import SFTConfig  # noqa: E402
from training.batching import micro_batches  # noqa: E402
from bench.synthetic import synthetic_samples  # noqa: E402
from training.rft import sft_loss  # noqa: E402
from training.trainer import Trainer  # noqa: E402

# Qwen2.5 shapes (config.json of the public checkpoints).
SIZES = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                 tie_word_embeddings=True),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                 tie_word_embeddings=True),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=1024,
                 tie_word_embeddings=True),
}
# Dense bf16 peak, FLOP/s (no sparsity).
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12}


def matmul_params(model: torch.nn.Module) -> int:
    """Parameters that take part in a matmul per token: all but the embedding lookup, plus the
    LM head (counted once even when tied to the embedding)."""
    cfg = model.config
    total = sum(p.numel() for p in model.parameters())
    return total if cfg.tie_word_embeddings else total - cfg.vocab_size * cfg.hidden_size


def flops_per_token(model: torch.nn.Module, seq_len: int) -> float:
    cfg = model.config
    return 6.0 * matmul_params(model) + 6.0 * cfg.num_hidden_layers * cfg.hidden_size * seq_len


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


def run(size: str, seq_len: int, seqs_per_step: int, micro_batch_tokens: int, steps: int,
        warmup: int, checkpointing: bool, chunk: int, attn: str) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = Qwen2Config(**SIZES[size], max_position_embeddings=max(seq_len, 4096))
    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)
    tcfg = SFTConfig(lr=1e-6, micro_batch_tokens=micro_batch_tokens, warmup_ratio=0.0,
                       gradient_checkpointing=checkpointing,
                       dtype="bfloat16" if device.type == "cuda" else "float32")
    trainer = Trainer(model, tcfg, total_steps=steps + warmup, chunk=chunk, progress=False)
    samples = synthetic_samples([seq_len] * seqs_per_step, vocab=cfg.vocab_size)
    batches = micro_batches(samples, list(range(seqs_per_step)), micro_batch_tokens)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(warmup):
        trainer.step(batches, sft_loss)
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        m = trainer.step(batches, sft_loss)
    sync()
    elapsed = time.perf_counter() - t0
    tokens = steps * seq_len * seqs_per_step
    tps = tokens / elapsed
    achieved = tps * flops_per_token(model, seq_len)
    peak = peak_flops(device)
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "size": size,
        "params": sum(p.numel() for p in model.parameters()),
        "seq_len": seq_len,
        "tokens_per_step": seq_len * seqs_per_step,
        "micro_batches_per_step": len(batches),
        "gradient_checkpointing": checkpointing,
        "attn": attn,
        "tokens_per_s": tps,
        "achieved_tflops": achieved / 1e12,
        "mfu": achieved / peak if peak else None,
        "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "last_loss": m["loss"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="0.5b")
    ap.add_argument("--tiny", action="store_true", help="tiny config, few short steps (CPU check)")
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--seqs-per-step", type=int, default=8)
    ap.add_argument("--micro-batch-tokens", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--attn", default="sdpa", help="sdpa | flash_attention_2 | eager")
    ap.add_argument("--no-checkpointing", action="store_true")
    a = ap.parse_args()
    if a.tiny:
        a.size, a.seq_len, a.seqs_per_step, a.micro_batch_tokens, a.steps, a.warmup = "tiny", 256, 4, 512, 2, 1
    print(json.dumps(run(a.size, a.seq_len, a.seqs_per_step, a.micro_batch_tokens, a.steps, a.warmup,
                         not a.no_checkpointing, a.chunk, a.attn), indent=2))


if __name__ == "__main__":
    main()
