"""Measure what gives the default 135M policy a learnable signal (docs/DEMO.md has the results).

Runs the real machinery (SWEEnv in Docker, `training.rollout.collect`, the HF backend,
`training.rft.train`) on TRAIN-project tasks only, with one prompt variant at a time, and writes
a summary JSON per run. Eval projects are refused: settings are chosen without looking at them.

    measure  N samples of each task with one variant; resolved / format-error rates, tokens, speed
    quick    first turn only, no grading: does the block, merged into the named file, equal the
             gold fix? A cheap proxy to rank prompt variants before `measure` confirms them
    rft      fine-tune on the resolved episodes of earlier runs (the RFT stage's recipe)
    tasks    list the tasks a --tasks spec selects

Examples:
    python scripts/demo_probe.py measure --tasks .swerl/store --projects inflection,toolz \\
        --variant short-src --samples 4 --max-turns 1 --out /tmp/demo/short-src
    python scripts/demo_probe.py rft --runs /tmp/demo/collect --out /tmp/demo/rft-ckpt
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from environments import prompts  # noqa: E402
from environments.records import TaskInstance, at_hint_level, load_tasks  # noqa: E402
from swerl.config import EnvironmentConfig, SFTConfig  # noqa: E402

log = logging.getLogger("demo_probe")
EVAL_SPLIT = "eval"


@dataclass(frozen=True)
class Variant:
    style: prompts.PromptStyle
    show_source: bool
    one_shot: bool
    action_format: str = "tools+file"


VARIANTS = {
    "full": Variant("full", False, False),
    "full-demo": Variant("full", False, True),
    "full-src": Variant("full", True, False),
    "short": Variant("short", False, False),
    "short-src": Variant("short", True, False),
    "short-src-demo": Variant("short", True, True),
    "line": Variant("line", True, False),
    "line-demo": Variant("line", True, True),
}


# ---------------------------------------------------------------- tasks
def load_task_spec(spec: str, projects: set[str] | None, hint: int | None, limit_per_project: int | None,
                   seed: int = 0, max_lines: int | None = None, exclude: set[str] | None = None,
                   skip_modifiers: set[str] | None = None) -> list[TaskInstance]:
    """Tasks from a tasks.jsonl, or every curated project under a store directory
    (`curation/synth/*/*.json`); eval-split tasks are never returned."""
    path = Path(spec)
    tasks: list[TaskInstance] = []
    if path.is_file():
        tasks = load_tasks(path).tasks
    else:
        seen: set[str] = set()
        for f in sorted(path.glob("curation/synth/*/*.json")):
            for d in json.loads(f.read_text())["tasks"]:
                if d["instance_id"] not in seen:
                    seen.add(d["instance_id"])
                    tasks.append(TaskInstance.from_dict(d))
    tasks = [t for t in tasks if t.split != EVAL_SPLIT]
    if projects:
        tasks = [t for t in tasks if t.project in projects]
    if exclude:
        tasks = [t for t in tasks if t.project not in exclude]
    if skip_modifiers:
        tasks = [t for t in tasks if not set(str(t.meta.get("modifier", "")).split("+")) & skip_modifiers]
    if hint is not None:
        tasks = [u for u in (at_hint_level(t, hint) for t in tasks) if u.meta.get("hint_level") == hint]
    if max_lines:
        tasks = [t for t in tasks if (function_lines(t) or 10**9) <= max_lines]
    if limit_per_project:
        rng = random.Random(seed)
        by: dict[str, list[TaskInstance]] = {}
        for t in sorted(tasks, key=lambda t: t.instance_id):
            by.setdefault(t.project, []).append(t)
        tasks = [t for p in sorted(by) for t in rng.sample(by[p], min(limit_per_project, len(by[p])))]
    return tasks


def sdist_file(task: TaskInstance, path: str) -> str | None:
    """A file of the project as released (the gold state), from the cached sdist."""
    import tarfile

    from swerl.paths import swerl_home

    for tarball in (swerl_home() / "sdists" / f"{task.project}-{task.version}").glob("*.tar.gz"):
        with tarfile.open(tarball) as tar:
            member = next((m for m in tar.getmembers() if m.name.split("/", 1)[-1] == path), None)
            return tar.extractfile(member).read().decode() if member else None
    return None


def gold_function(task: TaskInstance) -> tuple[str, int, int] | None:
    """(dedented source, first line, last line) of the bug's function as released, from the
    project's cached sdist; None when it cannot be found."""
    import textwrap

    from environments.source_view import locate

    site = (task.meta.get("mutations") or [{}])[0]
    source = sdist_file(task, site.get("path", ""))
    where = locate(source, site["function"]) if source is not None else None
    if where is None:
        return None
    return textwrap.dedent("\n".join(source.split("\n")[where[0] - 1:where[1]])), where[0], where[1]


