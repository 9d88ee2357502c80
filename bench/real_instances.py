"""Real SWE-bench instances end to end, offline, as a user runs them: import with a repo mirror,
offline image builds (timed cold, then cached), `swerl grade` on the gold and on the empty
predictions, and `swerl curate import` for what the paper's filters keep.

    python -m bench.real_instances [--rows data/swebench_sample/instances.jsonl] [--out DIR]

The rows are the datasets' own records and each repository ships as a shallow bare git repo of
the rows' base and environment-setup commits (data/swebench_sample, docs/REAL_DATA.md). Not in
`make test`: the first run builds a dozen environments and runs every row's tests five times.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from environments.base_image import RELEASES
from environments.curation.importers import ImportSourceError, import_tasks, unpack_mirror
from environments.images import build_images
from environments.records import TaskInstance

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "swebench_sample"


def python_label(task: TaskInstance) -> str:
    """The Python a task's spec asks for, and what it got where no base ships that one."""
    wanted = str(task.meta.get("env_recipe", {}).get("python", ""))
    got = RELEASES.get(task.meta.get("env_spec", {}).get("python", ""), "?")
    return got if wanted in ("", got) else f"{wanted}->{got}"


def group_key(row: dict, tasks: dict[str, TaskInstance]) -> tuple[str, str, str]:
    """(repo, version, python) of a dataset row; python is "?" for a row that did not import."""
    task = tasks.get(row["instance_id"])
    return row["repo"], str(row["version"]), python_label(task) if task else "?"


def summary_rows(rows: list[dict], tasks: dict[str, TaskInstance], import_errors: dict[str, str],
                 gold: dict, empty: dict, curation: dict | None) -> list[dict]:
    """One line per (repo, version, python): rows, what gold and empty predictions resolved,
    errors (import, gold or empty grading), and, given a curation report, how many tasks every
    filter kept."""
    dropped = {iid for ids in (curation or {}).get("reasons", {}).values() for iid in ids}
    out: dict[tuple, dict] = {}
    for row in rows:
        iid = row["instance_id"]
        repo, version, python = group_key(row, tasks)
        line = out.setdefault((repo, version, python), {"repo": repo, "version": version, "python": python, "n": 0,
                                                        "gold_resolved": 0, "empty_resolved": 0, "errors": 0})
        line["n"] += 1
        line["gold_resolved"] += iid in gold.get("resolved_ids", [])
        line["empty_resolved"] += iid in empty.get("resolved_ids", [])
        line["errors"] += (iid in import_errors) + (iid in gold.get("error_ids", [])) + (iid in empty.get("error_ids", []))
        if curation is not None:
            line["kept"] = line.get("kept", 0) + (iid in tasks and iid not in dropped)
    return [out[k] for k in sorted(out)]


def totals(lines: list[dict]) -> dict:
    """The sum of every numeric column of `summary_rows`."""
    keys = [k for k in lines[0] if isinstance(lines[0][k], int)] if lines else []
    return {"repo": "all", "version": "", "python": "", **{k: sum(line[k] for line in lines) for k in keys}}


def markdown(lines: list[dict]) -> str:
    """`lines` (dicts with the same keys) as a Markdown table."""
    if not lines:
        return "(nothing)"
    cols = list(lines[0])
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    rows += ["| " + " | ".join(str(line[c]) for c in cols) + " |" for line in lines]
    return "\n".join(rows)


def time_builds(tasks: list[TaskInstance]) -> list[dict]:
    """Per environment (one image per repo, version and spec): the first build of its env and
    instance layers, then the same build again, which must be all cache hits."""
    groups: dict[str, list[TaskInstance]] = defaultdict(list)
    for t in tasks:
        groups[json.dumps(t.meta["env_spec"], sort_keys=True)].append(t)
    out = []
    for group in groups.values():
        lines: list[str] = []
        t0 = time.monotonic()
        got = build_images(group, progress=lines.append)
        first = time.monotonic() - t0
        again_lines: list[str] = []
        t1 = time.monotonic()
        build_images(group, progress=again_lines.append)
        cached = time.monotonic() - t1
        built = [line for line in lines if line.startswith("building swerl-")]
        t = group[0]
        out.append({"repo": t.repo, "version": t.version, "python": python_label(t), "tasks": len(group),
                    "layers_built": len(built), "first_s": round(first, 1), "cached_s": round(cached, 1),
                    "cache_hits_only": not any(x.startswith("building") for x in again_lines),
                    "errors": len(got.errors)})
        print(f"[real] {t.repo} {t.version}: first {first:.1f} s ({len(built)} layers built), cached {cached:.1f} s",
              flush=True)
    return out


