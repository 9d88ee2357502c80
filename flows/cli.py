"""The `swerl` command line. Each sub-command is a thin call into a library function.

Heavy imports (torch, prefect, mlflow) happen inside the commands, so `swerl config show`
answers instantly.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from swerl.config import ConfigError, SwerlConfig, dump_config, load_config

Handler = Callable[[argparse.Namespace], int]


def _config(args: argparse.Namespace) -> SwerlConfig:
    return load_config(args.preset, args.set)


def _add_config_args(p: argparse.ArgumentParser, default: str = "smoke") -> None:
    p.add_argument("--preset", default=default, help="preset name in configs/ or a YAML path")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set dapo.stages.0.eps_high=0.3")


# ---------------------------------------------------------------- commands
def cmd_config_show(args: argparse.Namespace) -> int:
    print(dump_config(_config(args)), end="")
    return 0


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


def cmd_doctor(args: argparse.Namespace) -> int:
    from flows.doctor import doctor

    return doctor(_config(args))


def _context(cfg: SwerlConfig, run_id: str | None):
    from swerl.store import open_store
    from training.run import RunContext, default_run_id

    return RunContext(cfg=cfg, store=open_store(cfg.storage), run_id=run_id or default_run_id(cfg))


def _print_summary(title: str, summary: dict) -> None:
    print(f"\n{title}")
    for k, v in summary.items():
        print(f"  {k:<22} {v:.4g}" if isinstance(v, float) else f"  {k:<22} {v}")


def cmd_rollout(args: argparse.Namespace) -> int:
    """Episodes of the current policy on a task set; prints the resolved rate and the time split."""
    import logging

    from training import data, stages

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = _config(args)
    if args.tasks:
        cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"tasks_file": args.tasks})})
    ctx = _context(cfg, args.run_id)
    tasks = data.load_split(ctx, "train")
    if args.max_tasks:
        tasks = tasks[: args.max_tasks]
    stats = stages.rollouts(ctx, "cli", 0, tasks, args.samples or cfg.rollout.samples_per_task, args.model,
                            spec=stages.episode_spec(cfg), sampling=cfg.rollout.sampling)
    _print_summary(f"rollout {ctx.run_id}: {len(tasks)} tasks -> {ctx.store.url(ctx.key('rollouts', 'cli', 0))}",
                   stats.summary())
    return 0


def _flow_args(args: argparse.Namespace) -> dict:
    run_id = args.run_id
    if getattr(args, "fresh", False) and not run_id:
        import time

        from training.run import default_run_id

        run_id = f"{default_run_id(_config(args))}-{time.strftime('%Y%m%d-%H%M%S')}"
    return {"preset": args.preset, "overrides": list(args.set), "run_id": run_id}


def cmd_pipeline(args: argparse.Namespace) -> int:
    import json

    from flows.pipeline import pipeline

    _config(args)  # fail on a bad config before Prefect starts
    result = pipeline(**_flow_args(args))
    print(json.dumps(result, indent=2, default=str))
    return 0


def cmd_rft(args: argparse.Namespace) -> int:
    from flows.pipeline import rft

    _config(args)
    print(f"rft checkpoint: {rft(**_flow_args(args))}")
    return 0


def cmd_dapo(args: argparse.Namespace) -> int:
    from flows.pipeline import dapo

    _config(args)
    print(f"dapo checkpoint: {dapo(**_flow_args(args), policy=args.policy, iterations=args.iterations)}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from flows.pipeline import evaluate
    from training.report import eval_text

    sets = list(args.set)
    if args.tasks:
        sets.append(f"data.eval_tasks_file={args.tasks}")
    if args.runs:
        sets.append(f"eval.runs={args.runs}")
    args.set = sets
    cfg = _config(args)
    report = evaluate(**_flow_args(args), policy=args.model, label=args.label)
    print("\n" + eval_text(report, cfg.eval.k))
    ctx = _context(cfg, report["run_id"])
    preds = [_where(ctx.store, ctx.key("eval", report["label"], f"predictions-run{r}.jsonl"))
             for r in range(report["n_runs"])]
    print(f"  report                     {_where(ctx.store, ctx.key('eval', report['label'], 'report.md'))}")
    print("  predictions                " + "\n                             ".join(preds))
    # the overrides that change a verdict or where files are
    same = "".join(f" --set {s}" for s in args.set if s.startswith(("environment.", "storage.")))
    print(f"  re-grade a run: swerl grade --preset {args.preset}{same} --tasks {_eval_tasks_location(ctx)} "
          f"--predictions {preds[0]}")
    return 0


def _where(store, key: str) -> str:
    """A store object as people reach it: a local path for a file:// store, else its URL."""
    local = store.local_path(key)
    return str(local) if local is not None else store.url(key)


