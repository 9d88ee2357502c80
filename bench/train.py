"""`bench train`: is the trainer fast, tight and small enough?

Three measurements, each against a plain baseline:
- tokens/s of ``Trainer.step`` vs a plain PyTorch loop (full logits, loss.backward, AdamW) over
  the same micro-batches, timed alternately so load from other processes hits both alike;
- padding share of length-grouped micro-batches on modelled trajectory-length distributions;
- DAPO update time with shared prompts packed vs one row per sample, in cpu-demo-1turn's shape (G
  samples per prompt, long prompt, short replies): old-logprob scoring plus optimizer steps;
- peak memory of the logprob pass (forward + backward) at 16k tokens, chunked vs naive, each in
  a fresh process, read from the kernel's RSS high-water mark (VmHWM after resetting it through
  /proc/self/clear_refs): a real measurement that includes every allocator.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from swerl.config import SFTConfig
from swerl.paths import swerl_home
from training.batching import MicroBatch, micro_batches, minibatches, padding_share
from bench.synthetic import synthetic_samples, tiny_llama
from training.logprobs import naive_token_logprobs, token_logprobs
from training.rft import sft_loss
from training.trainer import Trainer
from training.trajectory import TrainingSample

REPO = Path(__file__).resolve().parent.parent
SMOLLM2_VOCAB = 49152


# ---- memory ---------------------------------------------------------------------------------
# glibc keeps freed memory around (and moves its mmap threshold) unless told otherwise, which
# makes RSS lag behind live tensors by hundreds of MB. With these set at process start every
# allocation above 64 KiB is its own mapping, returned on free, so RSS tracks live memory.
EXACT_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


def _status_kb(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def peak_rss_mb(fn) -> float:
    """Peak RSS growth (MB) while ``fn()`` runs: reset the high-water mark, run, read it.

    Exact only in a process started with EXACT_MALLOC_ENV (see peak_logprob_memory).
    """
    Path("/proc/self/clear_refs").write_text("5")
    base = _status_kb("VmRSS")
    fn()
    return (_status_kb("VmHWM") - base) / 1024


def _peak_child(tokens: int, vocab: int, hidden: int, chunk: int) -> dict[str, float]:
    torch.manual_seed(0)
    model = tiny_llama(vocab, hidden, layers=2)

    def run(mode: str, n: int) -> None:
        ids = torch.randint(0, vocab, (1, n))
        attn = torch.ones_like(ids)
        if mode == "naive":
            lp = naive_token_logprobs(model, ids, attn)
        else:
            lp = token_logprobs(model, ids, attn, chunk)
        lp.sum().backward()

    for mode in ("naive", "chunked"):  # warm-up: grad buffers, thread pools, lazy init
        run(mode, 64)
    return {f"peak_mb_{mode}": peak_rss_mb(lambda: run(mode, tokens)) for mode in ("chunked", "naive")}


def peak_logprob_memory(tokens: int = 16384, vocab: int = SMOLLM2_VOCAB, hidden: int = 64,
                        chunk: int = 1024) -> dict[str, float]:
    """Peak memory of logprobs + backward at ``tokens``, chunked vs naive, in a fresh process."""
    cmd = [sys.executable, "-m", "bench.train", "--peak-child", "--tokens", str(tokens),
           "--vocab", str(vocab), "--hidden", str(hidden), "--chunk", str(chunk)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                          env=os.environ | EXACT_MALLOC_ENV)
    if proc.returncode != 0:
        raise RuntimeError(f"peak-memory child failed (rc={proc.returncode}):\n{proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["peak_ratio_chunked_over_naive"] = out["peak_mb_chunked"] / out["peak_mb_naive"]
    out["peak_tokens"] = float(tokens)
    return out


# ---- padding ----------------------------------------------------------------------------
def modelled_lengths(n: int, median: int, sigma: float, lo: int, hi: int, seed: int = 0) -> list[int]:
    """Trajectory lengths: log-normal around ``median``, clipped to [lo, hi] (context limit)."""
    rng = random.Random(seed)
    return [int(min(hi, max(lo, rng.lognormvariate(0.0, sigma) * median))) for _ in range(n)]


def padding_report(batch_size: int, micro_batch_tokens: int, lengths: list[int]) -> float:
    """Padding share over all optimizer steps of ``lengths`` in order-preserving minibatches."""
    samples = synthetic_samples(lengths, vocab=1)
    batches: list[MicroBatch] = []
    for s in range(0, len(samples), batch_size):
        batches += micro_batches(samples, list(range(s, min(s + batch_size, len(samples)))),
                                 micro_batch_tokens)
    return padding_share(batches)


# ---- throughput -------------------------------------------------------------------------
def load_bench_model() -> tuple[torch.nn.Module, str]:
    path = swerl_home() / "models" / "SmolLM2-135M-Instruct"
    if (path / "config.json").is_file():
        return AutoModelForCausalLM.from_pretrained(path, dtype="float32"), "SmolLM2-135M-Instruct"
    cfg = LlamaConfig(vocab_size=SMOLLM2_VOCAB, hidden_size=576, intermediate_size=1536,
                      num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                      tie_word_embeddings=True)
    return LlamaForCausalLM(cfg), "SmolLM2-135M config (random init)"


def plain_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batches: list[MicroBatch],
               grad_clip: float) -> None:
    """The textbook loop: full logits, log_softmax, token-mean NLL, backward, clip, AdamW."""
    n = max(sum(b.loss_tokens for b in batches), 1)
    for b in batches:
        lp = naive_token_logprobs(model, b.input_ids, b.attention_mask)
        (-(lp * b.loss_mask).sum() / n).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)


def throughput(steps: int = 2, step_tokens: int = 1024, micro_batch_tokens: int = 512,
               seed: int = 0) -> dict[str, Any]:
    """Trainer vs plain loop, same model weights, same batches, alternating A/B per step."""
    torch.manual_seed(seed)
    model, name = load_bench_model()
    vocab = model.config.vocab_size
    cfg = SFTConfig(lr=1e-5, micro_batch_tokens=micro_batch_tokens, gradient_checkpointing=False,
                      warmup_ratio=0.0)
    plain_model = copy.deepcopy(model)
    plain_opt = torch.optim.AdamW(plain_model.parameters(), lr=cfg.lr)
    trainer = Trainer(model, cfg, total_steps=steps + 1, progress=False)
    # Each step: a few trajectories of modelled lengths adding up to about step_tokens.
    lengths = modelled_lengths(64, median=step_tokens // 4, sigma=0.5, lo=64, hi=micro_batch_tokens,
                               seed=seed)
    samples, plan, acc = synthetic_samples(lengths, vocab, seed), [], []
    for i, n in enumerate(lengths):
        acc.append(i)
        if sum(lengths[j] for j in acc) >= step_tokens:
            plan.append(acc)
            acc = []
    plan = plan[:steps + 1]
    t_trainer = t_plain = 0.0
    tokens = 0
    for k, index in enumerate(plan):
        batches = micro_batches(samples, index, micro_batch_tokens)
        t0 = time.perf_counter()
        trainer.step(batches, sft_loss)
        t1 = time.perf_counter()
        plain_step(plain_model, plain_opt, batches, cfg.grad_clip)
        t2 = time.perf_counter()
        if k == 0:
            continue  # warm-up: first-call allocations and lazy init
        t_trainer += t1 - t0
        t_plain += t2 - t1
        tokens += sum(b.real_tokens for b in batches)
    return {
        "model": name,
        "timed_steps": float(len(plan) - 1),
        "tokens_timed": float(tokens),
        "trainer_tokens_per_s": tokens / t_trainer,
        "plain_tokens_per_s": tokens / t_plain,
        "trainer_over_plain": t_plain / t_trainer,
        "threads": float(torch.get_num_threads()),
    }


def dapo_shaped_samples(groups: int, group_size: int, prompt: int, reply: int, vocab: int,
                        seed: int = 0, common: int = 0) -> list[TrainingSample]:
    """``groups`` prompts of ``prompt`` random tokens (the first ``common`` the same in all, as
    the instructions are), each with ``group_size`` replies of ``reply`` tokens and advantages
    of both signs."""
    rng = random.Random(seed)
    shared = [rng.randrange(vocab) for _ in range(common)]
    out = []
    for _ in range(groups):
        head = shared + [rng.randrange(vocab) for _ in range(prompt - common)]
        for k in range(group_size):
            tail = [rng.randrange(vocab) for _ in range(reply)]
            out.append(TrainingSample(head + tail, [0] * prompt + [1] * reply, [0.0] * (prompt + reply),
                                      [prompt], advantage=1.0 if k % 2 else -1.0))
    return out


def packing(groups: int = 3, group_size: int = 8, prompt: int = 1115, reply: int = 16,
            batch_size: int = 16, steps: int = 1, seed: int = 0) -> dict[str, Any]:
    """One DAPO update (score all samples, then ``steps`` optimizer steps of ``batch_size``),
    packed vs one row per sample, same weights, same minibatches, bf16 + checkpointing as in
    cpu-demo-1turn. The two modes alternate per phase so outside load hits both alike."""
    torch.manual_seed(seed)
    model, name = load_bench_model()
    samples = dapo_shaped_samples(groups, group_size, prompt, reply, model.config.vocab_size, seed)
    cfg = SFTConfig(lr=1e-6, dtype="bfloat16", warmup_ratio=0.0)
    trainers = {mode: Trainer(copy.deepcopy(model), cfg, total_steps=steps, progress=False)
                for mode in ("packed", "plain")}
    seconds = dict.fromkeys(trainers, 0.0)
    tokens = dict.fromkeys(trainers, 0)
    everything = list(range(len(samples)))
    plan = minibatches(len(samples), batch_size, seed)[:steps]
    for phase in [None, *plan]:  # None: score every sample (old logprobs)
        for mode, trainer in trainers.items():
            batches = micro_batches(samples, everything if phase is None else phase,
                                    cfg.micro_batch_tokens, pack=mode == "packed")
            t0 = time.perf_counter()
            if phase is None:
                trainer.score(batches)
            else:
                trainer.step(batches, sft_loss)
            seconds[mode] += time.perf_counter() - t0
            tokens[mode] += sum(b.real_tokens for b in batches)
    return {
        "model": name, "samples": float(len(samples)), "optimizer_steps": float(len(plan)),
        "update_s_packed": seconds["packed"], "update_s_plain": seconds["plain"],
        "tokens_packed": float(tokens["packed"]), "tokens_plain": float(tokens["plain"]),
        "packed_speedup": seconds["plain"] / seconds["packed"],
    }


def bench_train(peak_tokens: int = 16384, steps: int = 2, step_tokens: int = 1024,
                parts: tuple[str, ...] = ("padding", "memory", "throughput")) -> dict[str, Any]:
    """Run the chosen parts; each part's numbers are printed to stderr as soon as they exist."""
    results: dict[str, Any] = {}

    def report(part: dict[str, Any]) -> None:
        results.update(part)
        print(json.dumps(part), file=sys.stderr, flush=True)

    if "padding" in parts:
        report({
            # cpu-demo-1turn preset: 4k context, 32 trajectories per step, micro_batch_tokens 4096
            "padding_share_cpu_demo": padding_report(
                32, 4096, modelled_lengths(512, median=2000, sigma=0.5, lo=300, hi=4096, seed=1)),
            # gpu-7b preset: 32k context, 128 trajectories per step, micro_batch_tokens 32768
            "padding_share_gpu_7b": padding_report(
                128, 32768, modelled_lengths(1024, median=6000, sigma=0.7, lo=800, hi=32768, seed=2)),
        })
    if "memory" in parts:
        report(peak_logprob_memory(tokens=peak_tokens))
    if "throughput" in parts:
        report(throughput(steps=steps, step_tokens=step_tokens, micro_batch_tokens=step_tokens // 2))
    if "packing" in parts:
        report(packing())
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peak-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--vocab", type=int, default=SMOLLM2_VOCAB)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=2, help="timed optimizer steps (throughput)")
    ap.add_argument("--step-tokens", type=int, default=1024)
    ap.add_argument("--parts", default="padding,memory,throughput",
                    help="comma-separated; also: packing (~10 min on 2 cores)")
    args = ap.parse_args()
    if args.peak_child:
        print(json.dumps(_peak_child(args.tokens, args.vocab, args.hidden, args.chunk)))
        return
    print(json.dumps(bench_train(args.tokens, args.steps, args.step_tokens,
                                 tuple(args.parts.split(","))), indent=2))


if __name__ == "__main__":
    main()
