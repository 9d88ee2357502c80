"""`swerl` commands about the machine and the stack: config show, setup, doctor, bench, deploy.
Each `add_*` declares one command's arguments next to its handler."""

from __future__ import annotations

import argparse
import sys

from flows.cli_common import SubParsers, add_config_args, load_cli_config, tasks_with_images
from swerl.config import dump_config


def cmd_config_show(args: argparse.Namespace) -> int:
    print(dump_config(load_cli_config(args)), end="")
    return 0


def add_config(sub: SubParsers) -> None:
    p = sub.add_parser("config", help="inspect configuration")
    csub = p.add_subparsers(dest="config_command", required=True)
    show = csub.add_parser("show", help="print the resolved config of a preset")
    add_config_args(show)
    show.set_defaults(func=cmd_config_show)


def cmd_setup(args: argparse.Namespace) -> int:
    """Everything a run needs that is not a Python package: base image, default model."""
    import time

    from environments.base_image import ensure_base_image
    from swerl.model_cache import ensure_default_model

    t0 = time.time()
    print(f"[setup] base image: {ensure_base_image()}")
    print(f"[setup] default model: {ensure_default_model()}")
    print(f"[setup] done in {time.time() - t0:.1f}s")
    return 0


def add_setup(sub: SubParsers) -> None:
    p = sub.add_parser("setup", help="build the sandbox base image and cache the default model")
    p.set_defaults(func=cmd_setup)


def cmd_doctor(args: argparse.Namespace) -> int:
    from flows.doctor import doctor

    return doctor(load_cli_config(args))


def add_doctor(sub: SubParsers) -> None:
    p = sub.add_parser("doctor", help="check docker, images, model, store, MLflow, Prefect, GPU, disk")
    add_config_args(p)
    p.set_defaults(func=cmd_doctor)


def cmd_bench(args: argparse.Namespace) -> int:
    import json

    cfg = load_cli_config(args)
    if args.what == "env":
        from bench.env import bench_exec
        from bench.grading import bench_grading

        out = {"exec": bench_exec(n=args.n, cfg=cfg.environment)}
        tasks = tasks_with_images(args.tasks or "data/fixtures/tasks.jsonl")
        out["grading"] = bench_grading(tasks[0], n=max(3, args.n // 40), env_cfg=cfg.environment)
    elif args.what == "rollout" and args.backends:
        from bench.rollout import bench_backends

        out = bench_backends(cfg, [b.strip() for b in args.backends.split(",") if b.strip()], progress=True)
    elif args.what == "rollout":
        from bench.rollout import bench_rollout

        out = bench_rollout(model=cfg.rollout.model, env_cfg=cfg.environment, seed=cfg.seed, progress=True,
                            threads=cfg.rollout.infer_threads, dtype=cfg.rollout.dtype)
    elif args.what == "update":
        from bench.update_shape import bench_update

        out = bench_update(seed=cfg.seed)
    else:
        from bench.train import bench_train

        out = bench_train()
    print(json.dumps(out, indent=2, default=str))
    return 0


def add_bench(sub: SubParsers) -> None:
    p = sub.add_parser("bench", help="measure sandboxes and grading, rollouts, the trainer, or one DAPO update")
    p.add_argument("what", choices=["env", "rollout", "train", "update"])
    add_config_args(p)
    p.add_argument("--n", type=int, default=200, help="samples for the env bench")
    p.add_argument("--tasks", help="tasks.jsonl for the grading bench (default: the fixtures)")
    p.add_argument("--backends", help="rollout bench: compare these rollout backends (e.g. hf,vllm) on the "
                                      "preset's rollout shape, instead of batched against sequential")
    p.set_defaults(func=cmd_bench)


def cmd_deploy(args: argparse.Namespace) -> int:
    from flows.deploy import DeployError, default_stack_env, deploy, describe, resolve_targets

    cfg = load_cli_config(args)
    try:
        stack_env = default_stack_env(cfg, args.api_url, args.from_config)
        names = deploy(cfg, args.api_url, stack_env=stack_env)
    except DeployError as e:
        print(f"swerl deploy: {e}", file=sys.stderr)
        return 1
    print("\n".join(describe(resolve_targets(cfg, args.api_url, stack_env)["PREFECT_API_URL"], names)))
    return 0


def add_deploy(sub: SubParsers) -> None:
    p = sub.add_parser("deploy", help="create work pools, concurrency limits and deployments on a Prefect API")
    add_config_args(p)
    p.add_argument("--api-url", help="Prefect API (default: the stack's .env, else orchestration.prefect_api_url)")
    p.add_argument("--from-config", action="store_true",
                   help="take the store, MLflow and pools from the config, not from the stack's .env")
    p.set_defaults(func=cmd_deploy)