@dataclass(frozen=True)
class LineBug:
    """A one-line bug as the level-4 probes show it: the function with the bug, docstring hidden."""

    path: str
    function: str  # the name shown and rewritten (a nested function's enclosing def)
    gold_line: str
    bug_line: str
    gold_code: str
    shown: str
    first: int
    last: int


def line_bug(task: TaskInstance) -> LineBug | None:
    """None for a bug that is not a one-line change or whose function is not in the sdist."""
    from environments.hints import changed_line
    from environments.source_view import enclosing, without_docstring

    site, line, gold = task.meta["mutations"][0], changed_line(task.meta.get("bug_patch") or ""), gold_function(task)
    if line is None or gold is None:
        return None
    code, first, last = gold
    shown = without_docstring(code.replace(line[0], line[1], 1))[0]
    return LineBug(site["path"], enclosing(site["function"]), line[0], line[1], code, shown, first, last)


def first_replies(backend, prompts_: list[list[int]], samples: int, sampling) -> list[str]:
    """`samples` decoded first replies per prompt (prompt-major), 16 at a time, seeded by index."""
    ids = [p for p in prompts_ for _ in range(samples)]
    out = []
    for s in range(0, len(ids), 16):
        out += backend.generate_rows(ids[s:s + 16], sampling, list(range(s, min(s + 16, len(ids)))))
    return [backend.tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in out]


def function_lines(task: TaskInstance) -> int | None:
    """Code lines (docstring excluded) of the bug's function."""
    from environments.source_view import without_docstring

    gold = gold_function(task)
    return None if gold is None else len(without_docstring(gold[0])[0].strip().split("\n"))


def with_images(tasks: list[TaskInstance]) -> list[TaskInstance]:
    from environments.images import ensure_images

    ready = []
    for t in tasks:
        try:
            t.image = ensure_images([t], progress=lambda line: None)[t.instance_id]
            ready.append(t)
        except Exception as e:  # noqa: BLE001 - one broken image must not stop a probe
            log.error("skipping %s: image build failed: %s", t.instance_id, str(e)[-300:])
    return ready


# ---------------------------------------------------------------- measure
def load_avg() -> float:
    return round(os.getloadavg()[0], 1)


