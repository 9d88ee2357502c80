"""The pipeline deployment's typed parameters, on a real (temporary) Prefect server: the schema
is a form, a wrong-typed value is refused when the run is created, a typed run made through the
API (as the UI makes it) runs, and no task result lands on the worker's disk."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BAD = {  # what the UI form or an API caller could send, and what the server says
    "preset": ({"preset": "nope"}, "Validation failed for field 'params.preset'. Failure reason: 'nope' is not one of"),
    "seed": ({"preset": "smoke", "seed": "three"}, "Validation failed for field 'params.seed'"),
    "misspelt": ({"presett": "smoke"}, "'presett' was unexpected"),
}


@pytest.fixture(scope="module")
def prefect_api():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


def test_pipeline_schema_is_a_form_and_refuses_wrong_types(prefect_api, tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.exceptions import PrefectHTTPStatusError
    from prefect.flow_engine import run_flow
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings

    from flows.pipeline import pipeline
    from flows.run_params import PRESETS
    from swerl.store import open_store
    from swerl.config import load_config
    from tasks.run_config import config_key

    schema = pipeline.parameters.model_dump()
    form = schema["definitions"]["PipelineParams"]["properties"]
    assert form["preset"]["enum"] == list(PRESETS) and "smoke" in PRESETS
    assert {"seed", "rollout_backend", "dapo_iterations", "eval_runs", "overrides", "run_id"} <= set(form)

    deployment_id = pipeline.to_deployment(name=f"params-{uuid.uuid4().hex[:6]}",
                                           parameters={"params": {"preset": "smoke"}}).apply()
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment(deployment_id)
        assert deployment.enforce_parameter_schema
        assert deployment.parameter_openapi_schema["definitions"]["PipelineParams"]["properties"] == form
        for what, (params, message) in BAD.items():
            with pytest.raises(PrefectHTTPStatusError, match="409") as err:
                client.create_flow_run_from_deployment(deployment_id, parameters={"params": params})
            assert message in err.value.response.json()["detail"], what

        # the smallest real pipeline: base evaluation of one task, registration, promotion, report
        monkeypatch.setenv("SWERL_STATE", str(tmp_path / "state"))
        where = [f"storage.uri=file://{tmp_path}/store", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
                 "difficulty.enabled=false", "eval.max_tasks=1", "eval.each_dapo_checkpoint=false"]
        typed = {"preset": "smoke", "rft": False, "dapo": False, "eval_runs": 1, "seed": 3, "overrides": where,
                 "run_id": f"params-{uuid.uuid4().hex[:8]}"}
        flow_run = client.create_flow_run_from_deployment(deployment_id, parameters={"params": typed})
        assert flow_run.parameters == {"params": typed}
        results = tmp_path / "prefect-results"
        with temporary_settings({PREFECT_LOCAL_STORAGE_PATH: results}):
            state = run_flow(pipeline, flow_run=flow_run, parameters=flow_run.parameters, return_type="state")
        assert state.is_completed(), state
        assert client.read_flow_run(flow_run.id).state.is_completed()
        episodes = [a for a in _artifacts("swerl-episodes-eval-base-0") if a.flow_run_id == flow_run.id]
        assert [(a.type, float(a.data)) for a in episodes] == [("progress", 100.0)], "the evaluation's episodes"
        assert episodes[0].description == f"episodes of eval-base/0 in run {typed['run_id']}: 1 of 1"
    assert not results.exists() or not any(results.iterdir()), "task results persisted on the worker"
    cfg = load_config("smoke", ["seed=3", "eval.runs=1", "rft.enabled=false", "dapo.enabled=false", *where])
    stored = open_store(cfg.storage).get_text(config_key(typed["run_id"]))
    assert "seed: 3" in stored and load_config("smoke").seed != 3


def test_calling_the_flow_with_a_wrong_type_fails_before_it_runs(prefect_api):
    from prefect.exceptions import ParameterTypeError

    from flows.pipeline import pipeline

    with pytest.raises(ParameterTypeError, match="params.preset: Input should be 'cpu-demo-1turn'"):
        pipeline(params={"preset": "nope"})


def test_progress_artifact_counts_steps(prefect_api):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from tasks.progress import FlowProgress

    @flow
    def three_steps() -> None:
        progress = FlowProgress("swerl-test-progress", "DAPO iterations of run r", 3)
        for name in ("dapo-s1-0", "dapo-s1-1", "dapo-s1-2"):
            progress.step(name)

    three_steps()
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["swerl-test-progress"])))
    assert [a.type for a in found] == ["progress"]
    assert float(found[0].data) == 100.0
    assert found[0].description == "DAPO iterations of run r: 3 of 3 (last: dapo-s1-2)"


def _artifacts(key: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))


def test_episode_progress_of_a_real_rollout_in_a_task(prefect_api, monkeypatch):
    """The rollout engine's callback, inside a Prefect task, keeps one progress artifact per
    batch; updates are throttled (the count reaching its total always goes out); outside
    Prefect, or with the API failing, the run goes on."""
    from prefect import flow, task

    import tasks.progress as progress
    from tests.unit.test_rollout_engine import Gym, ScriptedBackend, reward, spec
    from tests.unit.test_rollout_engine import tasks as fake_tasks
    from training.rollout import collect

    sent: list[float] = []
    real_update = progress.update_progress_artifact

    def counting_update(artifact_id, value, description=None):
        sent.append(value)
        return real_update(artifact_id, value, description=description)

    monkeypatch.setattr(progress, "update_progress_artifact", counting_update)
    batch = f"eval-{uuid.uuid4().hex[:6]}/0"

    @task
    def evaluate(min_interval_s: float) -> int:
        on_episodes = progress.EpisodeProgress("r", min_interval_s=min_interval_s)
        stats = collect(fake_tasks(6), 2, ScriptedBackend(), Gym(), spec(), reward, progress=False,
                        on_progress=lambda done, total: on_episodes(batch, done, total))
        return stats.episodes

    @flow
    def evaluation(min_interval_s: float) -> int:
        return evaluate(min_interval_s)

    assert evaluation(3600.0) == 12
    found = _artifacts(progress.artifact_key(f"swerl-episodes-{batch}"))
    assert [a.type for a in found] == ["progress"] and float(found[0].data) == 100.0
    assert found[0].description == f"episodes of {batch} in run r: 12 of 12"
    assert sent == [100.0], "an hour between updates: only the final count went out"

    sent.clear()
    assert evaluation(0.0) == 12
    assert sent == [round(100 * n / 12, 1) for n in range(1, 13)], "no throttle: one update per episode"

    calls = progress.EpisodeProgress("r", min_interval_s=0.0)
    calls(batch, 1, 2)  # not in a Prefect run: nothing is sent
    assert len(_artifacts(progress.artifact_key(f"swerl-episodes-{batch}"))) == 2 and sent[-1] == 100.0

    def failing(*args, **kwargs):
        raise ConnectionError("API down")

    monkeypatch.setattr(progress, "update_progress_artifact", failing)
    assert evaluation(0.0) == 12, "a failing progress API costs the run nothing"


def test_readme_deploy_command_targets_the_stack(prefect_api, tmp_path):
    """`swerl deploy --api-url http://127.0.0.1:PORT/api` with a stack's .env (here: one whose
    Prefect port is this test's server): every deployment's runs go to the stack's S3 bucket and
    MLflow server, not to the config's file:// store and SQLite file."""
    import importlib.util
    import os
    import subprocess
    import sys
    from urllib.parse import urlparse

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    root = Path(__file__).resolve().parents[2]
    api = PREFECT_API_URL.value()
    spec = importlib.util.spec_from_file_location("gen_env", root / "infra" / "gen_env.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    env_file = tmp_path / ".env"
    values = gen.ensure_env(env_file, {"SWERL_PREFECT_PORT": str(urlparse(api).port), "SWERL_S3_PORT": "18333",
                                       "SWERL_MLFLOW_PORT": "15000"})
    env = {**os.environ, "SWERL_ENV_FILE": str(env_file), "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, "-m", "flows.cli", "deploy", "--preset", "smoke", "--api-url", api],
                         cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "pipeline/pipeline" in out.stdout
    stack = [f"storage.uri=s3://{values['SWERL_S3_BUCKET']}/store", "storage.s3_endpoint_url=http://127.0.0.1:18333",
             "tracking.uri=http://127.0.0.1:15000"]
    with get_client(sync_client=True) as client:
        for d in client.read_deployments():
            if d.name.startswith("params-"):  # the form test's own deployment on this server
                continue
            params = d.parameters["params"] if d.name == "pipeline" else d.parameters
            assert params["overrides"][:3] == stack, (d.name, params)

    # without a stack, the config's local defaults are refused, naming what to set
    env.pop("SWERL_ENV_FILE")
    out = subprocess.run([sys.executable, "-m", "flows.cli", "deploy", "--preset", "smoke", "--api-url", api,
                          "--from-config"], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "deployed runs would keep their results on each worker's disk" in out.stderr
    assert "Traceback" not in out.stderr
