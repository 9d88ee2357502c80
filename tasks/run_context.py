"""One pipeline run as the Prefect tasks see it: its config, store, tracker, registry and MLflow
runs, opened once per worker process from a small `RunRef`.

Tasks receive only small, serialisable parameters (preset, overrides, run id) so that Prefect
can record and re-submit them; `open_run(ref)` rebuilds the heavy context from them and caches it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from pydantic import BaseModel

from swerl.config import flat_params, load_config
from swerl.store import open_store
from tasks.model_uri import install as install_models_uri
from tasks.progress import EpisodeProgress
from tasks.registry import ModelRegistry
from tasks.run_config import CONFIG_FILE, choose_preset, save_run_config
from tasks.tracking import Tracker
from training.run import RunContext, default_run_id


class RunRef(BaseModel):
    """What identifies a run across processes and retries."""

    preset: str = "smoke"
    overrides: list[str] = []
    run_id: str

    @classmethod
    def create(cls, preset: str, overrides: list[str] | None, run_id: str | None) -> "RunRef":
        cfg = load_config(preset, overrides or [])
        return cls(preset=preset, overrides=list(overrides or []), run_id=run_id or default_run_id(cfg))

    @classmethod
    def for_run(cls, run_id: str | None, preset: str | None, overrides: list[str] | None,
                default: str = "smoke") -> tuple["RunRef", str]:
        """The ref of run `run_id` with the config it stored (another `--preset` is refused); with no
        run id, the preset's (`default` when none is named). Returns a warning, or ""."""
        choice = choose_preset(run_id, preset, list(overrides or []), default)
        return cls.create(choice.preset, overrides, run_id), choice.warning


@dataclass
class TrackedRun:
    """A run's context with its MLflow parent run and one child run per pipeline stage; their ids
    are kept in the store, so a resumed run logs into the same MLflow runs."""

    ctx: RunContext
    tracker: Tracker
    registry: ModelRegistry
    mlflow_runs: dict[str, str] = field(default_factory=dict)  # "parent" or a stage -> MLflow run id
    lock: threading.Lock = field(default_factory=threading.Lock)
    config_checked: bool = False  # a resumed run's config compared with its logged params

    @property
    def _runs_key(self) -> str:
        return self.ctx.key("mlflow_runs.json")

    def load_mlflow_runs(self) -> None:
        if self.ctx.store.exists(self._runs_key):
            self.mlflow_runs = self.ctx.store.get_json(self._runs_key)

    def parent(self) -> str:
        """The MLflow run id of the whole pipeline run (created on first use)."""
        with self.lock:
            if "parent" not in self.mlflow_runs:
                cfg = self.ctx.cfg
                rid = self.tracker.start_run(f"pipeline {self.ctx.run_id}",
                                             tags={"swerl.run_id": self.ctx.run_id, "swerl.preset": cfg.preset})
                self.tracker.log_params(flat_params(cfg), run_id=rid)
                self.mlflow_runs["parent"] = rid
                self.ctx.store.put_json(self._runs_key, self.mlflow_runs)
            elif not self.config_checked:  # resumed: the config may have changed since
                self.tracker.log_config_changes(self.ctx.cfg, self.mlflow_runs["parent"])
            self.config_checked = True
            return self.mlflow_runs["parent"]

    def child(self, stage: str) -> str:
        """The MLflow run id of pipeline stage `stage` ("rft", "eval-base" ...), under the parent."""
        parent = self.parent()
        with self.lock:
            if stage not in self.mlflow_runs:
                rid = self.tracker.start_run(stage, parent_run_id=parent,
                                             tags={"swerl.run_id": self.ctx.run_id, "swerl.stage": stage})
                self.mlflow_runs[stage] = rid
                self.ctx.store.put_json(self._runs_key, self.mlflow_runs)
            return self.mlflow_runs[stage]

    def remember_config(self, overwrite: bool = True) -> bool:
        """Keep the run's resolved config in the store and in its MLflow parent run, so commands
        pointed at the run later rebuild it (`tasks.run_config`). `overwrite`: the config this
        process runs with is the run's now (a training flow); off for commands that only read
        a run (an evaluation with other overrides must not rename what the run was)."""
        text = save_run_config(self.ctx.store, self.ctx.run_id, self.ctx.cfg, overwrite)
        if text is not None:
            self.tracker.log_text(text, CONFIG_FILE, run_id=self.parent())
        return text is not None

    def finish(self, status: str = "FINISHED") -> None:
        """End every MLflow run of this pipeline run and flush what is buffered."""
        for rid in self.mlflow_runs.values():
            self.tracker.end_run(status, run_id=rid)
        self.tracker.close()

    def log_stage_metrics(self, stage: str, metrics: dict[str, float], step: int | None) -> None:
        self.tracker.log_metrics(_numeric(metrics), step=step or 0, run_id=self.child(stage))

    def log_missing_stage_metrics(self, stage: str, metrics: dict[str, float], step: int | None) -> None:
        self.tracker.log_missing_metrics(_numeric(metrics), step=step or 0, run_id=self.child(stage))


def _numeric(metrics: dict[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}


_OPEN_RUNS: dict[str, TrackedRun] = {}
_OPEN_RUNS_LOCK = threading.Lock()


def open_run(ref: RunRef) -> TrackedRun:
    """The run's context in this process, built on first use and cached."""
    with _OPEN_RUNS_LOCK:
        if ref.run_id not in _OPEN_RUNS:
            cfg = load_config(ref.preset, ref.overrides)
            store = open_store(cfg.storage)
            tracker = Tracker(cfg)
            registry = ModelRegistry(cfg, client=tracker.client)
            install_models_uri(cfg)
            ctx = RunContext(cfg=cfg, store=store, run_id=ref.run_id)
            run = TrackedRun(ctx=ctx, tracker=tracker, registry=registry)
            run.load_mlflow_runs()
            ctx.on_metrics = run.log_stage_metrics
            ctx.on_missing_metrics = run.log_missing_stage_metrics
            ctx.on_episodes = EpisodeProgress(ref.run_id)
            _OPEN_RUNS[ref.run_id] = run
        return _OPEN_RUNS[ref.run_id]


def record_stage_time(ref: RunRef, stage: str, seconds: float) -> None:
    """Wall time per pipeline stage, accumulated over resumes, for the final report."""
    ctx = open_run(ref).ctx
    key = ctx.key("wall_time.json")
    times = ctx.store.get_json(key) if ctx.store.exists(key) else {}
    times[stage] = times.get(stage, 0.0) + seconds
    ctx.store.put_json(key, times)


@contextmanager
def timed(ref: RunRef, stage: str) -> Iterator[None]:
    """`with timed(ref, "rft"):` adds the block's wall time to the run's record (also when it raises)."""
    t0 = time.monotonic()
    try:
        yield
    finally:
        record_stage_time(ref, stage, time.monotonic() - t0)
