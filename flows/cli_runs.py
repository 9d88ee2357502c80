"""`swerl` commands that run or inspect a pipeline run: rollout, pipeline, rft, dapo, evaluate,
promote, report. Each `add_*` declares one command's arguments next to its handler."""

from __future__ import annotations

import argparse
import sys

from flows.cli_common import SubParsers, add_config_args, add_run_args, flow_kwargs, load_cli_config, where
from swerl.config import DEFAULT_PRESET, SwerlConfig, load_config


def _context(cfg: SwerlConfig, run_id: str | None):
    from swerl.store import open_store
    from training.run import RunContext, default_run_id

    return RunContext(cfg=cfg, store=open_store(cfg.storage), run_id=run_id or default_run_id(cfg))


def _print_summary(title: str, summary: dict) -> None:
    print(f"\n{title}")
    for k, v in summary.items():
        print(f"  {k:<22} {v:.4g}" if isinstance(v, float) else f"  {k:<22} {v}")


def _add_run_target(p: argparse.ArgumentParser) -> None:
    """--preset, --set, --run/--run-id, --fresh for a command pointed at a run: with a run and
    no --preset, the run's stored config is used (`tasks.run_config`)."""
    add_config_args(p, None)
    p.add_argument("--run", "--run-id", dest="run_id", metavar="RUN_ID",
                   help="the run (default: the one the preset's resolved config names)")
    p.add_argument("--fresh", action="store_true", help="start a new run instead of resuming")


def _run_config(args: argparse.Namespace) -> SwerlConfig:
    """The config a command pointed at a run works with (the run's own unless --preset names
    another, which is refused); sets `args.preset` to what the flow is to load."""
    from tasks.run_config import choose_preset

    choice = choose_preset(args.run_id, args.preset, list(args.set))
    if choice.warning:
        print(f"swerl: warning: {choice.warning}", file=sys.stderr)
    args.preset = None if choice.from_run else choice.preset
    return load_config(choice.preset, list(args.set))


# ---------------------------------------------------------------- rollout
def cmd_rollout(args: argparse.Namespace) -> int:
    """Episodes of the current policy on a task set; prints the resolved rate and the time split."""
    import logging

    from training import data, stages

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = load_cli_config(args)
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


def add_rollout(sub: SubParsers) -> None:
    p = sub.add_parser("rollout", help="run episodes of a policy on a task set and summarise them")
    add_config_args(p)
    p.add_argument("--tasks", help="tasks.jsonl (default: the preset's train set)")
    p.add_argument("--samples", type=int, help="episodes per task (default rollout.samples_per_task)")
    p.add_argument("--model", default="base", help="'base' or a checkpoint name of this run (e.g. rft-0)")
    p.add_argument("--max-tasks", type=int)
    p.add_argument("--run-id", help="resume/extend this run (default: derived from the config)")
    p.set_defaults(func=cmd_rollout)


# ---------------------------------------------------------------- flows: pipeline, rft, dapo
def cmd_pipeline(args: argparse.Namespace) -> int:
    import json

    from pathlib import Path

    from flows.pipeline import pipeline
    from flows.run_params import PipelineParams

    load_cli_config(args)  # fail on a bad config before Prefect starts
    kw = flow_kwargs(args)
    named = Path(args.preset).suffix not in (".yaml", ".yml")
    params = PipelineParams(preset=args.preset if named else DEFAULT_PRESET, config_file=None if named else args.preset,
                            overrides=kw["overrides"], run_id=kw["run_id"])
    result = pipeline(params=params)
    print(json.dumps(result, indent=2, default=str))
    return 0


def add_pipeline(sub: SubParsers) -> None:
    p = sub.add_parser("pipeline", help="run every stage (Prefect flow; ephemeral API unless configured)")
    add_run_args(p, DEFAULT_PRESET)
    p.set_defaults(func=cmd_pipeline)


def cmd_rft(args: argparse.Namespace) -> int:
    from flows.pipeline import rft

    load_cli_config(args)
    print(f"rft checkpoint: {rft(**flow_kwargs(args))}")
    return 0


def add_rft(sub: SubParsers) -> None:
    p = sub.add_parser("rft", help="rejection fine-tuning: sample, keep resolved, fine-tune")
    add_run_args(p)
    p.set_defaults(func=cmd_rft)