def swerl(*args: str) -> subprocess.CompletedProcess:
    """One `swerl` command as a user runs it; its output goes to ours as well."""
    out = subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True, cwd=ROOT)
    print(out.stdout, end="", flush=True)
    if out.returncode not in (0, 1) or "Traceback" in out.stderr:
        print(out.stderr[-3000:], file=sys.stderr)
    return out


def write_predictions(rows: list[dict], path: Path, gold: bool) -> Path:
    path.write_text("".join(json.dumps({"instance_id": r["instance_id"], "model_name_or_path": "gold" if gold else "empty",
                                        "model_patch": r["patch"] if gold else ""}) + "\n" for r in rows))
    return path


def run(rows_path: Path, out: Path, workers: int, reruns: int, curate: bool, sets: list[str]) -> dict:
    rows = [json.loads(line) for line in rows_path.read_text().splitlines() if line.strip()]
    mirror = unpack_mirror(rows_path.parent, out / "mirror")
    t0 = time.monotonic()
    report = import_tasks(str(rows_path), "swe-bench-lite", repo_mirror=str(mirror))
    import_errors = {e.split(":", 1)[0]: e for e in report.errors}
    tasks = {t.instance_id: t for t in report.tasks}
    print(f"[real] imported {len(tasks)} of {len(rows)} rows in {time.monotonic() - t0:.1f} s", flush=True)
    builds = time_builds(report.tasks)
    tasks_file = out / "tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in report.tasks))
    verdicts, walls = {}, {}
    for label in ("gold", "empty"):
        preds = write_predictions(rows, out / f"{label}.predictions.jsonl", gold=label == "gold")
        t1 = time.monotonic()
        swerl("grade", *sets, "--tasks", str(tasks_file), "--predictions", str(preds),
              "--report", str(out / f"{label}.report.json"), "--workers", str(workers))
        walls[f"grade_{label}_s"] = round(time.monotonic() - t1, 1)
        verdicts[label] = json.loads((out / f"{label}.report.json").read_text())
    curation = None
    if curate:
        t2 = time.monotonic()
        swerl("curate", "import", *sets, str(rows_path), "--source", "swe-bench-lite", "--repo-mirror", str(mirror),
              "--reruns", str(reruns), "--workers", str(workers), "--report", str(out / "curation.json"))
        walls["curate_s"] = round(time.monotonic() - t2, 1)
        curation = json.loads((out / "curation.json").read_text())
    lines = summary_rows(rows, tasks, import_errors, verdicts["gold"], verdicts["empty"], curation)
    return {"table": lines, "total": totals(lines), "builds": builds, "walls": walls,
            "import_errors": import_errors, "curation": curation}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=Path, default=SAMPLE / "instances.jsonl",
                   help="SWE-bench rows; their repository archives (owner__name.git.tar.gz) beside them")
    p.add_argument("--out", type=Path, help="keep the reports here (default: a temporary directory)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--reruns", type=int, default=1, help="curate import's determinism reruns")
    p.add_argument("--no-curate", action="store_true", help="skip `swerl curate import` (the filters)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override both swerl commands get, e.g. environment.test_timeout_s=900")
    args = p.parse_args(argv)
    sets = [x for kv in args.set for x in ("--set", kv)]
    with tempfile.TemporaryDirectory(prefix="swerl-real-") as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        try:
            res = run(args.rows.resolve(), out.resolve(), args.workers, args.reruns, not args.no_curate, sets)
        except (ImportSourceError, OSError, json.JSONDecodeError) as e:
            print(f"bench.real_instances: {e}", file=sys.stderr)
            return 2
        (out / "summary.json").write_text(json.dumps(res, indent=2))
    print("\n" + markdown(res["table"] + [res["total"]]))
    print("\n" + markdown(res["builds"]))
    if res["curation"] is not None:
        print("\ncurate import: kept", res["curation"]["kept"], "dropped by", json.dumps(res["curation"]["dropped_by"]))
    print("wall:", json.dumps(res["walls"]))
    t = res["total"]
    ok = t["gold_resolved"] == t["n"] and t["empty_resolved"] == 0 and t["errors"] == 0
    print("gold 100% resolved, empty 0, no errors" if ok else "NOT all gold resolved / some empty resolved / errors")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
