"""`swerl` commands about tasks and datasets: grade, env shell, curate, dataset, validate.
Each `add_*` declares one command's arguments next to its handler."""

from __future__ import annotations

import argparse
import sys

from flows.cli_common import (
    SubParsers, add_config_args, add_run_args, flow_kwargs, load_cli_config, one_line, one_line_errors,
    tasks_with_images,
)
from swerl.config import DEFAULT_PRESET, ConfigError, SwerlConfig


# ---------------------------------------------------------------- grade
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


@one_line_errors
def cmd_grade(args: argparse.Namespace) -> int:
    """Exit 0 when at least one prediction got a verdict; bad prediction lines are listed."""
    import json
    import tempfile
    from pathlib import Path

    from environments.grading import grade_many
    from environments.predictions import read_predictions

    cfg = load_cli_config(args)
    with tempfile.TemporaryDirectory(prefix="swerl-grade-") as tmp:
        read = read_predictions(_local_file(cfg, args.predictions, tmp))
        for err in read.errors:
            print(f"swerl: skipping bad prediction at {err}", file=sys.stderr)
        tasks = {t.instance_id: t for t in tasks_with_images(_local_file(cfg, args.tasks, tmp))}
        report = grade_many(tasks, read.predictions, cfg.environment, workers=args.workers)
    report["invalid_predictions"] = read.errors
    Path(args.report).write_text(json.dumps(report, indent=2))
    print(f"resolved {report['resolved_instances']} / unresolved {report['unresolved_instances']} / "
          f"error {report['error_instances']}  (of {report['submitted_instances']} predictions, "
          f"{report['empty_patch_instances']} empty) -> {args.report}")
    for status in ("resolved", "unresolved"):
        if report[f"{status}_ids"]:
            print(f"  {status}: {' '.join(report[f'{status}_ids'])}")
    for iid in report["unresolved_ids"]:  # a patch outside the graded source says why
        if report["instances"].get(iid, {}).get("error_reason"):
            print(f"  unresolved {iid}: {report['instances'][iid]['error_reason'][:300]}")
    for iid in report["error_ids"]:
        print(f"  error {iid}: {report['instances'].get(iid, {}).get('error_reason', '')}")
    if read.errors:
        print(f"  {len(read.errors)} bad prediction line(s) skipped (listed above and in the report)")
    if not report["completed_instances"]:
        print("swerl: nothing was graded", file=sys.stderr)
        return 1
    return 0


def add_grade(sub: SubParsers) -> None:
    p = sub.add_parser("grade", help="grade SWE-bench-format predictions in fresh containers")
    add_config_args(p)
    p.add_argument("--tasks", required=True,
                   help="tasks.jsonl (SWE-bench format plus swerl fields): a path or a URL in the store")
    p.add_argument("--predictions", required=True,
                   help="predictions .jsonl/.json (instance_id, model_patch): a path or a URL in the store")
    p.add_argument("--report", default="report.json")
    p.add_argument("--workers", type=int, default=2)
    p.set_defaults(func=cmd_grade)


# ---------------------------------------------------------------- env shell
def cmd_env_shell(args: argparse.Namespace) -> int:
    from environments.env_shell import run_shell

    cfg = load_cli_config(args)
    tasks = [t for t in tasks_with_images(args.tasks) if t.instance_id == args.task_id] if args.tasks else []
    if not tasks:
        print(f"swerl: task {args.task_id} not found in {args.tasks}", file=sys.stderr)
        return 2
    run_shell(tasks[0], cfg.environment, cfg.rollout.action_format,
              observation_max_chars=cfg.rollout.observation_max_chars)
    return 0


def add_env(sub: SubParsers) -> None:
    p = sub.add_parser("env", help="the gym, by hand")
    esub = p.add_subparsers(dest="env_command", required=True)
    sh = esub.add_parser("shell", help="act as the agent on a task: type actions, see observations")
    add_config_args(sh)
    sh.add_argument("task_id")
    sh.add_argument("--tasks", required=True)
    sh.set_defaults(func=cmd_env_shell)


# ---------------------------------------------------------------- curate
def cmd_curate_synth(args: argparse.Namespace) -> int:
    import json

    from flows.curate import curate

    load_cli_config(args)
    out = curate(**flow_kwargs(args))
    for split in ("train", "eval"):
        d = out[split]
        print(f"{split}: {d['name']}@{d['hash']} {d['counts']['total']} tasks -> {d['uri']}")
        print("  by project : " + json.dumps(d["counts"]["by_project"]))
        print("  by modifier: " + json.dumps(d["counts"]["by_modifier"]))
    return 0