def measure(args: argparse.Namespace) -> dict:
    from environments.swe_env import SWEEnv
    from environments.verdicts import VERDICTS as _VERDICTS
    from swerl.store import Store
    from training.agent import AgentLimits
    from training.inference.base import SamplingParams
    from training.inference.hf import HFBackend
    from training.rollout import RolloutSpec, TrajectorySink, collect

    v = VARIANTS[args.variant]
    tasks = with_images(load_task_spec(args.tasks, _set(args.projects), args.hint, args.per_project, args.seed,
                               args.max_lines, _set(args.exclude), _set(args.skip_modifiers)))
    if not tasks:
        raise SystemExit("no tasks selected")
    env_cfg = EnvironmentConfig(command_timeout_s=20, test_timeout_s=180)
    backend = HFBackend(args.model, seed=args.seed, threads=args.threads)
    spec = RolloutSpec(limits=AgentLimits(args.max_turns, args.max_context, args.max_new_tokens),
                       sampling=SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                                               seed=args.seed, stop_at_block=args.stop_at_block),
                       action_format=v.action_format, window=env_cfg.window, one_shot=v.one_shot,
                       concurrency=args.concurrency, prompt_style=v.style, show_source=v.show_source)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    store = Store(f"file://{out.resolve()}/store")
    load0 = load_avg()
    stats = collect(tasks, args.samples, backend,
                    lambda task: SWEEnv(task, env_cfg, v.action_format, prompt_style=v.style,
                                        show_source=v.show_source, observation_max_chars=3000),
                    spec, lambda t: float(t.status == "resolved"), TrajectorySink(store, "rollouts"),
                    progress=not args.quiet)
    trajs = stats.trajectories
    summary = stats.summary()
    per_task = {t.instance_id: sum(x.status == "resolved" for x in trajs if x.task_id == t.instance_id)
                for t in tasks}
    result = {
        "variant": args.variant, **vars(v), "model": args.model, "stop_at_block": args.stop_at_block, "hint": args.hint, "max_turns": args.max_turns,
        "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "samples": args.samples,
        "tasks": len(tasks), "projects": sorted({t.project for t in tasks}),
        "resolved": sum(per_task.values()), "episodes": len(trajs),
        "resolved_rate": summary["resolved_rate"], "format_error_rate": summary["format_error_rate"],
        "first_turn_format_error_rate": _mean([t.turns[0].format_error for t in trajs if t.turns]),
        "error_rate": summary["error_rate"], "mean_turns": summary["mean_turns"],
        "gen_tokens_per_episode": _mean([sum(len(x.token_ids) for x in t.turns) for t in trajs]),
        "prompt_tokens": _mean([len(t.prompt_token_ids) for t in trajs]),
        "nonempty_patch_rate": _mean([bool((t.patch or "").strip()) for t in trajs]),
        "episodes_per_min": summary["episodes_per_min"], "wall_s": summary["wall_s"],
        "gen_time_s": summary["gen_time_s"], "grade_time_s": summary["grade_time_s"],
        "gen_tokens_per_s": summary["gen_tokens_per_s"], "verdict_cache_hits": _VERDICTS.hits,
        "tasks_solved_at_least_once": sum(c > 0 for c in per_task.values()), "per_task": per_task,
        "load_avg_start": load0, "load_avg_end": load_avg(), "cpus": os.cpu_count(),
    }
    (out / "summary.json").write_text(json.dumps(result, indent=1))
    with open(out / "samples.txt", "w") as f:
        for t in trajs[: 3 * len(tasks)]:
            f.write(f"=== {t.task_id}#{t.sample_index} {t.status} {t.exit_reason}\n")
            for turn in t.turns:
                f.write(f"--- turn (format_error={turn.format_error})\n{turn.text}\n")
            f.write(f"--- patch\n{t.patch}\n")
    print(json.dumps({k: v for k, v in result.items() if k != "per_task"}, indent=1))
    return result


def _mean(xs: list) -> float:
    return round(sum(xs) / len(xs), 4) if xs else 0.0


def _set(csv: str | None) -> set[str] | None:
    return {x.strip() for x in csv.split(",") if x.strip()} if csv else None


