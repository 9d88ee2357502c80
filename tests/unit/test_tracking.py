"""Tracker and ModelRegistry on a temporary SQLite MLflow; outages simulated with a client aimed
at a closed port."""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from swerl.config import config_from_dict
from swerl.store import Store
from tasks.mlflow_backend import TrackingUnavailable, check_tracking
from tasks.registry import ModelRegistry
from tasks.tracking import Tracker
from tests.s3server import free_ports

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def template_db(tmp_path_factory) -> Path:
    """An empty, migrated MLflow database: creating one costs seconds, copying it nothing."""
    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def make_cfg(template_db):
    def make(tmp_path: Path, retry_s: float = 5.0, tracking_uri: str | None = None):
        if tracking_uri is None:
            shutil.copy(template_db, tmp_path / "mlflow.db")
            tracking_uri = f"sqlite:///{tmp_path}/mlflow.db"
        return config_from_dict({
            "preset": "unit",
            "storage": {"uri": f"file://{tmp_path}/store"},
            "tracking": {"uri": tracking_uri, "retry_s": retry_s},
        })

    return make


def dead_client() -> MlflowClient:
    """A real MLflow REST client whose server is not there: every call is connection-refused."""
    (port,) = free_ports(1)
    return MlflowClient(tracking_uri=f"http://127.0.0.1:{port}")


@pytest.fixture
def tracker(tmp_path, make_cfg):
    t = Tracker(make_cfg(tmp_path))
    yield t
    t.close(timeout=0)


@pytest.fixture
def registry(tracker) -> ModelRegistry:
    return ModelRegistry(tracker.cfg)


@pytest.fixture
def reader(tracker) -> MlflowClient:
    return MlflowClient(tracking_uri=tracker.tracking_uri, registry_uri=tracker.tracking_uri)


def history(reader: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in reader.get_metric_history(run_id, key))


def test_runs_nest_and_end_with_status(tracker, reader, tmp_path):
    with tracker.run("pipeline", tags={"trigger": "test"}) as parent:
        with tracker.run("rft") as child:
            pass
        with pytest.raises(ZeroDivisionError), tracker.run("dapo") as failed:
            1 / 0
    runs = {r: reader.get_run(r) for r in (parent, child, failed)}
    assert runs[child].data.tags["mlflow.parentRunId"] == parent
    assert runs[failed].data.tags["mlflow.parentRunId"] == parent
    assert "mlflow.parentRunId" not in runs[parent].data.tags
    assert runs[parent].data.tags["trigger"] == "test"
    assert {r: runs[r].info.status for r in runs} == {parent: "FINISHED", child: "FINISHED",
                                                      failed: "FAILED"}
    exp = reader.get_experiment(runs[parent].info.experiment_id)
    assert exp.name == "swerl-unit"
    assert exp.artifact_location == f"file://{tmp_path}/store/mlflow"


def test_params_from_config_and_truncation(tracker, reader):
    with tracker.run("p") as run_id:
        tracker.log_config()
        tracker.log_params({"long": "x" * 7000})
    params = reader.get_run(run_id).data.params
    assert params["rollout.sampling.temperature"] == "1.0"
    assert params["dapo.stages.0.eps_high"] == "0.28"
    assert len(params["long"]) == 6000 and params["long"].endswith("...")


def test_a_resumed_run_with_a_changed_config_tags_the_changes(tracker, reader):
    with tracker.run("p") as run_id:
        tracker.log_config()
        tracker.log_params({"note": "kept"})
    resumed = tracker.cfg.model_copy(update={"seed": 7})
    changed = tracker.log_config_changes(resumed, run_id)
    assert changed == {"seed": ("0", "7")}
    tracker.flush()
    run = reader.get_run(run_id)
    assert run.data.params["seed"] == "0"  # write-once
    assert run.data.tags["swerl.resumed.seed"] == "0 -> 7"
    assert tracker.log_config_changes(tracker.cfg, run_id) == {}


