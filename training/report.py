"""Evaluation and end-of-run reports: JSON for machines, Markdown and PNG plots for people.

Two levels, both plain files in a local directory that the caller then puts into the store:

- one evaluation (`runs/{run_id}/eval/{label}/`): next to its report.json, a SWE-bench run
  report per run (`report-run{r}.json`, the twin of `predictions-run{r}.jsonl`), `report.md`,
  `pass1.png` (per-run shares and their mean ± SEM) and `projects.png`;
- one pipeline run (`runs/{run_id}/report/`): every evaluation side by side (Pass@1 ± SEM by
  checkpoint, resolve rate per project), the DAPO iterations, wall time and registry decisions.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from training.evaluation import swebench_report  # noqa: E402
from training.run import RunContext, stored_trajectories  # noqa: E402
from training.trajectory import Trajectory  # noqa: E402

COLORS = ["#8C8C8C", "#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B2", "#937860", "#DA8BC3"]
DPI = 110
ITERATION_KEYS = ["reward_mean_all", "resolved_rate", "format_error_rate", "mean_turns", "problems",
                  "groups_kept", "groups_dropped", "groups_over_batch", "clip_frac_high", "mismatch/kl_k3"]


def _color(i: int) -> str:
    return COLORS[i % len(COLORS)]


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _extra_pass_k(r: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in r.items() if k.startswith("pass@") and k != "pass@1"}


# ---------------------------------------------------------------- plots
def plot_pass1(evals: dict[str, dict[str, Any]], path: Path, title: str) -> Path:
    """Pass@1 per checkpoint: bar = mean over runs, error bar = SEM, dots = the single runs."""
    labels = list(evals)
    means = [evals[k]["pass@1"] for k in labels]
    sems = [evals[k]["sem"] for k in labels]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(labels) + 2), 4.2))
    xs = range(len(labels))
    ax.bar(xs, means, yerr=sems, capsize=8, width=0.6, color=[_color(i) for i in xs],
           error_kw={"elinewidth": 1.5, "ecolor": "black"}, zorder=2)
    for i, label in enumerate(labels):
        runs = evals[label].get("per_run") or []
        if len(runs) > 1:  # spread the dots a little so equal values stay countable
            offsets = [0.18 * ((j + 0.5) / len(runs) - 0.5) for j in range(len(runs))]
            # clip_on=False: a run at 0 sits on the axis and would otherwise be cut in half
            ax.scatter([i + o for o in offsets], runs, s=12, color="black", alpha=0.55, zorder=3,
                       clip_on=False, label="single run" if i == 0 else None)
    top = max([m + s for m, s in zip(means, sems)] + [max(evals[k].get("per_run") or [0]) for k in labels] + [0.05])
    # the numbers go under the bars: above them they collide with the run dots
    ax.set_xticks(list(xs), [f"{k}\n{m:.3f} ± {s:.3f}\n({evals[k]['n_tasks']} tasks × {evals[k]['n_runs']} runs)"
                             for k, m, s in zip(labels, means, sems)], fontsize=9)
    ax.set_ylabel("Pass@1 (mean over runs ± SEM)")
    ax.set_ylim(0, min(1.05, top * 1.25))
    ax.set_xlim(-0.8, len(labels) - 0.2)
    ax.grid(axis="y", alpha=0.3, zorder=0)
    if any(len(evals[k].get("per_run") or []) > 1 for k in labels):
        ax.legend(loc="upper left", fontsize=8)
    ax.set_title(title)
    return _save(fig, path)


def plot_projects(evals: dict[str, dict[str, Any]], path: Path, title: str) -> Path:
    """Resolve rate per eval project, one bar per checkpoint (horizontal: names stay readable)."""
    projects = sorted({p for r in evals.values() for p in r.get("by_project", {})})
    sizes = {p: max((r.get("project_sizes") or {}).get(p, 0) for r in evals.values()) for p in projects}
    n = max(len(evals), 1)
    height = 0.8 / n
    fig, ax = plt.subplots(figsize=(7.5, max(2.5, 0.35 * len(projects) * n + 1.5)))
    for i, (label, r) in enumerate(evals.items()):
        ys = [j - 0.4 + (i + 0.5) * height for j in range(len(projects))]  # centred on j, first on top
        vals = [r.get("by_project", {}).get(p, math.nan) for p in projects]
        ax.barh(ys, vals, height, label=label, color=_color(i))
        for y, v in zip(ys, vals):
            if not math.isnan(v):
                ax.text(v + 0.01, y, f"{v:.2f}", va="center", fontsize=7)
    ax.set_yticks(range(len(projects)),
                  [f"{p} (n={sizes[p]})" if sizes[p] else p for p in projects], fontsize=8)
    ax.invert_yaxis()  # alphabetical from the top
    ax.set_xlim(0, 1.1)
    ax.set_xlabel("resolve rate (mean over the project's tasks and runs)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    ax.set_title(title)
    return _save(fig, path)


def plot_iterations(iterations: list[dict[str, Any]], path: Path, title: str) -> Path | None:
    if not iterations:
        return None
    xs = list(range(1, len(iterations) + 1))

    def series(key: str) -> list[float]:
        return [it.get(key, math.nan) for it in iterations]

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for key, label in (("reward_mean_all", "reward mean"), ("resolved_rate", "resolved rate")):
        axes[0].plot(xs, series(key), marker="o", label=label)
    axes[0].set_title("reward and resolved rate")
    axes[0].legend(fontsize=8)
    axes[1].plot(xs, series("format_error_rate"), marker="o", color="#C44E52")
    axes[1].set_title("format-error rate")
    axes[2].plot(xs, series("mean_turns"), marker="o", color="#8172B2")
    axes[2].set_title("mean turns")
    # Fixed scales: rates and rewards on their whole range, so a flat line at 1.0 reads as
    # "every turn", not as a wiggle around an auto-zoomed 1.0; turns from 0.
    rewards = [v for v in series("reward_mean_all") if not math.isnan(v)]
    axes[0].set_ylim(min(rewards + [0.0]) - 0.05, max(rewards + [1.0]) + 0.05)
    axes[0].set_ylabel("per episode")
    axes[1].set_ylim(-0.02, 1.02)
    axes[1].set_ylabel("share of turns")
    axes[2].set_ylim(0, max([v for v in series("mean_turns") if not math.isnan(v)] + [1.0]) * 1.15)
    axes[2].set_ylabel("turns per episode")
    for ax in axes:
        ax.set_xlabel("DAPO iteration")
        ax.set_xticks(xs)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    return _save(fig, path)


def _turns(evals: dict[str, dict[str, Any]]) -> list[str]:
    keys = {k for r in evals.values() for k in (*(r.get("resolved_by_turn") or {}), *(r.get("format_errors_by_turn") or {}))}
    return sorted(keys, key=int)


def plot_turns(evals: dict[str, dict[str, Any]], path: Path, title: str) -> Path | None:
    """Per turn and checkpoint: resolved episodes that ended at that turn (share of graded
    episodes), and the format-error rate of that turn. None when no evaluation has turns."""
    turns = _turns(evals)
    if not turns:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    width = 0.8 / max(len(evals), 1)
    for i, (label, r) in enumerate(evals.items()):
        graded = max(r.get("episodes", 0) - r.get("errors", 0), 1)
        xs = [j + (i - (len(evals) - 1) / 2) * width for j in range(len(turns))]
        axes[0].bar(xs, [(r.get("resolved_by_turn") or {}).get(t, 0) / graded for t in turns], width,
                    color=_color(i), label=label, zorder=2)
        axes[1].bar(xs, [(r.get("format_errors_by_turn") or {}).get(t, 0.0) for t in turns], width,
                    color=_color(i), label=label, zorder=2)
    for ax, what in ((axes[0], "resolved at this turn / graded episodes"), (axes[1], "format-error rate")):
        ax.set_xticks(range(len(turns)), turns)
        ax.set_xlabel("turn")
        ax.set_ylabel(what)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    axes[1].set_ylim(0, 1.02)
    fig.suptitle(title)
    return _save(fig, path)


def turn_table(evals: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown: resolved episodes by the turn they ended at, and mean turns of resolved ones."""
    turns = [t for t in _turns(evals) if any((r.get("resolved_by_turn") or {}).get(t) for r in evals.values())]
    if not turns:
        return []
    lines = ["| model | " + "".join(f"resolved at turn {t} | " for t in turns) + "mean turns (resolved) |",
             "|" + " --- |" * (len(turns) + 2)]
    for label, r in evals.items():
        mean = r.get("mean_turns_resolved")
        lines.append(f"| {label} | " + "".join(f"{(r.get('resolved_by_turn') or {}).get(t, 0)} | " for t in turns)
                     + (f"{mean:.2f} |" if mean is not None else "- |"))
    return lines


