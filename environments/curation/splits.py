"""Train/eval splits by project, duplicate removal, and decontamination.

Splitting by *project* (not by task) is what makes eval numbers mean transfer: two mutants of the
same function share most of what an agent must learn about the code. Duplicates are the same
change to the same project (two modifiers can produce the same edit, and SWE-bench variants list
the same instance more than once); they are found by the normalised diff, not the id.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from environments.records import TaskInstance

_HUNK = re.compile(r"^@@ .*? @@")


def project_of(task: TaskInstance) -> str:
    """The project a task belongs to, without version: `meta.project`, else the repo name."""
    return (task.meta.get("project") or task.repo.rsplit("/", 1)[-1] or task.repo).lower()


def normalized_diff(patch: str) -> str:
    """The changed lines of a diff, without index lines, hunk offsets and context: two diffs of
    the same edit taken at different line offsets or with different context compare equal."""
    keep = []
    for line in patch.splitlines():
        if line.startswith(("index ", "diff --git")) or _HUNK.match(line):
            continue
        if line.startswith(("+", "-")):
            keep.append(line.rstrip())
    return "\n".join(keep)


def diff_key(task: TaskInstance) -> str:
    return hashlib.sha256(f"{project_of(task)}\n{normalized_diff(task.patch)}".encode()).hexdigest()


def dedup(tasks: list[TaskInstance]) -> tuple[list[TaskInstance], list[str]]:
    """First task of each (project, diff); returns (kept, ids dropped)."""
    seen: set[str] = set()
    ids: set[str] = set()
    kept, dropped = [], []
    for t in tasks:
        k = diff_key(t)
        if k in seen or t.instance_id in ids:
            dropped.append(t.instance_id)
            continue
        seen.add(k)
        ids.add(t.instance_id)
        kept.append(t)
    return kept, dropped


@dataclass
class SplitReport:
    train: list[TaskInstance]
    eval: list[TaskInstance]
    duplicates: list[str] = field(default_factory=list)
    contaminated: list[str] = field(default_factory=list)  # train tasks dropped for eval overlap

    def counts(self) -> dict:
        return {"train": len(self.train), "eval": len(self.eval), "duplicates": len(self.duplicates),
                "contaminated": len(self.contaminated)}


def make_splits(train: list[TaskInstance], eval_: list[TaskInstance]) -> SplitReport:
    """Deduplicate each side, then drop from train whatever shares a project or a diff with
    eval (eval is the side that must stay untouched: it is frozen by content hash)."""
    eval_kept, dup_eval = dedup(eval_)
    train_kept, dup_train = dedup(train)
    eval_projects = {project_of(t) for t in eval_kept}
    eval_diffs = {normalized_diff(t.patch) for t in eval_kept}
    clean, dirty = [], []
    for t in train_kept:
        if project_of(t) in eval_projects or normalized_diff(t.patch) in eval_diffs:
            dirty.append(t.instance_id)
        else:
            clean.append(t)
    for t in clean:
        t.split = "train"
    for t in eval_kept:
        t.split = "eval"
    return SplitReport(clean, eval_kept, dup_train + dup_eval, dirty)


def shared_projects(train: list[TaskInstance], eval_: list[TaskInstance]) -> set[str]:
    return {project_of(t) for t in train} & {project_of(t) for t in eval_}