def test_metrics_are_batched(tracker, reader, monkeypatch):
    calls = []
    real = tracker.client.log_batch
    monkeypatch.setattr(tracker.client, "log_batch",
                        lambda run_id, **kw: calls.append(kw) or real(run_id, **kw))
    with tracker.run("m") as run_id:
        for step in (1, 2):
            tracker.log_metrics({f"m{i}": i * step for i in range(50)}, step=step)
        assert len(calls) == 2, "one request per log_metrics call, not one per value"
        tracker.log_metrics({f"big{i}": i for i in range(2500)}, step=0)
        assert [len(c["metrics"]) for c in calls[2:]] == [1000, 1000, 500]  # MLflow's batch cap
    assert history(reader, run_id, "m7") == [(1, 7.0), (2, 14.0)]
    assert history(reader, run_id, "big2499") == [(0, 2499.0)]


def test_metrics_callback_for_library_code(tracker, reader):
    with tracker.run("r") as run_id:
        on_metrics = tracker.metrics_callback(prefix="rollout/")
        on_metrics({"reward": 0.5, "turns": 7}, 3)
    assert history(reader, run_id, "rollout/reward") == [(3, 0.5)]
    assert history(reader, run_id, "rollout/turns") == [(3, 7.0)]


def test_metrics_sent_again_by_a_resume_are_logged_once(tracker, reader):
    """A resumed DAPO iteration re-sends its metrics: kept if MLflow lost them, skipped if not."""
    with tracker.run("r") as run_id:
        tracker.log_metrics({"loss": 0.5, "kept": 3}, step=0)
        assert not tracker.log_missing_metrics({"loss": 0.5, "kept": 3}, step=0)
        assert tracker.log_missing_metrics({"loss": 0.25, "kept": 4}, step=1)
    assert history(reader, run_id, "loss") == [(0, 0.5), (1, 0.25)]
    assert history(reader, run_id, "kept") == [(0, 3.0), (1, 4.0)]


def test_metrics_sent_again_are_logged_when_mlflow_cannot_say_it_has_them(tracker, reader, monkeypatch):
    def unreadable(*a, **k):
        raise ConnectionError("connection refused")

    with tracker.run("r") as run_id:
        monkeypatch.setattr(tracker.client, "get_metric_history", unreadable)
        assert tracker.log_missing_metrics({"loss": 0.5}, step=2)
    assert history(reader, run_id, "loss") == [(2, 0.5)]


def test_dataset_input(tracker, reader):
    digest = "ab" * 32
    with tracker.run("d") as run_id:
        tracker.log_dataset_input("synth-train", digest, "s3://b/datasets/synth-train/abab/tasks.jsonl", 12)
    (inp,) = reader.get_run(run_id).inputs.dataset_inputs
    assert inp.dataset.name == "synth-train"
    assert inp.dataset.digest == digest[:36]
    assert inp.dataset.source_type == "s3"
    assert json.loads(inp.dataset.source) == {"uri": "s3://b/datasets/synth-train/abab/tasks.jsonl"}
    assert json.loads(inp.dataset.profile) == {"num_rows": 12, "sha256": digest}
    assert [(t.key, t.value) for t in inp.tags] == [("mlflow.data.context", "train")]


def test_artifacts_land_in_the_store(tracker, tmp_path):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "swerl.json").write_text("{}")
    with tracker.run("a") as run_id:
        tracker.log_dict({"pass@1": 0.25}, "eval/report.json")
        tracker.log_artifact(tmp_path / "ck" / "swerl.json", "checkpoint")
    keys = Store(f"file://{tmp_path}/store").ls("mlflow")
    assert f"mlflow/{run_id}/artifacts/eval/report.json" in keys
    assert f"mlflow/{run_id}/artifacts/checkpoint/swerl.json" in keys


def test_registry(tracker, registry, reader):
    name = registry.model_name
    with tracker.run("promote") as run_id:
        assert registry.get_version_by_alias(name, "champion") is None  # no model yet
        v1 = registry.register_model("s3://b/runs/r/checkpoints/rft-0", run_id, tags={"stage": "rft"})
        v2 = registry.register_model("s3://b/runs/r/checkpoints/dapo-1", run_id)
    assert (v1, v2) == ("1", "2")
    registry.set_alias(name, "champion", v1)
    registry.set_alias(name, "challenger", v2)
    assert registry.get_version_by_alias(name, "champion") == "1"
    assert registry.get_version_by_alias(name, "challenger") == "2"
    assert registry.get_version_by_alias(name, "retired") is None
    registry.set_version_tags(name, v2, {"pass_at_1": 0.31, "sem": 0.02})
    mv = reader.get_model_version(name, "2")
    assert mv.tags == {"pass_at_1": "0.31", "sem": "0.02"}
    assert mv.source == "s3://b/runs/r/checkpoints/dapo-1" and mv.run_id == run_id
    assert reader.get_model_version(name, "1").tags == {"stage": "rft"}
    assert registry.get_version_tags(name, 1) == {"stage": "rft"}