# ---------------------------------------------------------------- one evaluation
# (title, rates key, sizes key) of each per-group breakdown an evaluation report carries
BREAKDOWNS = (("project", "by_project", "project_sizes"),
              ("difficulty / hint level", "by_difficulty", "difficulty_sizes"),
              ("modifier", "by_modifier", "modifier_sizes"))


def breakdowns(r: dict[str, Any]) -> list[tuple[str, list[tuple[str, float, int | None]]]]:
    """Each breakdown with something to say, as (title, [(group, rate, graded tasks)]).

    A breakdown whose only group is `n/a` (tasks that carry no such field) says nothing and is
    left out; reports written before a breakdown existed simply lack it.
    """
    out = []
    for title, key, sizes_key in BREAKDOWNS:
        rates, sizes = r.get(key) or {}, r.get(sizes_key) or {}
        if rates and set(rates) != {"n/a"}:
            out.append((title, [(g, v, sizes.get(g)) for g, v in rates.items()]))
    return out


def _statuses(r: dict[str, Any]) -> str:
    counts = r.get("statuses") or {}
    text = ", ".join(f"{k} {v}" for k, v in counts.items())
    if "empty_patches" in r:
        text += f"; empty patch {r['empty_patches']}"
    return text


def eval_text(r: dict[str, Any], ks: list[int] | None = None) -> str:
    """One evaluation for a terminal: Pass@1 ± SEM, Pass@k, verdict counts and the breakdowns.

    `ks` are the configured k: a k with fewer graded samples per task than k has no unbiased
    estimate, and says so instead of vanishing from the printout.
    """
    per_run = r.get("per_run") or []
    lines = [f"evaluation `{r.get('label')}` of {r.get('policy')} (run {r.get('run_id')}): "
             f"{r['n_tasks']} tasks x {r['n_runs']} runs, eval set {r.get('dataset_hash')}",
             f"  Pass@1  {r['pass@1']:.3f} ± {r['sem']:.3f}  (mean ± SEM over {len(per_run)} runs; "
             f"per run {', '.join(f'{x:.3f}' for x in per_run)})"]
    extra = _extra_pass_k(r)
    for k in sorted({int(k[5:]) for k in extra} | {k for k in ks or [] if k != 1}):
        v = extra.get(f"pass@{k}")
        lines.append(f"  Pass@{k:<2} {v:.3f}" if v is not None else
                     f"  Pass@{k:<2} n/a (needs {k} graded runs of a task)")
    lines.append(f"  episodes {r.get('episodes', 0)}: {_statuses(r)}"
                 + (f"; ungraded tasks: {', '.join(r['ungraded'])}" if r.get("ungraded") else ""))
    lines.append(f"  format-error rate per turn {r.get('format_error_rate', 0.0):.3f}; exit reasons: "
                 + ", ".join(f"{k} {v}" for k, v in (r.get("exit_reasons") or {}).items()))
    if r.get("resolved_by_turn"):
        mean = r.get("mean_turns_resolved")
        lines.append("  resolved by turn " + ", ".join(f"{t}: {n}" for t, n in r["resolved_by_turn"].items())
                     + (f"; mean turns of resolved {mean:.2f}" if mean is not None else ""))
    tables = breakdowns(r)
    width = max([20] + [len(title) + 2 for title, _ in tables] + [len(g) + 2 for _, rows in tables for g, _, _ in rows])
    for title, rows in tables:
        lines.append(f"  by {title}".ljust(4 + width) + f"{'rate':>5}  {'tasks':>5}")
        lines += [f"    {g:<{width}}{v:5.3f}  {'' if n is None else n:>5}" for g, v, n in rows]
    return "\n".join(lines)


