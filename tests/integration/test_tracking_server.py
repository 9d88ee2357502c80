"""Tracker and ModelRegistry against real servers: an MLflow server that crashes mid-run, S3
(SeaweedFS) artifacts."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from swerl.config import config_from_dict
from swerl.store import Store
from tasks.registry import ModelRegistry
from tasks.tracking import Tracker
from tests.mlflow_server import mlflow_server
from tests.s3server import s3_server

pytestmark = pytest.mark.integration


def test_metrics_logged_during_a_server_outage_all_land(tmp_path: Path):
    with mlflow_server(tmp_path / "srv") as srv:
        cfg = config_from_dict({
            "preset": "outage",
            "storage": {"uri": f"file://{tmp_path}/store"},
            "tracking": {"uri": srv.url, "retry_s": 300},
        })
        tracker = Tracker(cfg)
        expected = {step: {"reward": step / 20, "loss": 1 / (step + 1)} for step in range(24)}
        with tracker.run("pipeline") as parent:
            tracker.log_config()
            with tracker.run("dapo") as run_id:
                for step in range(0, 8):
                    tracker.log_metrics(expected[step], step)
                srv.stop()  # the tracking server crashes in the middle of the stage
                t0 = time.monotonic()
                for step in range(8, 16):
                    tracker.log_metrics(expected[step], step)
                tracker.set_tags({"during_outage": "yes"})
                assert time.monotonic() - t0 < 10, "the training loop must not stall on tracking"
                assert tracker.pending["metrics"] == 16
                srv.start()
                for step in range(16, 24):
                    tracker.log_metrics(expected[step], step)
        dropped = tracker.close()
        assert dropped == {}, f"nothing may be lost across a recovered outage, lost {dropped}"

        reader = MlflowClient(tracking_uri=srv.url)
        for key in ("reward", "loss"):
            got = sorted((m.step, m.value) for m in reader.get_metric_history(run_id, key))
            assert got == [(s, pytest.approx(v[key])) for s, v in sorted(expected.items())]
        child, top = reader.get_run(run_id), reader.get_run(parent)
        assert child.data.tags["during_outage"] == "yes"
        assert child.data.tags["mlflow.parentRunId"] == parent
        assert (child.info.status, top.info.status) == ("FINISHED", "FINISHED")
        assert top.data.params["preset"] == "outage"


def test_s3_artifact_root_and_registry(tmp_path: Path, monkeypatch):
    with s3_server() as s3:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "MLFLOW_S3_ENDPOINT_URL",
                     "SWERL_S3_ENDPOINT_URL"):
            monkeypatch.delenv(name, raising=False)  # the tracker must get them from the config
        cfg = config_from_dict({
            "preset": "s3",
            "storage": {"uri": s3.uri("store"), "s3_endpoint_url": s3.url,
                        "s3_key": s3.key, "s3_secret": s3.secret},
            "tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db", "retry_s": 30},
        })
        tracker = Tracker(cfg)
        registry = ModelRegistry(cfg)
        report = tmp_path / "report.json"
        report.write_text('{"pass@1": 0.3}')
        with tracker.run("eval") as run_id:
            tracker.log_artifact(report, "eval")
            tracker.log_dict({"n": 10}, "eval/summary.json")
            version = registry.register_model(s3.uri("store/runs/r/checkpoints/dapo-1"), run_id)
        registry.set_alias(registry.model_name, "champion", version)
        assert tracker.close() == {}

        store = Store(s3.uri("store"), endpoint_url=s3.url, key=s3.key, secret=s3.secret)
        assert store.get_text(f"mlflow/{run_id}/artifacts/eval/report.json") == '{"pass@1": 0.3}'
        assert store.exists(f"mlflow/{run_id}/artifacts/eval/summary.json")
        assert registry.get_version_by_alias(registry.model_name, "champion") == version
