"""Verdicts of patches already graded, so the same patch of the same task is graded once.

A group of samples of one task often ends with the same patch (most often the empty one), and
grading runs the project's suite in a fresh container: seconds of CPU each. Curation keeps only
tasks whose outcome is the same on every rerun, so the same patch gets the same verdict. Only
`resolved`/`unresolved` verdicts are kept; an `error` is always graded again.
"""

from __future__ import annotations

import copy
import hashlib
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Callable

from environments.records import GradeResult, TaskInstance

if TYPE_CHECKING:
    from swerl.config import EnvironmentConfig


def verdict_key(task: TaskInstance, patch: str, grader: str) -> str:
    """Everything a verdict depends on: the grader, the task's image and tests, the patch."""
    parts = [grader, task.instance_id, task.image, task.test_cmd, task.test_patch,
             "\n".join(task.FAIL_TO_PASS), "\n".join(task.PASS_TO_PASS), patch]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


class VerdictCache:
    """Verdicts by `verdict_key`; bounded, per process.

    Single-flight: a group's samples finish together, so without it G concurrent episodes with
    the same patch would all miss and grade it G times; the later ones wait for the first.
    """

    def __init__(self, size: int = 512):
        self.size = size
        self._items: OrderedDict[str, GradeResult] = OrderedDict()
        self._lock = threading.Lock()
        self._inflight: dict[str, threading.Event] = {}
        self.hits = 0

    def get_or_grade(self, key: str, grade_fn: Callable[[], GradeResult]) -> GradeResult:
        """The cached verdict, the one being computed for the same key, or `grade_fn()`."""
        while True:
            hit = self.get(key)
            if hit is not None:
                return hit
            with self._lock:
                if key in self._items:  # landed between get() and here
                    continue
                running = self._inflight.get(key)
                if running is None:
                    own_turn = self._inflight[key] = threading.Event()
                    break
            running.wait()  # then look again: a hit, or (the first one erred) our turn to grade
        try:
            result = grade_fn()
            self.put(key, result)
            return result
        finally:
            with self._lock:
                del self._inflight[key]
            own_turn.set()

    def get(self, key: str) -> GradeResult | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return copy.deepcopy(hit)  # callers may edit what they get; the cache must not change

    def put(self, key: str, result: GradeResult) -> None:
        if result.status == "error":
            return
        with self._lock:
            self._items[key] = copy.deepcopy(result)
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


VERDICTS = VerdictCache()  # the process's cache; replace it to start afresh (benchmarks, tests)


def cached_grade(task: TaskInstance, patch: str, env_cfg: "EnvironmentConfig") -> GradeResult:
    """`grading.grade_prediction(task, patch)`, graded at most once per process for its key."""
    from environments.grading import grade_prediction  # when first used: it pulls in swebench

    key = verdict_key(task, patch, f"{grade_prediction.__module__}.{grade_prediction.__qualname__}")
    return VERDICTS.get_or_grade(key, lambda: grade_prediction(task, patch, env_cfg))
