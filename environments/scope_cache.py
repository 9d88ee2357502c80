"""Verdicts of the gold scope check kept on disk, so a pinned dataset is checked once per machine.

Why: `grading.gold_out_of_scope` starts one sandbox per (repo, base commit); a synthetic dataset
has one base commit per task, so every run of the demo paid ~90 s of sandboxes to learn what the
last run learned. A verdict depends only on the task's image (its tag digests the build inputs,
so it names the tracked files), its patch, its test files and the scope rules; the key holds
all of them, the rules as their source text, so a change to the grader checks everything again.
A file that cannot be read is a miss, never a verdict.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable, Iterable

from environments.records import TaskInstance
from swerl.store import write_local_atomic


def rules_digest(sources: Iterable[str]) -> str:
    """One digest of the texts that decide a verdict (the rules' source, the listing script)."""
    return hashlib.sha256("\0".join(sources).encode()).hexdigest()[:16]


def scope_key(task: TaskInstance, test_files: list[str], rules: str) -> str:
    parts = [rules, task.image, task.patch, *sorted(test_files)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


class ScopeCache:
    """Reasons (an empty list: in scope) by `scope_key`, one small JSON file each under `root`."""

    def __init__(self, root: Path, rules: str, test_files: Callable[[TaskInstance], list[str]]):
        self.root, self.rules, self.test_files = root, rules, test_files

    def _path(self, task: TaskInstance) -> Path:
        key = scope_key(task, self.test_files(task), self.rules)
        return self.root / key[:2] / f"{key}.json"

    def get(self, task: TaskInstance) -> list[str] | None:
        try:
            problems = json.loads(self._path(task).read_text())["problems"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return [str(p) for p in problems] if isinstance(problems, list) else None

    def put(self, task: TaskInstance, problems: list[str]) -> None:
        """Atomic (the store's write-then-rename): a reader never sees half a verdict. A full or
        read-only disk only costs the next run a recheck."""
        record = json.dumps({"instance_id": task.instance_id, "problems": problems}).encode()
        try:
            write_local_atomic(self._path(task), [record])
        except OSError:
            pass
