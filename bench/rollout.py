"""How much the rollout engine's batching buys: the same episodes batched vs one at a time.

Both runs get the same tasks, sample indices, seeds and limits (each turn's seed depends on the
episode and the turn only, so the two runs sample the same tokens up to float noise between batch
shapes); the report says how many tokens each generated and prefilled, so that the speedup is
read against comparable work. Real model, real docker sandboxes, the hand-made fixture tasks.

    python -m bench.rollout --episodes 8 --concurrency 8 --max-turns 3 --max-new-tokens 64

`bench_backends` instead runs a preset's own rollout shape (prompts, limits, samples per task,
concurrency) on each of several backends (`swerl bench rollout --preset P --backends hf,vllm`).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from environments.records import TaskInstance
from swerl.config import EnvironmentConfig, SwerlConfig
from training.agent import AgentLimits, resolved_reward
from training.inference.base import InferenceBackend, SamplingParams
from training.rollout import RolloutSpec, RolloutStats, collect

REPORTED = ("episodes", "wall_s", "episodes_per_min", "tokens_per_s", "gen_tokens_per_s", "generated_tokens",
            "prompt_tokens", "generate_calls", "mean_batch", "gen_time_s", "env_time_s", "grade_time_s",
            "mean_turns", "format_error_rate", "resolved_rate", "error_rate")


def ready_fixture_tasks(n: int) -> list[TaskInstance]:
    """The first n hand-made fixture tasks with their images built (cache hits once built)."""
    from bench.fixture_tasks import load_fixture_tasks
    from environments.images import ensure_images

    tasks = load_fixture_tasks()[:n]
    images = ensure_images(tasks, progress=lambda line: None)
    for t in tasks:
        t.image = images[t.instance_id]
    return tasks


def _forget_verdicts() -> None:
    """SWEEnv remembers verdicts per process (same task, same patch: same verdict). Within a run
    that is real saving; across the two runs it would grade the second for free."""
    from environments import verdicts

    verdicts.VERDICTS = verdicts.VerdictCache()


def _run(tasks: list[TaskInstance], samples: int, backend: InferenceBackend, env_cfg: EnvironmentConfig,
         limits: AgentLimits, seed: int, concurrency: int, progress: bool) -> RolloutStats:
    from environments.swe_env import SWEEnv

    spec = RolloutSpec(limits=limits, sampling=SamplingParams(temperature=1.0, max_new_tokens=limits.max_new_tokens,
                                                              seed=seed),
                       action_format="tools+file", concurrency=concurrency)
    return collect(tasks, samples, backend, lambda t: SWEEnv(t, env_cfg, "tools+file", observation_max_chars=2000),
                   spec, resolved_reward, progress=progress)


def bench_rollout(n_episodes: int = 8, concurrency: int = 8, max_turns: int = 3, max_new_tokens: int = 64,
                  n_tasks: int = 4, model: str = "default", seed: int = 0, prefix_cache: bool = True,
                  backend: InferenceBackend | None = None, env_cfg: EnvironmentConfig | None = None,
                  progress: bool = False, threads: int | None = None, dtype: str = "float32") -> dict[str, Any]:
    """Batched (`concurrency` episodes at once) then sequential (one at a time); both reports and
    the speedups. `n_episodes` must be a multiple of `n_tasks` (samples per task).

    `prefix_cache`: the transformers backend reuses each context's keys/values across turns
    (training.inference.prefix_cache). Emptied between the two runs: the second must not find the first's
    contexts, which are the same ids. `threads`: torch threads while generating, `dtype`: the
    policy's weights while sampling (both runs).
    """
    if n_episodes % n_tasks:
        raise ValueError(f"n_episodes={n_episodes} is not a multiple of n_tasks={n_tasks}")
    tasks = ready_fixture_tasks(n_tasks)
    if backend is None:
        from training.inference.hf import HFBackend
        from training.inference.prefix_cache import PrefixCachingHFBackend

        backend = (PrefixCachingHFBackend if prefix_cache else HFBackend)(model, seed=seed, threads=threads,
                                                                          dtype=dtype)
    env_cfg = env_cfg or EnvironmentConfig(sandbox="docker", command_timeout_s=30, test_timeout_s=180)
    limits = AgentLimits(max_turns=max_turns, max_context_tokens=4096, max_new_tokens=max_new_tokens)
    backend.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2, seed=0))  # warm the model up
    runs: dict[str, RolloutStats] = {}
    computed: dict[str, int] = {}
    for name, conc in (("batched", concurrency), ("sequential", 1)):
        _forget_verdicts()
        if hasattr(backend, "reset_cache"):
            backend.reset_cache()
        before = getattr(backend, "prefill_tokens", 0)
        t0 = time.monotonic()
        runs[name] = _run(tasks, n_episodes // n_tasks, backend, env_cfg, limits, seed, conc, progress)
        computed[name] = getattr(backend, "prefill_tokens", 0) - before
        print(f"[bench_rollout] {name}: {time.monotonic() - t0:.0f} s", flush=True)
    out: dict[str, Any] = {"n_episodes": n_episodes, "concurrency": concurrency, "max_turns": max_turns,
                           "dtype": getattr(backend, "dtype", dtype), "threads": getattr(backend, "threads", threads),
                           "max_new_tokens": max_new_tokens, "prefix_cache": hasattr(backend, "reset_cache"),
                           "tasks": [t.instance_id for t in tasks]}
    for name, stats in runs.items():
        summary = stats.summary()
        out[name] = {k: round(float(summary[k]), 3) for k in REPORTED}
        if hasattr(backend, "reset_cache"):
            out[name]["prefilled_tokens"] = computed[name]  # prompt tokens the model actually ran
    b, s = out["batched"], out["sequential"]
    out["speedup_episodes_per_min"] = round(b["episodes_per_min"] / max(s["episodes_per_min"], 1e-9), 2)
    out["speedup_tokens_per_s"] = round(b["tokens_per_s"] / max(s["tokens_per_s"], 1e-9), 2)
    same = {t.key: [x.token_ids for x in t.turns] for t in runs["batched"].trajectories}
    out["same_tokens_share"] = round(sum(same.get(t.key) == [x.token_ids for x in t.turns]
                                         for t in runs["sequential"].trajectories) / n_episodes, 3)
    return out


def bench_backends(cfg: SwerlConfig, backends: list[str], n_tasks: int = 4,
                   progress: bool = False) -> dict[str, Any]:
    """The preset's rollout shape on each backend in turn, then the throughput ratios against the
    first: the same tasks, samples per task, seeds, prompts, limits and concurrency on each.

    Replies differ between engines (other kernels, other random streams), so each report says
    how many tokens it generated and prefilled; tokens/s is the rate to compare. Each engine is
    closed before the next starts, and its start is not timed (a run starts it once).
    """
    from environments.swe_env import SWEEnv
    from training.inference import make_backend
    from training.stages import episode_spec

    if not backends:
        raise ValueError("--backends: name at least one rollout backend (hf, vllm, openai)")
    tasks = ready_fixture_tasks(n_tasks)
    spec = episode_spec(cfg)
    run_spec = RolloutSpec(**vars(spec), sampling=SamplingParams.from_config(cfg.rollout.sampling, seed=cfg.seed),
                           concurrency=cfg.rollout.concurrency)

    def make_env(t: TaskInstance) -> SWEEnv:
        return SWEEnv(t, cfg.environment, spec.action_format, observation_max_chars=spec.observation_max_chars,
                      prompt_style=spec.prompt_style, show_source=spec.show_source)

    out: dict[str, Any] = {"preset": cfg.preset, "tasks": [t.instance_id for t in tasks],
                           "samples_per_task": cfg.rollout.samples_per_task, "concurrency": cfg.rollout.concurrency,
                           "max_turns": spec.limits.max_turns, "max_new_tokens": spec.limits.max_new_tokens}
    for name in backends:
        backend = make_backend(cfg.rollout.model_copy(update={"backend": name}))
        try:
            backend.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2, seed=0))  # warm up
            _forget_verdicts()
            t0 = time.monotonic()
            stats = collect(tasks, cfg.rollout.samples_per_task, backend, make_env, run_spec, resolved_reward,
                            progress=progress)
            print(f"[bench_rollout] {name}: {time.monotonic() - t0:.0f} s", flush=True)
        finally:
            backend.close()
        summary = stats.summary()
        out[name] = {"engine": type(backend).__name__, "dtype": str(getattr(backend, "dtype", cfg.rollout.dtype)),
                     **{k: round(float(summary[k]), 3) for k in REPORTED}}
    first = backends[0]
    for name in backends[1:]:
        out[f"{name}_over_{first}"] = {k: round(out[name][k] / max(out[first][k], 1e-9), 2)
                                       for k in ("episodes_per_min", "tokens_per_s", "gen_tokens_per_s")}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--tasks", type=int, default=4, help="fixture tasks; episodes / tasks samples each")
    ap.add_argument("--model", default="default")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false")
    ap.add_argument("--threads", type=int, default=None, help="torch threads while generating")
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--json", default=None, help="also write the report here")
    args = ap.parse_args(argv)
    report = bench_rollout(args.episodes, args.concurrency, args.max_turns, args.max_new_tokens, args.tasks,
                           args.model, args.seed, args.prefix_cache, progress=args.progress,
                           threads=args.threads)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