# ---------------------------------------------------------------- quick
def quick(args: argparse.Namespace) -> dict:
    """Sample the first turn only and check it offline against the gold fix (see module doc)."""
    from environments.source_view import named_function
    from environments.swe_env import SWEEnv
    from training.agent import build_messages
    from training.chat import ChatFormat
    from training.inference.base import SamplingParams
    from training.inference.hf import HFBackend

    v = VARIANTS[args.variant]
    tasks = [t for t in load_task_spec(args.tasks, _set(args.projects), args.hint, args.per_project, args.seed,
                               args.max_lines, _set(args.exclude), _set(args.skip_modifiers))
             if named_function(t)]
    tasks = with_images(tasks)
    backend = HFBackend(args.model, seed=args.seed, threads=args.threads)
    chat = ChatFormat.from_tokenizer(backend.tokenizer)
    env_cfg = EnvironmentConfig(command_timeout_s=20)
    rows, t0, gen_tokens, cases = [], time.monotonic(), 0, []
    for task in tasks:  # the first observation, the named file, and that file with the gold fix
        path = named_function(task)[0]
        with SWEEnv(task, env_cfg, v.action_format, prompt_style=v.style, show_source=v.show_source) as env:
            first = env.reset()
            buggy = env.sandbox.read_file(path)
            env.sandbox.write_file("/tmp/gold.patch", task.patch)
            res = env.sandbox.exec("git apply /tmp/gold.patch")
            if res.exit_code != 0:
                raise RuntimeError(f"{task.instance_id}: gold patch does not apply: {res.output[:300]}")
            gold = code_ast(env.sandbox.read_file(path))
        ids = chat.prompt_ids(build_messages(first, v.action_format, env_cfg.window, v.one_shot, v.style,
                                             v.show_source))
        if args.prefix:  # the reply starts with these tokens, given, not sampled
            ids = ids + backend.tokenizer.encode(args.prefix, add_special_tokens=False)
        cases += [(task, buggy, gold, ids, args.seed * 1000 + i) for i in range(args.samples)]
    sp = chat.sampling(SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens))
    outs = []
    for s in range(0, len(cases), 16):  # one batched call per 16 samples, as the rollout engine batches
        part = cases[s:s + 16]
        outs += backend.generate_rows([c[3] for c in part], sp, [c[4] for c in part])
    for (task, buggy, gold, ids, _), c in zip(cases, outs):
        text = (args.prefix or "") + chat.decode(c.token_ids)
        gen_tokens += len(c.token_ids)
        row = {"task": task.instance_id, "tokens": len(c.token_ids), "text": text}
        # strict: the reply as the parser takes it; first_block: as if sampling stopped at the
        # end of the first fenced block (what a stop string would do)
        for name, reply in (("strict", text), ("first_block", first_block(text))):
            row[name] = judge_reply(reply, buggy, gold, v.action_format)
        rows.append(row)
    wall = time.monotonic() - t0
    n = max(len(rows), 1)
    result = {
        "variant": args.variant, "prefix": args.prefix, "temperature": args.temperature, "hint": args.hint,
        "tasks": len(tasks), "samples": args.samples,
    }
    for mode in ("strict", "first_block"):
        kinds = [r[mode][0] for r in rows]
        result[mode] = {
            "fixed_rate": round(sum(r[mode][1] for r in rows) / n, 4),
            "tasks_fixed_at_least_once": len({r["task"] for r in rows if r[mode][1]}),
            **{f"{k}_rate": round(kinds.count(k) / n, 4) for k in ("rewrite", "rewrite_refused", "format_error")},
        }
    result.update({
        "prompt_tokens": _mean([len(c[3]) for c in cases]), "gen_tokens_per_sample": gen_tokens / n, "wall_s": round(wall, 1),
        "gen_tokens_per_s": round(gen_tokens / wall, 1), "load_avg_end": load_avg(),
    })
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "quick.json").write_text(json.dumps(result, indent=1))
    (out / "quick_tasks.json").write_text(json.dumps({c[0].instance_id: {"buggy": c[1], "gold": c[2]} for c in cases}))
    (out / "quick_samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(json.dumps(result, indent=1))
    return result


def first_block(text: str) -> str:
    """The reply cut after its first complete fenced block."""
    from environments.actions import FENCE as _FENCE

    m = _FENCE.search(text)
    return text[:m.end()] if m else text


def judge_reply(reply: str, buggy: str, gold: str, action_format: str) -> tuple[str, bool]:
    """(what the reply is, whether merging it into the buggy file gives the gold file's code)."""
    from environments.actions import parse_action
    from environments.rewrite import MergeError, merge_code

    action = parse_action(reply, action_format)
    kind = getattr(action, "kind", "format_error")
    if kind != "rewrite":
        return kind, False
    try:
        return kind, code_ast(merge_code(buggy, action.text).text) == gold
    except (MergeError, SyntaxError):
        return "rewrite_refused", False


def code_ast(source: str) -> str:
    """The module's AST without docstrings: a fix that drops a docstring is still the fix."""
    import ast

    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and len(body) > 1 and isinstance(body[0], ast.Expr) \
                and isinstance(getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:]
    return ast.dump(tree)


# ---------------------------------------------------------------- rft
def strip_demo(traj, tokenizer):
    """The trajectory with the one-shot demonstration cut out of its prompt.

    Why: the demo helps the base policy act during RFT data collection, but the trained policy is
    run (and evaluated) without it; the prompt is context only (no loss), so re-rendering it
    changes no trained token.
    """
    system = [{"role": "system", "content": "S"}]
    render = functools.partial(tokenizer.apply_chat_template, tokenize=False)
    demo_text = render(system + _DEMO(**traj.meta["demo_args"]))[len(render(system)):]
    text = tokenizer.decode(traj.prompt_token_ids)
    if demo_text not in text:
        raise ValueError(f"{traj.key}: the demonstration is not in its prompt")
    traj.prompt_token_ids = tokenizer.encode(text.replace(demo_text, "", 1), add_special_tokens=False)
    return traj


def rft(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    from swerl.model_cache import resolve_model
    from training import rft as rft_lib
    from training.trajectory import Trajectory

    trajs = []
    for run in args.runs.split(","):
        summary = json.loads((Path(run) / "summary.json").read_text())
        for f in sorted((Path(run) / "store" / "rollouts").glob("*.json")):
            t = Trajectory.from_json(f.read_text())
            if t.status == "resolved":
                t.meta["demo_args"] = {"action_format": summary["action_format"], "style": summary["style"],
                                       "show_source": summary["show_source"]} if summary["one_shot"] else None
                trajs.append(t)
    model = resolve_model(args.model)
    tok = AutoTokenizer.from_pretrained(model)
    if args.strip_demo:
        trajs = [strip_demo(t, tok) if t.meta.get("demo_args") else t for t in trajs]
    if args.per_task:
        by: dict[str, list] = {}
        for t in trajs:
            by.setdefault(t.task_id, []).append(t)
        trajs = [t for ts in by.values() for t in ts[: args.per_task]]
    log.info("RFT on %d resolved trajectories from %d tasks", len(trajs), len({t.task_id for t in trajs}))
    cfg = SFTConfig(lr=args.lr, batch_size=args.batch_size, epochs=args.epochs, dtype=args.dtype,
                      micro_batch_tokens=args.micro_batch_tokens, gradient_checkpointing=False)
    t0 = time.monotonic()
    path = rft_lib.train(trajs, model, cfg, args.out, seed=args.seed)
    print(json.dumps({"checkpoint": str(path), "trajectories": len(trajs), "train_s": round(time.monotonic() - t0, 1),
                      "load_avg": load_avg()}))


# ---------------------------------------------------------------- cli
def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    def task_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--tasks", required=True, help="tasks.jsonl or a store dir with curation/synth/")
        p.add_argument("--projects", help="comma-separated train projects to use")
        p.add_argument("--hint", type=int, help="re-state every task at this hint level (0-4); tasks without it are left out")
        p.add_argument("--per-project", type=int, help="at most this many tasks per project (seeded)")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--max-lines", type=int, help="only bugs in functions of at most this many code lines")
        p.add_argument("--exclude", help="comma-separated projects to leave out")
        p.add_argument("--skip-modifiers", help="comma-separated bug kinds to leave out (e.g. drop_statement)")

    m = sub.add_parser("measure")
    task_args(m)
    m.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    m.add_argument("--samples", type=int, default=4)
    m.add_argument("--max-turns", type=int, default=1)
    m.add_argument("--max-new-tokens", type=int, default=256)
    m.add_argument("--max-context", type=int, default=4096)
    m.add_argument("--temperature", type=float, default=1.0)
    m.add_argument("--concurrency", type=int, default=8)
    m.add_argument("--threads", type=int, default=None)
    m.add_argument("--model", default="default")
    m.add_argument("--out", required=True)
    m.add_argument("--quiet", action="store_true")
    m.add_argument("--stop-at-block", action="store_true", help="end each reply where its first block closes")

    q = sub.add_parser("quick")
    task_args(q)
    q.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    q.add_argument("--samples", type=int, default=8)
    q.add_argument("--max-new-tokens", type=int, default=256)
    q.add_argument("--temperature", type=float, default=1.0)
    q.add_argument("--threads", type=int, default=None)
    q.add_argument("--model", default="default")
    q.add_argument("--out", required=True)
    q.add_argument("--prefix", default="", help="text the reply starts with (given, not sampled)")

    r = sub.add_parser("rft")
    r.add_argument("--runs", required=True, help="comma-separated `measure` output dirs")
    r.add_argument("--model", default="default")
    r.add_argument("--out", required=True)
    r.add_argument("--lr", type=float, default=2e-5)
    r.add_argument("--epochs", type=int, default=2)
    r.add_argument("--batch-size", type=int, default=8)
    r.add_argument("--dtype", default="bfloat16")
    r.add_argument("--micro-batch-tokens", type=int, default=4096)
    r.add_argument("--per-task", type=int, default=0, help="at most this many trajectories per task")
    r.add_argument("--strip-demo", action="store_true")
    r.add_argument("--seed", type=int, default=0)

    t = sub.add_parser("tasks")
    task_args(t)

    args = ap.parse_args()
    if args.cmd == "measure":
        measure(args)
    elif args.cmd == "quick":
        quick(args)
    elif args.cmd == "rft":
        rft(args)
    else:
        for task in load_task_spec(args.tasks, _set(args.projects), args.hint, args.per_project, args.seed,
                               args.max_lines, _set(args.exclude), _set(args.skip_modifiers)):
            print(task.instance_id, task.project, task.meta.get("modifier"), task.meta.get("functions"),
                  function_lines(task))


if __name__ == "__main__":
    main()