def eval_markdown(report: dict[str, Any], images: list[str]) -> str:
    r = report
    graded = r.get("episodes", 0) - r.get("errors", 0)
    lines = [f"# Evaluation `{r.get('label')}` of `{r.get('policy')}` (run `{r.get('run_id')}`)", "",
             f"**Pass@1 {r['pass@1']:.3f} ± {r['sem']:.3f}** (mean ± SEM over {len(r.get('per_run') or [])} "
             f"of {r['n_runs']} runs, {r['n_tasks']} tasks, eval set `{r.get('dataset_hash')}`)", ""]
    for k, v in _extra_pass_k(r).items():
        lines.append(f"- {k}: {v:.3f}")
    lines += [f"- per run: {', '.join(f'{x:.3f}' for x in r.get('per_run') or [])}",
              f"- episodes: {r.get('episodes', 0)}, graded {graded}, infra errors {r.get('errors', 0)}"
              + (f" (ungraded tasks: {', '.join(r['ungraded'])})" if r.get("ungraded") else ""),
              *([f"- verdicts: {_statuses(r)}"] if r.get("statuses") else []),
              f"- format-error rate per turn: {r.get('format_error_rate', 0.0):.3f}",
              f"- exit reasons: {', '.join(f'{k} {v}' for k, v in (r.get('exit_reasons') or {}).items())}"]
    table = turn_table({r.get("label") or "eval": r})
    lines += ["", *table] if table else []
    for title, rows in breakdowns(r):
        lines += ["", f"| {title} | tasks | resolve rate |", "| --- | --- | --- |"]
        lines += [f"| {g} | {'' if n is None else n} | {v:.3f} |" for g, v, n in rows]
    lines += [""] + [f"![{Path(p).stem}]({Path(p).name})" for p in images]
    return "\n".join(lines) + "\n"


