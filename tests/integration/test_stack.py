"""The local stack end to end: compose up, `swerl deploy`, a worker runs the pipeline, down -v.

The test brings up its own stack (own compose project, own generated env file, free ports), so
it runs beside a stack you have up and never touches your `.env` or volumes. The first run
builds the images (minutes); later runs reuse them.

Parts that need code not written yet skip with the reason: deploying needs every flow file of
prefect.yaml, running the pipeline needs flows/pipeline.py.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import socket
import subprocess
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PY = ROOT / ".venv" / "bin" / "python"
STACK = ["bash", str(ROOT / "infra" / "stack.sh")]
SERVICES = {"postgres", "s3", "prefect-server", "mlflow", "worker-cpu"}
# SeaweedFS also listens on each of these + 10000 (gRPC).
WEED_PORTS = ("SWERL_S3_PORT", "SWERL_WEED_MASTER_PORT", "SWERL_WEED_VOLUME_PORT", "SWERL_WEED_FILER_PORT")
OTHER_PORTS = ("SWERL_PG_PORT", "SWERL_PREFECT_PORT", "SWERL_MLFLOW_PORT", "SWERL_CPU_WORKER_PORT")

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(5400)]


def _entrypoint_files() -> list[Path]:
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    return [ROOT / d["entrypoint"].split(":")[0] for d in spec["deployments"]]


MISSING_FLOWS = [str(p.relative_to(ROOT)) for p in _entrypoint_files() if not p.exists()]
needs_all_flows = pytest.mark.skipif(bool(MISSING_FLOWS), reason=f"flows not written yet: {MISSING_FLOWS}")
needs_pipeline = pytest.mark.skipif(not (ROOT / "flows" / "pipeline.py").exists(),
                                    reason="flows/pipeline.py not written yet")


# ---------------------------------------------------------------- helpers
def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _free_ports() -> dict[str, str]:
    """Free loopback ports for every stack port; SeaweedFS's need their +10000 twin free too."""
    rng, taken, out = random.Random(), set(), {}
    for key in WEED_PORTS + OTHER_PORTS:
        while True:
            p = rng.randrange(20000, 45000)
            twins = {p, p + 10000} if key in WEED_PORTS else {p}
            if not twins & taken and all(_port_free(t) for t in twins):
                break
        taken |= twins
        out[key] = str(p)
    return out


def _listening() -> dict[int, set[str]]:
    """Listening TCP sockets of this network namespace (the stack's, as it uses the host's)."""
    out: dict[int, set[str]] = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(name).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state != "0A":  # LISTEN
                continue
            addr, port = local.split(":")
            ip = socket.inet_ntoa(bytes.fromhex(addr)[::-1]) if len(addr) == 8 else f"v6:{addr}"
            out.setdefault(int(port, 16), set()).add(ip)
    return out


def _run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 600,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed (rc={out.returncode}):\n"
                             f"{out.stdout[-3000:]}\n{out.stderr[-6000:]}")
    return out