def cmd_dapo(args: argparse.Namespace) -> int:
    from flows.pipeline import dapo

    load_cli_config(args)
    print(f"dapo checkpoint: {dapo(**flow_kwargs(args), policy=args.policy, iterations=args.iterations)}")
    return 0


def add_dapo(sub: SubParsers) -> None:
    p = sub.add_parser("dapo", help="iterative DAPO from a policy")
    add_run_args(p)
    p.add_argument("--policy", default="base", help="'base' or a checkpoint name of the run (e.g. rft-0)")
    p.add_argument("--iterations", type=int, help="run at most this many iterations")
    p.set_defaults(func=cmd_dapo)


# ---------------------------------------------------------------- evaluate
def cmd_evaluate(args: argparse.Namespace) -> int:
    from flows.pipeline import evaluate
    from training.report import eval_text

    sets = list(args.set)
    if args.tasks:
        sets.append(f"data.eval_tasks_file={args.tasks}")
    if args.runs:
        sets.append(f"eval.runs={args.runs}")
    args.set = sets
    cfg = _run_config(args)
    report = evaluate(**flow_kwargs(args), policy=args.model, label=args.label)
    print("\n" + eval_text(report, cfg.eval.k))
    ctx = _context(cfg, report["run_id"])
    preds = [where(ctx.store, ctx.key("eval", report["label"], f"predictions-run{r}.jsonl"))
             for r in range(report["n_runs"])]
    print(f"  report                     {where(ctx.store, ctx.key('eval', report['label'], 'report.md'))}")
    print("  predictions                " + "\n                             ".join(preds))
    # the overrides that change a verdict or where files are
    same = "".join(f" --set {s}" for s in args.set if s.startswith(("environment.", "storage.")))
    print(f"  re-grade a run: swerl grade --preset {cfg.preset}{same} --tasks {eval_tasks_location(ctx)} "
          f"--predictions {preds[0]}")
    return 0


def eval_tasks_location(ctx) -> str:
    """The tasks file the evaluation read: the preset's eval file, or its dataset's tasks.jsonl."""
    from training.data import find_file, pinned_dataset

    d = ctx.cfg.data
    if d.eval_tasks_file:
        return find_file(d.eval_tasks_file)
    digest = pinned_dataset(ctx, "eval", d.eval_dataset)  # the run's set, not just the newest
    return where(ctx.store, f"datasets/{d.eval_dataset}/{digest}/tasks.jsonl")


def add_evaluate(sub: SubParsers) -> None:
    p = sub.add_parser("evaluate", help="Pass@1 +- SEM and Pass@k of a model on an eval set")
    _add_run_target(p)
    p.add_argument("--model", default="base",
                   help="base, a checkpoint of the run, a local path, a store key or models:/swerl-agent@champion")
    p.add_argument("--tasks", help="eval tasks.jsonl (default: the preset's eval set)")
    p.add_argument("--runs", type=int, help="independent runs (default eval.runs)")
    p.add_argument("--label", help="name of this evaluation in the run (default: the model)")
    p.set_defaults(func=cmd_evaluate)


# ---------------------------------------------------------------- promote, report
def cmd_promote(args: argparse.Namespace) -> int:
    import json

    from flows.registry_flows import promote

    _run_config(args)
    print(json.dumps(promote(**flow_kwargs(args), version=args.version, manual=args.manual, note=args.note),
                     indent=2, default=str))
    return 0


def add_promote(sub: SubParsers) -> None:
    p = sub.add_parser("promote", help="challenger -> champion if significantly better (paired test)")
    _add_run_target(p)
    p.add_argument("--version", help="registered version (default: the run's newest)")
    p.add_argument("--manual", action="store_true", help="promote regardless of the test (recorded as manual)")
    p.add_argument("--note", default="", help="why, for the record")
    p.set_defaults(func=cmd_promote)


def cmd_report(args: argparse.Namespace) -> int:
    from flows.registry_flows import report

    path, warning = report(args.run_id, args.preset, list(args.set))
    if warning:
        print(f"swerl: warning: {warning}", file=sys.stderr)
    print(path)
    return 0


def add_report(sub: SubParsers) -> None:
    p = sub.add_parser("report", help="rebuild a run's report (Markdown, PNG, report.json) from the store")
    p.add_argument("run_id")
    add_config_args(p, None)
    p.set_defaults(func=cmd_report)
