"""One pipeline run: its config, its place in the store, its checkpoints and its policy engine.

Everything a run writes lives under `runs/{run_id}/` in the object store, so a re-run of the same
config (same run id) finds it. Prefect and MLflow reach a run through the callbacks here.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from environments.records import TaskInstance
from swerl.config import SwerlConfig, dump_config
from swerl.model_cache import resolve_model
from swerl.paths import state_dir
from training.checkpoint import is_complete
from training.trajectory import Trajectory

log = logging.getLogger(__name__)

MetricsFn = Callable[[str, dict[str, float], int | None], None]  # (stage, metrics, step)
EpisodesFn = Callable[[str, int, int], None]  # (rollout batch "eval-base/0", episodes done, in all)


def config_hash(cfg: SwerlConfig) -> str:
    return hashlib.sha256(dump_config(cfg).encode()).hexdigest()[:10]


def default_run_id(cfg: SwerlConfig) -> str:
    """Same config, same run: a re-run resumes instead of starting over."""
    return f"{cfg.preset}-{config_hash(cfg)}"


@dataclass
class RunContext:
    cfg: SwerlConfig
    store: Any  # swerl.store.Store
    run_id: str
    on_metrics: MetricsFn = lambda stage, metrics, step: None
    # for metrics a resumed run sends again: the tracker skips those it already has at that step
    on_missing_metrics: MetricsFn = lambda stage, metrics, step: None
    progress: bool = True
    on_episodes: EpisodesFn = lambda batch, done, total: None  # a progress view beside the tqdm bar
    engine: Any = field(default=None, repr=False)  # the run's inference backend (backend_for)
    engine_policy_path: str | None = field(default=None, repr=False)

    def key(self, *parts: object) -> str:
        return "/".join(["runs", self.run_id, *map(str, parts)])

    @property
    def work(self) -> Path:
        p = state_dir() / "runs" / self.run_id
        p.mkdir(parents=True, exist_ok=True)
        return p


# ---------------------------------------------------------------- checkpoints
def checkpoint_name(stage: str, iteration: int) -> str:
    return f"{stage}-{iteration}"


def is_checkpoint_name(name: str) -> bool:
    return re.fullmatch(r"(rft|dapo-s\d+)-\d+", name) is not None


def has_checkpoint(ctx: RunContext, name: str) -> bool:
    return ctx.store.dir_complete(ctx.key("checkpoints", name))


def model_dir(ctx: RunContext, name: str) -> str:
    """A local directory holding model `name`: "base", a checkpoint of this run ("rft-0"), a store
    key of a checkpoint directory, a local path, or a registry URI ("models:/swerl-agent@champion")."""
    if name == "base":
        return resolve_model(ctx.cfg.rollout.model)
    key = ctx.key("checkpoints", name) if is_checkpoint_name(name) else name.strip("/")
    if is_checkpoint_name(name) or (not Path(name).exists() and ":/" not in name and ctx.store.dir_complete(key)):
        local = state_dir() / "models" / key
        if not is_complete(local):
            shutil.rmtree(local, ignore_errors=True)
            ctx.store.get_dir(key, local)
        return str(local)
    return resolve_model(name)


def publish_checkpoint(ctx: RunContext, local_dir: str | Path, name: str) -> str:
    """Upload a complete local checkpoint; the store's own marker makes the upload atomic."""
    key = ctx.key("checkpoints", name)
    ctx.store.put_dir(local_dir, key)
    return key


def backend_for(ctx: RunContext, policy: str) -> Any:
    """One inference backend per run, started once; a policy change loads the new weights into it."""
    from training.inference import make_backend
    from training.layout import vllm_engine_kwargs

    path = model_dir(ctx, policy)
    t0 = time.monotonic()
    if ctx.engine is None:
        ctx.engine = make_backend(ctx.cfg.rollout.model_copy(update={"model": path}),
                                  engine_kwargs=vllm_engine_kwargs(ctx.cfg.gpu))
        log.info("rollout engine %s started on %s in %.1f s", type(ctx.engine).__name__, policy,
                 time.monotonic() - t0)
    elif ctx.engine_policy_path != path:
        ctx.engine.load_weights(path)
        log.info("rollout engine took the weights of %s in %.2f s", policy, time.monotonic() - t0)
    ctx.engine_policy_path = path
    ctx.engine.policy_version = policy
    return ctx.engine


def stored_trajectories(ctx: RunContext, prefix: str = "") -> list[Trajectory]:
    """Every finished episode of this run whose key below `rollouts/` starts with `prefix`."""
    out = []
    for key in ctx.store.ls(ctx.key("rollouts", prefix).rstrip("/")):
        if key.endswith(".json") and key.split("/rollouts/", 1)[-1].startswith(prefix):
            out.append(Trajectory.from_json(ctx.store.get_text(key)))
    return out


# ---------------------------------------------------------------- names
def tasks_hash(tasks: list[TaskInstance]) -> str:
    return hashlib.sha256("\n".join(sorted(t.instance_id for t in tasks)).encode()).hexdigest()[:16]


def safe_name(name: str) -> str:
    """A label or policy name as one store key segment."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")