@dataclass
class Stack:
    project: str
    env_file: Path
    values: dict[str, str]
    shell_env: dict[str, str]
    up_log: str

    def url(self, port_key: str, path: str = "") -> str:
        return f"http://127.0.0.1:{self.values[port_key]}{path}"

    @property
    def prefect_api(self) -> str:
        return self.url("SWERL_PREFECT_PORT", "/api")

    def compose(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run(["docker", "compose", "--project-directory", str(ROOT), "-f",
                     str(ROOT / "docker-compose.yml"), "--env-file", str(self.env_file),
                     "-p", self.project, *args], env=self.shell_env, check=check)

    def s3(self, key: str | None = None, secret: str | None = None):
        import s3fs

        return s3fs.S3FileSystem(key=key or self.values["SWERL_S3_ACCESS_KEY"],
                                 secret=secret or self.values["SWERL_S3_SECRET_KEY"],
                                 client_kwargs={"endpoint_url": self.url("SWERL_S3_PORT")},
                                 skip_instance_cache=True)

    @contextmanager
    def prefect_client(self) -> Iterator[Any]:
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings({PREFECT_API_URL: self.prefect_api}), get_client(sync_client=True) as client:
            yield client


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode:
        pytest.skip("no reachable Docker daemon")
    if not PY.exists():
        pytest.skip(f"{PY} missing (make venv)")
    project = f"swerl-it-{uuid.uuid4().hex[:8]}"
    env_file = tmp_path_factory.mktemp("stack") / ".env"
    _run([str(PY), "infra/gen_env.py", str(env_file),
          *(f"{k}={v}" for k, v in _free_ports().items())])
    from dotenv import dotenv_values

    values = {k: v or "" for k, v in dotenv_values(env_file).items()}
    shell_env = {**os.environ, "SWERL_ENV_FILE": str(env_file), "COMPOSE_PROJECT_NAME": project}
    try:
        up = _run(STACK + ["up"], env=shell_env, timeout=3600)
        yield Stack(project, env_file, values, shell_env, up.stderr)
    finally:
        _run(STACK + ["down", "-v"], env=shell_env, check=False)


# ---------------------------------------------------------------- the stack itself
def test_every_service_is_healthy(stack: Stack) -> None:
    print(*[l for l in stack.up_log.splitlines() if re.search(r"built |healthy in", l)], sep="\n")
    out = stack.compose("ps", "-a", "--format", "json").stdout
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert {r["Service"] for r in rows} == SERVICES
    for r in rows:
        assert r["State"] == "running" and r["Health"] == "healthy", r
    labels = _run(["docker", "ps", "--filter", f"label=com.docker.compose.project={stack.project}",
                   "--filter", "label=swerl", "-q"]).stdout.split()
    assert len(labels) == len(SERVICES), "every stack container carries the `swerl` label"


def test_servers_listen_on_loopback_only(stack: Stack) -> None:
    listening = _listening()
    ports = [int(stack.values[k]) for k in OTHER_PORTS + WEED_PORTS]
    ports += [int(stack.values[k]) + 10000 for k in WEED_PORTS]
    for port in ports:
        assert listening.get(port) == {"127.0.0.1"}, f"port {port}: {listening.get(port)}"


def test_credentials_are_enforced(stack: Stack) -> None:
    bucket = stack.values["SWERL_S3_BUCKET"]
    good = stack.s3()
    good.pipe(f"{bucket}/_probe/x", b"ok")
    assert good.cat(f"{bucket}/_probe/x") == b"ok"
    with pytest.raises(PermissionError):
        stack.s3("wrong", "wrong").pipe(f"{bucket}/_probe/y", b"no")
    good.rm(f"{bucket}/_probe", recursive=True)

    port = stack.values["SWERL_PG_PORT"]
    ok_url = f"postgresql://mlflow:{stack.values['SWERL_PG_MLFLOW_PASSWORD']}@127.0.0.1:{port}/mlflow"
    bad_url = f"postgresql://mlflow:wrong@127.0.0.1:{port}/mlflow"
    assert stack.compose("exec", "-T", "postgres", "psql", ok_url, "-tAc", "select 1").stdout.strip() == "1"
    bad = stack.compose("exec", "-T", "postgres", "psql", bad_url, "-tAc", "select 1", check=False)
    assert bad.returncode != 0 and "password authentication failed" in bad.stderr


def test_mlflow_and_prefect_use_postgres(stack: Stack) -> None:
    tables = stack.compose("exec", "-T", "postgres", "psql", "-d", "mlflow", "-tAc",
                           "select count(*) from information_schema.tables where table_name = 'experiments'")
    assert tables.stdout.strip() == "1"
    tables = stack.compose("exec", "-T", "postgres", "psql", "-d", "prefect", "-tAc",
                           "select count(*) from information_schema.tables where table_name = 'flow_run'")
    assert tables.stdout.strip() == "1"


# ---------------------------------------------------------------- deployments
def _deploy(stack: Stack) -> list[str]:
    from flows.deploy import deploy
    from swerl.config import load_config

    return deploy(load_config("smoke"), stack_env=stack.env_file)


@needs_all_flows
def test_deploy_creates_pools_limits_and_scheduled_deployments(stack: Stack) -> None:
    from swerl.config import load_config

    cfg = load_config("smoke")
    names = _deploy(stack)
    assert len(names) == len(_entrypoint_files())
    with stack.prefect_client() as client:
        first = {d.name: d.id for d in client.read_deployments()}
        assert _deploy(stack) == names, "deploying twice gives the same deployments"
        deployments = {d.name: d for d in client.read_deployments()}
        assert {k: d.id for k, d in deployments.items()} == first, "upserted, not duplicated"

        cpu_pool, gpu_pool = stack.values["SWERL_CPU_POOL"], stack.values["SWERL_GPU_POOL"]
        for pool in (cpu_pool, gpu_pool):
            assert client.read_work_pool(pool).type == "process"
        assert client.read_concurrency_limit_by_tag("gpu").concurrency_limit == cfg.orchestration.gpu_limit
        assert client.read_concurrency_limit_by_tag("sandbox").concurrency_limit == cfg.orchestration.sandbox_limit

        pipeline = deployments["pipeline"]
        assert pipeline.work_pool_name == cpu_pool
        assert pipeline.parameters["preset"] == "smoke"
        assert f"storage.s3_endpoint_url={stack.url('SWERL_S3_PORT')}" in pipeline.parameters["overrides"]
        assert f"tracking.uri={stack.url('SWERL_MLFLOW_PORT')}" in pipeline.parameters["overrides"]
        assert set(pipeline.parameter_openapi_schema["properties"]) >= {"preset", "overrides", "run_id"}
        assert deployments["dapo"].work_pool_name == gpu_pool

        crons = {name: [s.schedule.cron for s in d.schedules] for name, d in deployments.items() if d.schedules}
        assert crons == {"evaluate": ["0 3 * * *"], "curate": ["0 4 * * 1"]}
        nightly = deployments["evaluate"].schedules[0]
        assert "rollout.model=models:/swerl-agent@champion" in nightly.parameters["overrides"]

    # The CLI view an operator gets: `prefect deployment ls` with the schedules.
    env = {**os.environ, "PREFECT_API_URL": stack.prefect_api}
    listed = json.loads(_run([str(PY), "-m", "prefect", "deployment", "ls", "-o", "json"], env=env).stdout)
    listed_crons = {d["name"]: [s["schedule"]["cron"] for s in d["schedules"]] for d in listed if d["schedules"]}
    assert {d["name"] for d in listed} >= {n.split("/")[1] for n in names}
    assert listed_crons == crons


# ---------------------------------------------------------------- the pipeline on a worker
@needs_all_flows
@needs_pipeline
def test_worker_runs_the_smoke_pipeline(stack: Stack) -> None:
    from mlflow import MlflowClient
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    names = _deploy(stack)
    run_id = f"stack-{uuid.uuid4().hex[:8]}"
    t0 = time.time()
    with temporary_settings({PREFECT_API_URL: stack.prefect_api}):
        flow_run = run_deployment(next(n for n in names if n.endswith("/pipeline")),
                                  parameters={"preset": "smoke", "run_id": run_id},
                                  timeout=4800, poll_interval=10)
    print(f"pipeline flow run {flow_run.id}: {flow_run.state.name} in {time.time() - t0:.0f}s")
    if not flow_run.state.is_completed():
        print(stack.compose("logs", "--tail", "200", "worker-cpu", check=False).stdout[-8000:])
    assert flow_run.state.is_completed(), flow_run.state

    mlflow = MlflowClient(tracking_uri=stack.url("SWERL_MLFLOW_PORT"))
    experiment = mlflow.get_experiment_by_name("swerl-smoke")
    assert experiment is not None
    assert mlflow.search_runs([experiment.experiment_id]), "the pipeline logged runs"
    # search_model_versions leaves `aliases` empty; the registered model has them.
    aliases = mlflow.get_registered_model("swerl-agent").aliases
    assert aliases and set(aliases) <= {"champion", "challenger"}, aliases
    assert mlflow.get_model_version("swerl-agent", next(iter(aliases.values()))).run_id
    rows = stack.compose("exec", "-T", "postgres", "psql", "-d", "mlflow", "-tAc",
                         "select count(*) from runs").stdout.strip()
    assert int(rows) >= 1, "MLflow's runs are in PostgreSQL"

    s3 = stack.s3()
    bucket = stack.values["SWERL_S3_BUCKET"]
    checkpoints = s3.ls(f"{bucket}/store/runs/{run_id}/checkpoints")
    assert checkpoints, "the run's checkpoints are in the bucket"
    # Artifacts go either straight to S3 (an experiment located in the store) or through the
    # server's proxy, which keeps them under s3://BUCKET/mlflow.
    location = experiment.artifact_location
    prefix = location.removeprefix("s3://") if location.startswith("s3://") else f"{bucket}/mlflow"
    assert s3.find(prefix), f"MLflow's artifacts ({location}) are in the bucket"


# ---------------------------------------------------------------- teardown
def test_down_v_leaves_nothing(stack: Stack) -> None:
    _run(STACK + ["down", "-v"], env=stack.shell_env)
    label = f"label=com.docker.compose.project={stack.project}"
    assert _run(["docker", "ps", "-a", "-q", "--filter", label]).stdout.split() == []
    assert _run(["docker", "volume", "ls", "-q", "--filter", label]).stdout.split() == []
    listening = _listening()
    assert not [k for k in OTHER_PORTS + WEED_PORTS if int(stack.values[k]) in listening]