def _eval_tasks_location(ctx) -> str:
    """The tasks file the evaluation read: the preset's eval file, or its dataset's tasks.jsonl."""
    from training.data import find_file, pinned_dataset

    d = ctx.cfg.data
    if d.eval_tasks_file:
        return find_file(d.eval_tasks_file)
    digest = pinned_dataset(ctx, "eval", d.eval_dataset)  # the run's set, not just the newest
    return _where(ctx.store, f"datasets/{d.eval_dataset}/{digest}/tasks.jsonl")


def _tasks_with_images(path: str) -> list:
    """Load a tasks file (reporting bad lines) and make sure every instance image exists."""
    from environments.images import ensure_images
    from environments.records import load_tasks

    report = load_tasks(path)
    for err in report.errors:
        print(f"swerl: skipping malformed task: {err}", file=sys.stderr)
    images = ensure_images(report.tasks)
    for t in report.tasks:
        t.image = images[t.instance_id]
    return report.tasks


def _local_file(cfg: SwerlConfig, location: str, tmp: str) -> str:
    """`location` as a local path: a path as is, a URL of the configured store downloaded into
    `tmp` (what `swerl evaluate` prints for an S3 store)."""
    from pathlib import Path

    from swerl.store import open_store

    if "://" not in location:
        return location
    if location.startswith("file://"):
        return location[len("file://"):]
    store = open_store(cfg.storage)
    root = store.url() + "/"
    if not location.startswith(root):
        raise ConfigError(f"storage.uri: {location} is outside the configured store {store.url()}")
    key = location[len(root):]
    return str(store.get_file(key, Path(tmp) / key.replace("/", "_")))


def cmd_grade(args: argparse.Namespace) -> int:
    import json
    import tempfile
    from pathlib import Path

    from environments.grading import grade_many

    cfg = _config(args)
    with tempfile.TemporaryDirectory(prefix="swerl-grade-") as tmp:
        tasks = {t.instance_id: t for t in _tasks_with_images(_local_file(cfg, args.tasks, tmp))}
        report = grade_many(tasks, _local_file(cfg, args.predictions, tmp), cfg.environment, workers=args.workers)
    Path(args.report).write_text(json.dumps(report, indent=2))
    print(f"resolved {report['resolved_instances']} / unresolved {report['unresolved_instances']} / "
          f"error {report['error_instances']}  (of {report['submitted_instances']} predictions, "
          f"{report['empty_patch_instances']} empty) -> {args.report}")
    for status in ("resolved", "unresolved"):
        if report[f"{status}_ids"]:
            print(f"  {status}: {' '.join(report[f'{status}_ids'])}")
    for iid in report["error_ids"]:
        print(f"  error {iid}: {report['instances'].get(iid, {}).get('error_reason', '')}")
    return 0