def write_eval_outputs(out_dir: Path, report: dict[str, Any], trajectories: list[Trajectory]) -> list[Path]:
    """Everything people and SWE-bench tools read about one evaluation, next to its report.json.

    `trajectories` are the evaluation's episodes (sample_index = run); they give the per-run
    SWE-bench reports. Returns the files written.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    label = report.get("label") or "eval"
    model = f"swerl/{report.get('run_id')}/{report.get('policy')}"
    task_ids = sorted([*report["per_task"], *report.get("ungraded", [])])
    files = []
    for r in range(report["n_runs"]):
        path = out_dir / f"report-run{r}.json"
        path.write_text(json.dumps(swebench_report(trajectories, task_ids, model, r), indent=2))
        files.append(path)
    evals = {label: report}
    images = [plot_pass1(evals, out_dir / "pass1.png", f"Pass@1 of {label} ({report.get('policy')})"),
              plot_projects(evals, out_dir / "projects.png", f"Resolve rate per project: {label}")]
    images += [p for p in [plot_turns(evals, out_dir / "turns.png", f"Per turn: {label}")] if p]
    md = out_dir / "report.md"
    md.write_text(eval_markdown(report, [str(p) for p in images]))
    return [*files, *images, md]


def publish_eval(ctx: RunContext, label: str, trajectories: list[Trajectory] | None = None,
                 report: dict[str, Any] | None = None) -> list[Path]:
    """Write one evaluation's outputs and put them next to its report.json in the store.

    What is not passed is read back from the store (the
    report, the evaluation's episodes), so a report can be rebuilt long after the run; passing
    both lets the evaluation write these before its report.json, which marks it finished.
    """
    prefix = ctx.key("eval", label)
    if report is None:
        report = ctx.store.get_json(f"{prefix}/report.json")
    if trajectories is None:
        trajectories = stored_trajectories(ctx, f"eval-{label}/")
    files = write_eval_outputs(ctx.work / "eval" / label, report, trajectories)
    for f in files:
        ctx.store.put_file(f, f"{prefix}/{f.name}")
    return files


# ---------------------------------------------------------------- one pipeline run
def report_json(preset: str, run_id: str, evals: dict[str, dict[str, Any]], iterations: list[dict[str, Any]],
                wall_time_s: dict[str, float], registry: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "preset": preset,
        "run_id": run_id,
        "eval": {label: {"pass@1": r["pass@1"], "sem": r["sem"], "n_tasks": r["n_tasks"], "n_runs": r["n_runs"],
                         "errors": r.get("errors", 0), "policy": r.get("policy"),
                         "dataset_hash": r.get("dataset_hash"), "per_run": r.get("per_run", []),
                         "by_project": r.get("by_project", {}), "project_sizes": r.get("project_sizes", {}),
                         "episodes": r.get("episodes", 0),
                         "resolved_by_turn": r.get("resolved_by_turn", {}),
                         "mean_turns_resolved": r.get("mean_turns_resolved"),
                         "format_errors_by_turn": r.get("format_errors_by_turn", {}),
                         **_extra_pass_k(r)}
                 for label, r in evals.items()},
        "dapo_iterations": iterations,
        "wall_time_s": {**wall_time_s, "total": sum(wall_time_s.values())},
        "registry": registry or [],
    }


def markdown(report: dict[str, Any], images: list[str]) -> str:
    ks = sorted({k for r in report["eval"].values() for k in _extra_pass_k(r)}, key=lambda k: int(k[5:]))
    lines = [f"# swerl run `{report['run_id']}` (preset `{report['preset']}`)", "",
             "| model | policy | Pass@1 | SEM | " + "".join(f"{k} | " for k in ks) + "tasks | runs | errors |",
             "|" + " --- |" * (7 + len(ks))]
    for label, r in report["eval"].items():
        extra = "".join(f"{r[k]:.3f} | " if k in r else "- | " for k in ks)
        lines.append(f"| {label} | {r.get('policy')} | {r['pass@1']:.3f} | {r['sem']:.3f} | {extra}"
                     f"{r['n_tasks']} | {r['n_runs']} | {r['errors']} |")
    table = turn_table(report["eval"])
    lines += ["", *table] if table else []
    if report.get("registry"):
        lines += ["", "| registered version | policy | eval | promotion | p-value | reason |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for v in report["registry"]:
            lines.append(f"| {v['version']} | {v.get('policy', '')} | {v.get('label', '')} | "
                         f"{v.get('decision') or 'undecided'} | {v.get('p_value') or '-'} | {v.get('reason', '')} |")
    lines += ["", "| stage | wall time (s) |", "| --- | --- |"]
    lines += [f"| {k} | {v:.0f} |" for k, v in report["wall_time_s"].items()]
    if report["dapo_iterations"]:
        lines += ["", "| iteration | " + " | ".join(ITERATION_KEYS) + " |", "|" + " --- |" * (len(ITERATION_KEYS) + 1)]
        for i, it in enumerate(report["dapo_iterations"], 1):
            lines.append(f"| {i} | " + " | ".join(f"{it[k]:.3g}" if k in it else "-" for k in ITERATION_KEYS) + " |")
    lines += [""] + [f"![{Path(p).stem}]({Path(p).name})" for p in images]
    return "\n".join(lines) + "\n"


def write_report(out_dir: Path, preset: str, run_id: str, evals: dict[str, dict[str, Any]],
                 iterations: list[dict[str, Any]], wall_time_s: dict[str, float],
                 registry: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Write report.json, report.md and the plots into `out_dir`; return report.json's content."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rep = report_json(preset, run_id, evals, iterations, wall_time_s, registry)
    images: list[Path] = []
    if evals:
        images += [plot_pass1(evals, out_dir / "pass1.png", f"Pass@1 on the held-out eval set ({preset})"),
                   plot_projects(evals, out_dir / "projects.png", "Resolve rate per eval project")]
        images += [p for p in [plot_turns(evals, out_dir / "turns.png", "Per turn, on the held-out eval set")] if p]
    it_png = plot_iterations(iterations, out_dir / "iterations.png", "DAPO iterations")
    if it_png:
        images.append(it_png)
    (out_dir / "report.json").write_text(json.dumps(rep, indent=2))
    (out_dir / "report.md").write_text(markdown(rep, [str(p) for p in images]))
    return rep
