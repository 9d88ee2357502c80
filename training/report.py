"""The end-of-run report: report.json for machines, Markdown and PNG plots for people."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def report_json(preset: str, run_id: str, evals: dict[str, dict[str, Any]], iterations: list[dict[str, Any]],
                wall_time_s: dict[str, float]) -> dict[str, Any]:
    return {
        "preset": preset,
        "run_id": run_id,
        "eval": {label: {"pass@1": r["pass@1"], "sem": r["sem"], "n_tasks": r["n_tasks"], "n_runs": r["n_runs"],
                         "errors": r.get("errors", 0), "policy": r.get("policy"),
                         **{k: v for k, v in r.items() if k.startswith("pass@") and k != "pass@1"}}
                 for label, r in evals.items()},
        "dapo_iterations": iterations,
        "wall_time_s": {**wall_time_s, "total": sum(wall_time_s.values())},
    }


def plot_pass1(evals: dict[str, dict[str, Any]], path: Path, title: str) -> Path:
    labels = list(evals)
    means = [evals[k]["pass@1"] for k in labels]
    sems = [evals[k]["sem"] for k in labels]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(labels, means, yerr=sems, capsize=6, color=["#999999", "#4C72B0", "#DD8452", "#55A868"][: len(labels)])
    for i, (m, s) in enumerate(zip(means, sems)):
        ax.text(i, m + s + 0.005, f"{m:.3f}±{s:.3f}", ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("Pass@1 (mean over runs, ± SEM)")
    ax.set_title(title)
    ax.set_ylim(0, max([m + s for m, s in zip(means, sems)] + [0.05]) * 1.25)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_projects(evals: dict[str, dict[str, Any]], path: Path, title: str) -> Path:
    projects = sorted({p for r in evals.values() for p in r.get("by_project", {})})
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(projects)), 4))
    width = 0.8 / max(len(evals), 1)
    for i, (label, r) in enumerate(evals.items()):
        xs = [j + i * width for j in range(len(projects))]
        ax.bar(xs, [r.get("by_project", {}).get(p, 0.0) for p in projects], width, label=label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(projects))], projects, rotation=20, ha="right")
    ax.set_ylabel("resolve rate")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_iterations(iterations: list[dict[str, Any]], path: Path, title: str) -> Path | None:
    if not iterations:
        return None
    xs = list(range(1, len(iterations) + 1))
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for key, label in (("reward_mean_all", "reward mean"), ("resolved_rate", "resolved rate")):
        axes[0].plot(xs, [it.get(key, float("nan")) for it in iterations], marker="o", label=label)
    axes[0].set_title("reward and resolved rate")
    axes[0].legend()
    axes[1].plot(xs, [it.get("format_error_rate", float("nan")) for it in iterations], marker="o", color="#C44E52")
    axes[1].set_title("format-error rate")
    axes[2].plot(xs, [it.get("mean_turns", float("nan")) for it in iterations], marker="o", color="#8172B2")
    axes[2].set_title("mean turns")
    for ax in axes:
        ax.set_xlabel("DAPO iteration")
        ax.set_xticks(xs)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def markdown(report: dict[str, Any], images: list[str]) -> str:
    lines = [f"# swerl run `{report['run_id']}` (preset `{report['preset']}`)", "",
             "| model | Pass@1 | SEM | tasks | runs | errors |", "| --- | --- | --- | --- | --- | --- |"]
    for label, r in report["eval"].items():
        lines.append(f"| {label} | {r['pass@1']:.3f} | {r['sem']:.3f} | {r['n_tasks']} | {r['n_runs']} | "
                     f"{r['errors']} |")
    lines += ["", "| stage | wall time (s) |", "| --- | --- |"]
    lines += [f"| {k} | {v:.0f} |" for k, v in report["wall_time_s"].items()]
    if report["dapo_iterations"]:
        keys = ["reward_mean_all", "resolved_rate", "format_error_rate", "mean_turns", "groups_kept",
                "groups_dropped", "clip_frac_high", "mismatch/kl_k3"]
        lines += ["", "| iteration | " + " | ".join(keys) + " |", "|" + " --- |" * (len(keys) + 1)]
        for i, it in enumerate(report["dapo_iterations"], 1):
            lines.append(f"| {i} | " + " | ".join(f"{it.get(k, float('nan')):.3g}" for k in keys) + " |")
    lines += [""] + [f"![{Path(p).stem}]({Path(p).name})" for p in images]
    return "\n".join(lines) + "\n"


def write_report(out_dir: Path, preset: str, run_id: str, evals: dict[str, dict[str, Any]],
                 iterations: list[dict[str, Any]], wall_time_s: dict[str, float]) -> dict[str, Any]:
    """Write report.json, report.md and the plots into `out_dir`; return report.json's content."""
    import json

    out_dir.mkdir(parents=True, exist_ok=True)
    rep = report_json(preset, run_id, evals, iterations, wall_time_s)
    images = [str(plot_pass1(evals, out_dir / "pass1.png", f"Pass@1 on the held-out eval set ({preset})")),
              str(plot_projects(evals, out_dir / "projects.png", "Resolve rate per eval project"))]
    it_png = plot_iterations(iterations, out_dir / "iterations.png", "DAPO iterations")
    if it_png:
        images.append(str(it_png))
    (out_dir / "report.json").write_text(json.dumps(rep, indent=2))
    (out_dir / "report.md").write_text(markdown(rep, images))
    return rep
