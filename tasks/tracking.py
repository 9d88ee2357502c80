"""MLflow tracking: the runs of one experiment and what they record (metrics, params, tags,
artifacts, dataset inputs). Prefect tasks and the CLI use a `Tracker`; library code
(environments/, training/) never imports this, it gets a callback such as
`tracker.metrics_callback()`.

A tracking outage must not kill a training run, nor lose data quietly: metrics, params, tags and
run ends are buffered and sent in batches (`tasks.tracking_buffer`); artifacts and dataset inputs
are retried for `cfg.tracking.retry_s`, then dropped and counted in `tracker.dropped`. Starting a
run is not optional: it retries, then raises `TrackingUnavailable`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from mlflow import MlflowClient
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from mlflow.utils.validation import MAX_DATASET_DIGEST_SIZE, MAX_PARAM_VAL_LENGTH, MAX_TAG_VAL_LENGTH

from swerl.config import SwerlConfig, flat_params
from swerl.store import open_store
from tasks.mlflow_backend import TrackingUnavailable, call_with_retry, mlflow_uri, new_client
from tasks.tracking_buffer import Record, RecordBuffer, RunEnd

log = logging.getLogger(__name__)

T = TypeVar("T")


def _truncate(value: Any, limit: int) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def export_s3_env(cfg: SwerlConfig) -> None:
    """MLflow's S3 artifact client (boto3) reads only the environment, so hand it the store's
    endpoint and keys; values the user already exported win."""
    endpoint = cfg.storage.s3_endpoint_url or os.environ.get("SWERL_S3_ENDPOINT_URL")
    for name, value in [("MLFLOW_S3_ENDPOINT_URL", endpoint),
                        ("AWS_ACCESS_KEY_ID", cfg.storage.s3_key),
                        ("AWS_SECRET_ACCESS_KEY", cfg.storage.s3_secret)]:
        if value:
            os.environ.setdefault(name, value)


def metric_name(name: str) -> str:
    """MLflow accepts only [A-Za-z0-9_-. :/] in metric names: `pass@1` is logged as `pass_at_1`."""
    return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", name.replace("@", "_at_"))


class Tracker:
    """One experiment (`cfg.experiment_name`), its runs, and what they record."""

    def __init__(self, cfg: SwerlConfig, client: MlflowClient | None = None) -> None:
        self.cfg = cfg
        self.retry_s = cfg.tracking.retry_s
        self.tracking_uri = mlflow_uri(cfg)
        self.artifact_location = open_store(cfg.storage).url("mlflow")
        if self.artifact_location.startswith("s3://"):
            export_s3_env(cfg)
        self.client = client or new_client(self.tracking_uri)
        self.dropped: Counter[str] = Counter()
        self.buffer = RecordBuffer(self._send_records, self.retry_s, self.tracking_uri, self.dropped)
        self._experiment_id: str | None = None
        self._active: list[str] = []

    # -- plumbing -----------------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """A call that must happen: retried for the window, then TrackingUnavailable."""
        return call_with_retry(what, fn, self.tracking_uri, self.retry_s)

    def _call_or_drop(self, kind: str, what: str, fn: Callable[[], T]) -> T | None:
        """A call that may be lost after the window, but never quietly."""
        try:
            return self._call(what, fn)
        except TrackingUnavailable as e:
            self.dropped[kind] += 1
            log.error("TRACKING DATA LOST: dropped 1 %s (%s): %s", kind, what, e)
            return None

    def _run_id(self, run_id: str | None) -> str:
        if run_id:
            return run_id
        if not self._active:
            raise RuntimeError("no active run: call start_run() first or pass run_id")
        return self._active[-1]

    @property
    def experiment_id(self) -> str:
        if self._experiment_id is None:
            self._experiment_id = self._call("get or create experiment", self._ensure_experiment)
        return self._experiment_id

    def _ensure_experiment(self) -> str:
        name = self.cfg.experiment_name
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            try:
                return self.client.create_experiment(name, artifact_location=self.artifact_location)
            except MlflowException as e:  # created by a concurrent worker in between
                if e.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
                exp = self.client.get_experiment_by_name(name)
        if exp.lifecycle_stage == "deleted":
            self.client.restore_experiment(exp.experiment_id)
        if exp.artifact_location.rstrip("/") != self.artifact_location:
            log.warning("experiment %s keeps its artifact location %s (store now at %s)",
                        name, exp.artifact_location, self.artifact_location)
        return exp.experiment_id

    # -- runs ---------------------------------------------------------------------------------

    def start_run(self, name: str, parent_run_id: str | None = None,
                  tags: Mapping[str, Any] | None = None) -> str:
        """Create a run; nested under `parent_run_id`, else under this tracker's active run."""
        parent = parent_run_id or (self._active[-1] if self._active else None)
        all_tags = {"swerl.preset": self.cfg.preset, **{k: str(v) for k, v in (tags or {}).items()}}
        if parent:
            all_tags[MLFLOW_PARENT_RUN_ID] = parent
        experiment_id = self.experiment_id
        run = self._call(f"start run {name}", lambda: self.client.create_run(
            experiment_id, run_name=name, tags=all_tags))
        self._active.append(run.info.run_id)
        return run.info.run_id

    def end_run(self, status: str = "FINISHED", run_id: str | None = None) -> None:
        """Mark the run ended (buffered like metrics: never blocks on an outage)."""
        run_id = self._run_id(run_id)
        if run_id in self._active:
            self._active.remove(run_id)
        self._enqueue(run_id, "status", [RunEnd(status, int(time.time() * 1000))])

    @contextmanager
    def run(self, name: str, parent_run_id: str | None = None,
            tags: Mapping[str, Any] | None = None) -> Iterator[str]:
        """`with tracker.run("rft") as run_id:`; FAILED or KILLED when the body raises."""
        run_id = self.start_run(name, parent_run_id, tags)
        status = "FINISHED"
        try:
            yield run_id
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        except BaseException:
            status = "FAILED"
            raise
        finally:
            self.end_run(status, run_id)

    # -- buffered: metrics, params, tags ------------------------------------------------------

    def _enqueue(self, run_id: str | None, kind: str, items: list[Record]) -> None:
        self.buffer.add(self._run_id(run_id), kind, items)

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0,
                    run_id: str | None = None) -> None:
        now = int(time.time() * 1000)  # stamped when measured, not when the buffer is sent
        self._enqueue(run_id, "metrics", [Metric(metric_name(k), float(v), now, step) for k, v in metrics.items()])

    def log_missing_metrics(self, metrics: Mapping[str, float], step: int = 0,
                            run_id: str | None = None) -> bool:
        """Metrics sent again by a resumed run: logged unless the run already has them at `step`.
        MLflow keeps a repeat as a second point at that step, so a plain re-log would show a resumed
        iteration twice. One key decides for all (they are sent together). When MLflow cannot be
        read they are logged: a point shown twice beats a point lost. Returns whether it logged."""
        if not metrics:
            return False
        rid = self._run_id(run_id)
        self.flush()
        key = metric_name(next(iter(metrics)))
        try:  # one try: during an outage they join the buffer like any other metrics
            if any(m.step == step for m in self.client.get_metric_history(rid, key)):
                return False
        except Exception as e:  # noqa: BLE001 - unreadable is not a reason to lose them
            log.warning("tracking: cannot read %s of run %s (%s); logging its metrics again", key, rid, e)
        self.log_metrics(metrics, step, rid)
        return True

    def log_params(self, params: Mapping[str, Any], run_id: str | None = None) -> None:
        self._enqueue(run_id, "params",
                      [Param(k, _truncate(v, MAX_PARAM_VAL_LENGTH)) for k, v in params.items()])

    def log_config(self, cfg: SwerlConfig | None = None, run_id: str | None = None) -> None:
        """The resolved config as flat params (`rollout.sampling.temperature` ...)."""
        self.log_params(flat_params(cfg or self.cfg), run_id)

    def log_config_changes(self, cfg: SwerlConfig, run_id: str) -> dict[str, tuple[str, str]]:
        """A run resumed with another config: MLflow params are write-once, so keys the run lacks
        become params and changed values become tags ``swerl.resumed.{key}`` = "old -> new".
        Returns the changed values (empty when MLflow cannot be read: that is logged)."""
        self.flush()
        run = self._call_or_drop("params", "read params", lambda: self.client.get_run(run_id))
        if run is None:
            return {}
        logged = run.data.params
        now = {k: _truncate(v, MAX_PARAM_VAL_LENGTH) for k, v in flat_params(cfg).items()}
        added = {k: v for k, v in now.items() if k not in logged}
        changed = {k: (logged[k], v) for k, v in now.items() if k in logged and logged[k] != v}
        if added:
            self.log_params(added, run_id)
        if changed:
            self.set_tags({f"swerl.resumed.{k}": f"{old} -> {new}" for k, (old, new) in changed.items()}, run_id)
            log.warning("run %s resumed with %d changed config values: %s", run_id, len(changed),
                        ", ".join(f"{k}: {old} -> {new}" for k, (old, new) in changed.items()))
        return changed

    def set_tags(self, tags: Mapping[str, Any], run_id: str | None = None) -> None:
        self._enqueue(run_id, "tags",
                      [RunTag(k, _truncate(v, MAX_TAG_VAL_LENGTH)) for k, v in tags.items()])

    def metrics_callback(self, run_id: str | None = None,
                         prefix: str = "") -> Callable[[Mapping[str, float], int], None]:
        """What library code gets instead of a tracker: `on_metrics(values, step)`."""
        run_id = self._run_id(run_id)

        def on_metrics(values: Mapping[str, float], step: int) -> None:
            self.log_metrics({f"{prefix}{k}": v for k, v in values.items()}, step, run_id)

        return on_metrics

    @property
    def pending(self) -> Counter[str]:
        """What is buffered right now, per kind."""
        return self.buffer.pending

    def flush(self, timeout: float = 0.0) -> bool:
        """Send what is buffered, retrying for up to `timeout` s; True once nothing is left.
        False after an outage longer than the retry window (the buffer was dropped, loudly)."""
        return self.buffer.flush(timeout)

    def _send_records(self, run_id: str, kind: str, items: list[Record]) -> None:
        """One request for the buffer: a run's end, or a `log_batch` of one kind."""
        if kind == "status":
            (end,) = items
            self.client.set_terminated(run_id, end.key, end_time=end.end_time)
        else:
            self.client.log_batch(run_id, **{kind: items})

    # -- artifacts and inputs -----------------------------------------------------------------

    def log_artifact(self, local_path: str | Path, artifact_path: str | None = None,
                     run_id: str | None = None) -> None:
        run_id = self._run_id(run_id)
        self._call_or_drop("artifacts", f"log artifact {local_path}",
                           lambda: self.client.log_artifact(run_id, str(local_path), artifact_path))

    def log_dict(self, obj: dict[str, Any], artifact_file: str, run_id: str | None = None) -> None:
        run_id = self._run_id(run_id)
        self._call_or_drop("artifacts", f"log dict {artifact_file}",
                           lambda: self.client.log_dict(run_id, obj, artifact_file))

    def log_text(self, text: str, artifact_file: str, run_id: str | None = None) -> None:
        run_id = self._run_id(run_id)
        self._call_or_drop("artifacts", f"log text {artifact_file}",
                           lambda: self.client.log_text(run_id, text, artifact_file))

    def log_dataset_input(self, name: str, digest: str, source_uri: str, n_rows: int,
                          context: str = "train", run_id: str | None = None) -> None:
        """Record which dataset version a run consumed (MLflow keeps only 36 digest chars; the
        full sha256 goes into the profile)."""
        run_id = self._run_id(run_id)
        scheme = source_uri.split("://", 1)[0] if "://" in source_uri else "local"
        dataset = Dataset(
            name=name,
            digest=digest[:MAX_DATASET_DIGEST_SIZE],
            source_type="local" if scheme == "file" else scheme,
            source=json.dumps({"uri": source_uri}),
            profile=json.dumps({"num_rows": n_rows, "sha256": digest}),
        )
        inputs = [DatasetInput(dataset, tags=[InputTag("mlflow.data.context", context)])]
        self._call_or_drop("inputs", f"log dataset {name}",
                           lambda: self.client.log_inputs(run_id, datasets=inputs))

    # -- lifetime -----------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> Counter[str]:
        """Flush what is buffered (waiting up to `timeout`, default the retry window) and return
        what was dropped over the tracker's life."""
        self.flush(self.retry_s if timeout is None else timeout)
        if self.dropped:
            log.error("TRACKING DATA LOST over this tracker's life: %s", dict(self.dropped))
        return self.dropped

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