def test_outage_buffers_then_everything_lands(tracker, reader):
    run_id = tracker.start_run("dapo")
    tracker.log_metrics({"reward": 0.0}, step=0)
    healthy = tracker.client
    tracker.client = dead_client()
    t0 = time.monotonic()
    for step in range(1, 6):
        tracker.log_metrics({"reward": step / 10}, step=step)
    tracker.set_tags({"phase": "outage"})
    tracker.log_params({"lr": "1e-6"})
    tracker.end_run()
    assert time.monotonic() - t0 < 5, "logging must not block while the backend is down"
    assert tracker.pending == {"metrics": 5, "tags": 1, "params": 1, "status": 1}
    assert history(reader, run_id, "reward") == [(0, 0.0)]
    assert reader.get_run(run_id).info.status == "RUNNING"

    tracker.client = healthy  # the backend is back
    assert tracker.flush() is True
    assert not tracker.pending and not tracker.dropped
    assert history(reader, run_id, "reward") == [(s, s / 10) for s in range(6)]
    run = reader.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["phase"] == "outage" and run.data.params["lr"] == "1e-6"


def test_outage_longer_than_window_drops_loudly(tmp_path, make_cfg, caplog):
    tracker = Tracker(make_cfg(tmp_path, retry_s=0.5))
    run_id = tracker.start_run("x")
    tracker.client = dead_client()
    tracker.log_metrics({"a": 1, "b": 2, "c": 3}, step=0)
    tracker.log_params({"p": 1, "q": 2})
    time.sleep(0.6)
    with caplog.at_level(logging.ERROR, logger="tasks.tracking"):
        assert tracker.flush() is False
    assert tracker.dropped == {"metrics": 3, "params": 2}
    assert not tracker.pending
    assert any("TRACKING DATA LOST" in r.message and "'metrics': 3" in r.message
               for r in caplog.records)
    assert tracker.close(timeout=0) == {"metrics": 3, "params": 2}
    assert run_id  # the run itself was created before the outage


def test_rejected_param_is_dropped_alone(tracker, reader):
    with tracker.run("r") as run_id:
        tracker.log_params({"a": "1"})
        tracker.log_params({"a": "2", "b": "3"})  # MLflow refuses to change a param
        tracker.log_metrics({"m": 1.0})
    assert tracker.dropped == {"params": 1}
    run = reader.get_run(run_id)
    assert run.data.params == {"a": "1", "b": "3"}
    assert run.data.metrics == {"m": 1.0}


def test_start_run_raises_when_backend_stays_down(tmp_path, make_cfg):
    (port,) = free_ports(1)
    tracker = Tracker(make_cfg(tmp_path, retry_s=1.0, tracking_uri=f"http://127.0.0.1:{port}"))
    t0 = time.monotonic()
    with pytest.raises(TrackingUnavailable, match="unreachable for 1s"):
        tracker.start_run("x")
    assert time.monotonic() - t0 < 10


def test_check_tracking(tmp_path, make_cfg):
    cfg = make_cfg(tmp_path)
    assert check_tracking(cfg) == cfg.tracking.uri
    (port,) = free_ports(1)
    with pytest.raises(Exception, match="127.0.0.1"):
        check_tracking(make_cfg(tmp_path, tracking_uri=f"http://127.0.0.1:{port}"))


def test_relative_sqlite_uri_resolves_against_cwd(tmp_path, monkeypatch, template_db):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".swerl").mkdir()
    shutil.copy(template_db, tmp_path / ".swerl" / "mlflow.db")  # the client opens it at once
    tracker = Tracker(config_from_dict({"preset": "smoke"}))
    assert tracker.tracking_uri == f"sqlite:///{tmp_path}/.swerl/mlflow.db"
    assert tracker.artifact_location == f"file://{tmp_path}/.swerl/store/mlflow"
    assert ModelRegistry(tracker.cfg).model_name == "swerl-agent"
