"""One run's context for the Prefect tasks: config, store, MLflow runs, kept per process.

Tasks receive only small, serialisable parameters (preset, overrides, run id) so that Prefect
can record and re-submit them; the heavy context (store client, tracker, loaded policy) is rebuilt
from them once per worker process and cached here.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from swerl.config import SwerlConfig, flat_params, load_config
from swerl.store import open_store
from tasks.model_uri import install as install_models_uri
from training.run import RunContext, default_run_id

log = logging.getLogger(__name__)


class RunRef(BaseModel):
    """What identifies a run across processes and retries."""

    preset: str = "smoke"
    overrides: list[str] = []
    run_id: str

    @classmethod
    def create(cls, preset: str, overrides: list[str] | None, run_id: str | None) -> "RunRef":
        cfg = load_config(preset, overrides or [])
        return cls(preset=preset, overrides=list(overrides or []), run_id=run_id or default_run_id(cfg))


@dataclass
class Tracked:
    """The run's MLflow parent and per-stage child runs; ids persisted in the store so a resumed
    run logs into the same MLflow runs instead of starting new ones."""

    ctx: RunContext
    tracker: Any  # tasks.tracking.Tracker
    runs: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    config_checked: bool = False  # a resumed run's config compared with its logged params

    @property
    def _key(self) -> str:
        return self.ctx.key("mlflow_runs.json")

    def load(self) -> None:
        if self.ctx.store.exists(self._key):
            self.runs = self.ctx.store.get_json(self._key)

    def parent(self) -> str:
        with self.lock:
            if "parent" not in self.runs:
                cfg = self.ctx.cfg
                rid = self.tracker.start_run(f"pipeline {self.ctx.run_id}",
                                             tags={"swerl.run_id": self.ctx.run_id, "swerl.preset": cfg.preset})
                self.tracker.log_params(flat_params(cfg), run_id=rid)
                self.runs["parent"] = rid
                self.ctx.store.put_json(self._key, self.runs)
            elif not self.config_checked:  # resumed: the config may have changed since
                self.tracker.log_config_changes(self.ctx.cfg, self.runs["parent"])
            self.config_checked = True
            return self.runs["parent"]

    def child(self, stage: str) -> str:
        parent = self.parent()
        with self.lock:
            if stage not in self.runs:
                rid = self.tracker.start_run(stage, parent_run_id=parent,
                                             tags={"swerl.run_id": self.ctx.run_id, "swerl.stage": stage})
                self.runs[stage] = rid
                self.ctx.store.put_json(self._key, self.runs)
            return self.runs[stage]

    def finish(self, status: str = "FINISHED") -> None:
        """End every MLflow run of this pipeline run and flush what is buffered."""
        for rid in self.runs.values():
            self.tracker.end_run(status, run_id=rid)
        self.tracker.close()

    def metrics(self, stage: str, metrics: dict[str, float], step: int | None) -> None:
        self.tracker.log_metrics(_numeric(metrics), step=step or 0, run_id=self.child(stage))

    def missing_metrics(self, stage: str, metrics: dict[str, float], step: int | None) -> None:
        self.tracker.log_missing_metrics(_numeric(metrics), step=step or 0, run_id=self.child(stage))


def _numeric(metrics: dict[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}


_CACHE: dict[str, Tracked] = {}
_LOCK = threading.Lock()


def tracked(ref: RunRef) -> Tracked:
    """The cached context of a run in this process (built on first use)."""
    from tasks.tracking import Tracker

    with _LOCK:
        if ref.run_id not in _CACHE:
            cfg: SwerlConfig = load_config(ref.preset, ref.overrides)
            store = open_store(cfg.storage)
            tracker = Tracker(cfg)
            install_models_uri(cfg)
            ctx = RunContext(cfg=cfg, store=store, run_id=ref.run_id)
            t = Tracked(ctx=ctx, tracker=tracker)
            t.load()
            ctx.on_metrics = t.metrics
            ctx.on_missing_metrics = t.missing_metrics
            _CACHE[ref.run_id] = t
        return _CACHE[ref.run_id]


def record_stage_time(ref: RunRef, stage: str, seconds: float) -> None:
    """Wall time per stage, accumulated over resumes, for the final report."""
    t = tracked(ref)
    key = t.ctx.key("wall_time.json")
    times = t.ctx.store.get_json(key) if t.ctx.store.exists(key) else {}
    times[stage] = times.get(stage, 0.0) + seconds
    t.ctx.store.put_json(key, times)


class timed:
    """`with timed(ref, "rft"):` adds the block's wall time to the run's record."""

    def __init__(self, ref: RunRef, stage: str):
        self.ref, self.stage = ref, stage

    def __enter__(self) -> "timed":
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        record_stage_time(self.ref, self.stage, time.monotonic() - self.t0)