@one_line_errors
def cmd_curate_import(args: argparse.Namespace) -> int:
    """Import upstream rows, run the paper's filters on them (real containers), save what passes."""
    import json

    from environments.curation.dataset import save_dataset
    from environments.curation.filters import counts_line
    from environments.curation.importers import SOURCES, ImportSourceError
    from environments.curation.imported import import_and_filter
    from swerl.config import ImportSpec
    from swerl.store import open_store

    cfg = load_cli_config(args)
    if args.source not in SOURCES:
        print(f"swerl: curate import: unknown source {args.source!r} (known: {', '.join(SOURCES)})", file=sys.stderr)
        return 2
    try:
        spec = ImportSpec(source=args.source, path=args.source_path, repo_mirror=args.repo_mirror,
                          instance_ids_file=args.instance_ids, reruns=args.reruns)
        report, filtered = import_and_filter(spec, args.split, cfg.environment, workers=args.workers,
                                             progress=lambda line: print(line, file=sys.stderr))
    except (ImportSourceError, ValueError) as e:
        print(f"swerl: curate import: {one_line(e)}", file=sys.stderr)
        return 2
    for err in report.errors:
        print(f"swerl: skipped: {err}", file=sys.stderr)
    print(f"imported {len(report.tasks)} tasks ({len(report.errors)} unreadable)")
    print(counts_line(filtered))
    for name, dropped in filtered.dropped.items():
        for iid, why in dropped.items():
            print(f"  dropped by {name}: {iid}: {why[:300]}")
    if args.report:
        from pathlib import Path

        Path(args.report).write_text(json.dumps({"unreadable": report.errors, **filtered.summary()}, indent=2))
    if args.name and filtered.kept:
        ref = save_dataset(open_store(cfg.storage), args.name, filtered.kept,
                           {"import": spec.model_dump(), "filters": filtered.summary()["dropped_by"],
                            "unreadable": len(report.errors)})
        print(f"dataset {ref.name}@{ref.hash} -> {ref.uri}")
    return 0 if filtered.kept else 1


def add_curate(sub: SubParsers) -> None:
    p = sub.add_parser("curate", help="build datasets: synthesise from PyPI projects, or import SWE-bench files")
    csub = p.add_subparsers(dest="curate_command", required=True)
    syn = csub.add_parser("synth", help="synthesise validated tasks from the preset's projects (cached); a preset that "
                          "pins its datasets (data.*_hash) takes those: set them to null to synthesise")
    add_run_args(syn, DEFAULT_PRESET)
    syn.set_defaults(func=cmd_curate_synth)
    imp = csub.add_parser("import", help="import SWE-bench / SWE-rebench / SWE-Gym tasks (file or HF name)")
    add_config_args(imp)
    imp.add_argument("source_path", help="a .json/.jsonl/.parquet file or a Hugging Face dataset name")
    imp.add_argument("--source", required=True, help="swe-bench, swe-bench-lite, swe-bench-verified, swe-rebench, swe-gym")
    imp.add_argument("--repo-mirror", help="directory of bare mirrors named owner__name.git")
    imp.add_argument("--split", help="train or eval (default: by source)")
    imp.add_argument("--instance-ids", help="keep only these instances: a file with one instance id per line")
    imp.add_argument("--name", help="save the tasks that pass every filter as this dataset in the store")
    imp.add_argument("--reruns", type=int, default=1,
                     help="extra gold and empty runs per task for the determinism filter (default 1)")
    imp.add_argument("--workers", type=int, default=2, help="tasks validated at a time")
    imp.add_argument("--report", help="write the curation report (counts and reasons per filter) to this JSON file")
    imp.set_defaults(func=cmd_curate_import)


# ---------------------------------------------------------------- dataset
def cmd_dataset_ls(args: argparse.Namespace) -> int:
    from environments.curation.dataset import list_datasets
    from swerl.store import open_store

    for ref in list_datasets(open_store(load_cli_config(args).storage)):
        print(f"{ref.name:<24} {ref.hash}  {ref.counts.get('total', '?'):>5} tasks  {ref.uri}")
    return 0


def cmd_dataset_show(args: argparse.Namespace) -> int:
    import json

    from environments.curation.dataset import dataset_manifest
    from swerl.store import open_store

    print(json.dumps(dataset_manifest(open_store(load_cli_config(args).storage), args.name, args.hash), indent=2))
    return 0


def cmd_dataset_ship(args: argparse.Namespace) -> int:
    from environments.curation.dataset import latest_hash, ship_dataset
    from swerl.store import open_store

    store = open_store(load_cli_config(args).storage)
    digest = args.hash or latest_hash(store, args.name)
    path = ship_dataset(store, args.name, digest)
    print(f"{args.name}@{digest} -> {path} ({path.stat().st_size / 1e6:.2f} MB); a config pins it with "
          f"data.train_hash or data.eval_hash: {digest}")
    return 0


def add_dataset(sub: SubParsers) -> None:
    p = sub.add_parser("dataset", help="browse datasets in the store")
    dsub = p.add_subparsers(dest="dataset_command", required=True)
    ls = dsub.add_parser("ls")
    add_config_args(ls)
    ls.set_defaults(func=cmd_dataset_ls)
    show = dsub.add_parser("show")
    add_config_args(show)
    show.add_argument("name")
    show.add_argument("--hash")
    show.set_defaults(func=cmd_dataset_show)
    ship = dsub.add_parser("ship", help="copy a stored dataset to data/datasets/ (for data.*_hash pins)")
    add_config_args(ship)
    ship.add_argument("name")
    ship.add_argument("--hash", help="default: the newest")
    ship.set_defaults(func=cmd_dataset_ship)


# ---------------------------------------------------------------- validate
def cmd_validate(args: argparse.Namespace) -> int:
    import json
    import random

    from environments.curation.validate import validate_tasks
    from environments.records import load_tasks

    cfg = load_cli_config(args)
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


def add_validate(sub: SubParsers) -> None:
    p = sub.add_parser("validate", help="gold resolves, empty does not, FAIL_TO_PASS fail before")
    add_config_args(p)
    p.add_argument("--tasks", required=True)
    p.add_argument("--sample", type=int, help="validate a random sample of this many tasks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.set_defaults(func=cmd_validate)