def cmd_env_shell(args: argparse.Namespace) -> int:
    from environments.env_shell import run_shell

    cfg = _config(args)
    tasks = [t for t in _tasks_with_images(args.tasks) if t.instance_id == args.task_id] if args.tasks else []
    if not tasks:
        print(f"swerl: task {args.task_id} not found in {args.tasks}", file=sys.stderr)
        return 2
    run_shell(tasks[0], cfg.environment, cfg.rollout.action_format,
              observation_max_chars=cfg.rollout.observation_max_chars)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import json

    cfg = _config(args)
    if args.what == "env":
        from bench.env import bench_exec
        from bench.grading import bench_grading

        out = {"exec": bench_exec(n=args.n, cfg=cfg.environment)}
        tasks = _tasks_with_images(args.tasks or "data/fixtures/tasks.jsonl")
        out["grading"] = bench_grading(tasks[0], n=max(3, args.n // 40), env_cfg=cfg.environment)
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


def cmd_promote(args: argparse.Namespace) -> int:
    import json

    from flows.registry_flows import promote

    _config(args)
    print(json.dumps(promote(**_flow_args(args), version=args.version, manual=args.manual, note=args.note),
                     indent=2, default=str))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from flows.registry_flows import report

    print(report(args.run_id, args.preset, list(args.set)))
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    from flows.deploy import DeployError, default_stack_env, deploy, describe, resolve_targets

    cfg = _config(args)
    stack_env = default_stack_env(cfg, args.api_url)
    try:
        names = deploy(cfg, args.api_url, stack_env=stack_env)
    except DeployError as e:
        print(f"swerl deploy: {e}", file=sys.stderr)
        return 1
    print("\n".join(describe(resolve_targets(cfg, args.api_url, stack_env)["PREFECT_API_URL"], names)))
    return 0


def cmd_curate_synth(args: argparse.Namespace) -> int:
    import json

    from flows.curate import curate

    _config(args)
    out = curate(**_flow_args(args))
    for split in ("train", "eval"):
        d = out[split]
        print(f"{split}: {d['name']}@{d['hash']} {d['counts']['total']} tasks -> {d['uri']}")
        print("  by project : " + json.dumps(d["counts"]["by_project"]))
        print("  by modifier: " + json.dumps(d["counts"]["by_modifier"]))
    return 0


def cmd_curate_import(args: argparse.Namespace) -> int:
    from environments.curation.dataset import save_dataset
    from environments.curation.importers import import_tasks
    from swerl.store import open_store

    cfg = _config(args)
    report = import_tasks(args.source_path, args.source, repo_mirror=args.repo_mirror, split=args.split)
    for err in report.errors:
        print(f"swerl: skipped: {err}", file=sys.stderr)
    print(f"imported {len(report.tasks)} tasks ({len(report.errors)} skipped)")
    if args.name and report.tasks:
        ref = save_dataset(open_store(cfg.storage), args.name, report.tasks,
                           {"source": args.source, "from": args.source_path})
        print(f"dataset {ref.name}@{ref.hash} -> {ref.uri}")
    return 0 if report.tasks else 1


def cmd_dataset_ls(args: argparse.Namespace) -> int:
    from environments.curation.dataset import list_datasets
    from swerl.store import open_store

    for ref in list_datasets(open_store(_config(args).storage)):
        print(f"{ref.name:<24} {ref.hash}  {ref.counts.get('total', '?'):>5} tasks  {ref.uri}")
    return 0


def cmd_dataset_show(args: argparse.Namespace) -> int:
    import json

    from environments.curation.dataset import dataset_manifest
    from swerl.store import open_store

    print(json.dumps(dataset_manifest(open_store(_config(args).storage), args.name, args.hash), indent=2))
    return 0


def cmd_dataset_ship(args: argparse.Namespace) -> int:
    from environments.curation.dataset import latest_hash, ship_dataset
    from swerl.store import open_store

    store = open_store(_config(args).storage)
    digest = args.hash or latest_hash(store, args.name)
    path = ship_dataset(store, args.name, digest)
    print(f"{args.name}@{digest} -> {path} ({path.stat().st_size / 1e6:.2f} MB); a config pins it with "
          f"data.train_hash or data.eval_hash: {digest}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    import json
    import random

    from environments.curation.validate import validate_tasks
    from environments.records import load_tasks

    cfg = _config(args)
    loaded = load_tasks(args.tasks)
    for err in loaded.errors:
        print(f"swerl: skipping malformed task: {err}", file=sys.stderr)
    tasks = loaded.tasks
    if args.sample and args.sample < len(tasks):
        tasks = random.Random(args.seed).sample(tasks, args.sample)
    report = validate_tasks(tasks, cfg.environment, workers=args.workers)
    print(json.dumps(report.summary(), indent=2))
    for iid, why in report.failed.items():
        print(f"  FAILED {iid}: {why}")
    return 0 if not report.failed else 1


def _add_run_args(p: argparse.ArgumentParser, default_preset: str = "smoke") -> None:
    _add_config_args(p, default_preset)
    p.add_argument("--run-id", help="the run to resume (default: derived from the resolved config)")
    p.add_argument("--fresh", action="store_true", help="start a new run instead of resuming")


# ---------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="swerl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("config", help="inspect configuration")
    csub = p.add_subparsers(dest="config_command", required=True)
    show = csub.add_parser("show", help="print the resolved config of a preset")
    _add_config_args(show)
    show.set_defaults(func=cmd_config_show)

    p = sub.add_parser("setup", help="build the sandbox base image and cache the default model")
    p.set_defaults(func=cmd_setup)

    p = sub.add_parser("doctor", help="check docker, images, model, store, MLflow, Prefect, GPU, disk")
    _add_config_args(p)
    p.set_defaults(func=cmd_doctor)
    p = sub.add_parser("rollout", help="run episodes of a policy on a task set and summarise them")
    _add_config_args(p)
    p.add_argument("--tasks", help="tasks.jsonl (default: the preset's train set)")
    p.add_argument("--samples", type=int, help="episodes per task (default rollout.samples_per_task)")
    p.add_argument("--model", default="base", help="'base' or a checkpoint name of this run (e.g. rft-0)")
    p.add_argument("--max-tasks", type=int)
    p.add_argument("--run-id", help="resume/extend this run (default: derived from the config)")
    p.set_defaults(func=cmd_rollout)

    p = sub.add_parser("pipeline", help="run every stage (Prefect flow; ephemeral API unless configured)")
    _add_run_args(p, "cpu-demo")
    p.set_defaults(func=cmd_pipeline)

    p = sub.add_parser("rft", help="rejection fine-tuning: sample, keep resolved, fine-tune")
    _add_run_args(p)
    p.set_defaults(func=cmd_rft)

    p = sub.add_parser("dapo", help="iterative DAPO from a policy")
    _add_run_args(p)
    p.add_argument("--policy", default="base", help="'base' or a checkpoint name of the run (e.g. rft-0)")
    p.add_argument("--iterations", type=int, help="run at most this many iterations")
    p.set_defaults(func=cmd_dapo)

    p = sub.add_parser("evaluate", help="Pass@1 +- SEM and Pass@k of a model on an eval set")
    _add_run_args(p)
    p.add_argument("--model", default="base",
                   help="base, a checkpoint of the run, a local path, a store key or models:/swerl-agent@champion")
    p.add_argument("--tasks", help="eval tasks.jsonl (default: the preset's eval set)")
    p.add_argument("--runs", type=int, help="independent runs (default eval.runs)")
    p.add_argument("--label", help="name of this evaluation in the run (default: the model)")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("grade", help="grade SWE-bench-format predictions in fresh containers")
    _add_config_args(p)
    p.add_argument("--tasks", required=True,
                   help="tasks.jsonl (SWE-bench format plus swerl fields): a path or a URL in the store")
    p.add_argument("--predictions", required=True,
                   help="predictions .jsonl/.json (instance_id, model_patch): a path or a URL in the store")
    p.add_argument("--report", default="report.json")
    p.add_argument("--workers", type=int, default=2)
    p.set_defaults(func=cmd_grade)

    p = sub.add_parser("env", help="the gym, by hand")
    esub = p.add_subparsers(dest="env_command", required=True)
    sh = esub.add_parser("shell", help="act as the agent on a task: type actions, see observations")
    _add_config_args(sh)
    sh.add_argument("task_id")
    sh.add_argument("--tasks", required=True)
    sh.set_defaults(func=cmd_env_shell)

    p = sub.add_parser("bench", help="measure sandboxes and grading, rollouts, the trainer, or one DAPO update")
    p.add_argument("what", choices=["env", "rollout", "train", "update"])
    _add_config_args(p)
    p.add_argument("--n", type=int, default=200, help="samples for the env bench")
    p.add_argument("--tasks", help="tasks.jsonl for the grading bench (default: the fixtures)")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("promote", help="challenger -> champion if significantly better (paired test)")
    _add_run_args(p)
    p.add_argument("--version", help="registered version (default: the run's newest)")
    p.add_argument("--manual", action="store_true", help="promote regardless of the test (recorded as manual)")
    p.add_argument("--note", default="", help="why, for the record")
    p.set_defaults(func=cmd_promote)

    p = sub.add_parser("report", help="rebuild a run's report (Markdown, PNG, report.json) from the store")
    p.add_argument("run_id")
    _add_config_args(p)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("deploy", help="create work pools, concurrency limits and deployments on a Prefect API")
    _add_config_args(p)
    p.add_argument("--api-url", help="Prefect API (default: the stack's .env, else orchestration.prefect_api_url)")
    p.set_defaults(func=cmd_deploy)

    p = sub.add_parser("curate", help="build datasets: synthesise from PyPI projects, or import SWE-bench files")
    csub = p.add_subparsers(dest="curate_command", required=True)
    syn = csub.add_parser("synth", help="synthesise validated tasks from the preset's projects (cached); a preset that "
                          "pins its datasets (data.*_hash) takes those: set them to null to synthesise")
    _add_run_args(syn, "cpu-demo")
    syn.set_defaults(func=cmd_curate_synth)
    imp = csub.add_parser("import", help="import SWE-bench / SWE-rebench / SWE-Gym tasks (file or HF name)")
    _add_config_args(imp)
    imp.add_argument("source_path", help="a .json/.jsonl/.parquet file or a Hugging Face dataset name")
    imp.add_argument("--source", required=True, help="swe-bench, swe-bench-lite, swe-bench-verified, swe-rebench, swe-gym")
    imp.add_argument("--repo-mirror", help="directory of bare mirrors named owner__name.git")
    imp.add_argument("--split", help="train or eval (default: by source)")
    imp.add_argument("--name", help="save as this dataset in the store")
    imp.set_defaults(func=cmd_curate_import)

    p = sub.add_parser("dataset", help="browse datasets in the store")
    dsub = p.add_subparsers(dest="dataset_command", required=True)
    ls = dsub.add_parser("ls")
    _add_config_args(ls)
    ls.set_defaults(func=cmd_dataset_ls)
    show = dsub.add_parser("show")
    _add_config_args(show)
    show.add_argument("name")
    show.add_argument("--hash")
    show.set_defaults(func=cmd_dataset_show)
    ship = dsub.add_parser("ship", help="copy a stored dataset to data/datasets/ (for data.*_hash pins)")
    _add_config_args(ship)
    ship.add_argument("name")
    ship.add_argument("--hash", help="default: the newest")
    ship.set_defaults(func=cmd_dataset_ship)

    p = sub.add_parser("validate", help="gold resolves, empty does not, FAIL_TO_PASS fail before")
    _add_config_args(p)
    p.add_argument("--tasks", required=True)
    p.add_argument("--sample", type=int, help="validate a random sample of this many tasks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.set_defaults(func=cmd_validate)
    return parser


def set_process_defaults() -> None:
    """Environment defaults for every swerl process (the user's environment wins); the tests
    call it too, so they run as the CLI does."""
    import os

    # nothing leaves the machine: Prefect's ephemeral server would otherwise send telemetry
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # the ephemeral API's first start after `make setup` compiles its modules and migrates a new
    # database: on a 2-core AVX2 machine that ran past Prefect's 20 s and `make demo` died at once
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


def main(argv: list[str] | None = None) -> int:
    set_process_defaults()
    args = build_parser().parse_args(argv)
    # ours before Prefect's: a flow run's SIGTERM handler crashes the run, then re-sends SIGTERM
    # to the handler it found; with Python's default there, the process died with its sandboxes up
    from environments.sandbox import install_exit_handlers

    install_exit_handlers()
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"swerl: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("swerl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
