"""The local stack end to end: compose up, `swerl deploy`, a worker runs the pipeline and is
SIGKILLed in DAPO, a new run of the deployment finishes the same run, down -v.

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
        params = pipeline.parameters["params"]  # one typed model: the UI's form (flows/run_params.py)
        assert params["preset"] == "smoke"
        assert f"storage.uri=s3://{stack.values['SWERL_S3_BUCKET']}/store" in params["overrides"]
        assert f"storage.s3_endpoint_url={stack.url('SWERL_S3_PORT')}" in params["overrides"]
        assert f"tracking.uri={stack.url('SWERL_MLFLOW_PORT')}" in params["overrides"]
        form = pipeline.parameter_openapi_schema["definitions"]["PipelineParams"]["properties"]
        assert {"preset", "seed", "dapo_iterations", "overrides", "run_id"} <= set(form)
        assert "smoke" in form["preset"]["enum"]
        assert set(deployments["evaluate"].parameter_openapi_schema["properties"]) >= {"preset", "overrides", "run_id"}
        assert deployments["dapo"].work_pool_name == gpu_pool
        from flows.deploy import DEPLOYMENT_TAG, ZOMBIE_AUTOMATION

        for d in deployments.values():  # what the zombie automation watches for
            assert d.job_variables["env"]["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == "30", d.name
            assert DEPLOYMENT_TAG in d.tags, d.name
        zombie = [a for a in client.read_automations_by_name(ZOMBIE_AUTOMATION) if a.name == ZOMBIE_AUTOMATION]
        assert len(zombie) == 1 and zombie[0].enabled, "deploying twice keeps one zombie automation"

        crons = {name: [s.schedule.cron for s in d.schedules] for name, d in deployments.items() if d.schedules}
        assert crons == {"evaluate": ["0 3 * * *"], "curate": ["0 4 * * 1"]}
        nightly = deployments["evaluate"].schedules[0]
        assert "rollout.model=models:/swerl-agent@champion" in nightly.parameters["overrides"]

    # The README's command, `swerl deploy --api-url URL` with the stack up, as a user runs it: the
    # deployments keep the stack's S3 and MLflow (not the config's file:// store and SQLite file).
    out = _run([str(PY), "-m", "flows.cli", "deploy", "--preset", "smoke", "--api-url", stack.prefect_api],
               env={**stack.shell_env, "PYTHONPATH": str(ROOT)})
    assert "pipeline/pipeline" in out.stdout, out.stdout
    with stack.prefect_client() as client:
        params = client.read_deployment_by_name("pipeline/pipeline").parameters["params"]
        assert f"storage.uri=s3://{stack.values['SWERL_S3_BUCKET']}/store" in params["overrides"], params
        assert f"tracking.uri={stack.url('SWERL_MLFLOW_PORT')}" in params["overrides"], params

    # What `swerl deploy` prints: each deployment with its pool and schedules.
    from flows.deploy import describe

    lines = describe(stack.prefect_api, names)
    print("\n".join(lines))
    for name, line in zip(names, lines):
        wanted = [f"cron '{c}' UTC" for c in crons.get(name.split("/")[1], [])] or ["no schedule"]
        assert line.startswith(name) and all(w in line for w in wanted), (line, wanted)

    # The CLI view an operator gets: `prefect deployment ls` with the schedules.
    env = {**os.environ, "PREFECT_API_URL": stack.prefect_api}
    listed = json.loads(_run([str(PY), "-m", "prefect", "deployment", "ls", "-o", "json"], env=env).stdout)
    listed_crons = {d["name"]: [s["schedule"]["cron"] for s in d["schedules"]] for d in listed if d["schedules"]}
    assert {d["name"] for d in listed} >= {n.split("/")[1] for n in names}
    assert listed_crons == crons


# ---------------------------------------------------------------- the pipeline on a worker
@dataclass
class PipelineRun:
    run_id: str
    flow_run: Any
    seconds: float


# What the stack is tested for is orchestration (a worker runs it, a SIGKILL is resumed), and
# tests/e2e runs every stage of the smoke preset already: here the pipeline skips the difficulty
# filter, RFT and the per-iteration evaluations, three of its seven rollout batches (CI's budget).
STACK_OVERRIDES = ["difficulty.enabled=false", "rft.enabled=false", "eval.each_dapo_checkpoint=false"]


def _run_pipeline(stack: Stack, names: list[str], run_id: str, timeout: float = 4800) -> PipelineRun:
    """Trigger the pipeline deployment on the smoke preset; wait up to `timeout` s (0: do not wait)."""
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    name = next(n for n in names if n.endswith("/pipeline"))
    with stack.prefect_client() as client:  # the deployment's own overrides point at the stack
        overrides = client.read_deployment_by_name(name).parameters["params"]["overrides"] + STACK_OVERRIDES
    t0 = time.time()
    with temporary_settings({PREFECT_API_URL: stack.prefect_api}):
        flow_run = run_deployment(name, parameters={"params": {"preset": "smoke", "run_id": run_id,
                                                               "overrides": overrides}},
                                  timeout=timeout, poll_interval=10)
    run = PipelineRun(run_id, flow_run, time.time() - t0)
    if timeout:
        print(f"pipeline flow run {flow_run.id} (run {run_id}): {flow_run.state.name} in {run.seconds:.0f}s")
        if not flow_run.state.is_completed():
            print(stack.compose("logs", "--tail", "200", "worker-cpu", check=False).stdout[-8000:])
    return run


# ---------------------------------------------------------------- SIGKILL in DAPO, then resume
@dataclass
class StoredRun:
    """What one pipeline run left in the bucket, read in one listing."""

    run_id: str
    prefix: str  # BUCKET/store/runs/RUN_ID
    objects: dict[str, dict[str, Any]]  # key below prefix -> S3 object info
    infos: dict[str, dict[str, Any]]  # sealed checkpoint -> its swerl.json

    def checkpoint_dirs(self) -> set[str]:
        return {k.split("/")[1] for k in self.objects if k.startswith("checkpoints/")}

    def episodes(self) -> dict[str, set[str]]:
        """Rollout batch ("dapo-s1/1") -> its episode records ("TASK__0")."""
        out: dict[str, set[str]] = {}
        for key in self.objects:
            if key.startswith("rollouts/") and key.endswith(".json"):
                batch, name = key.removeprefix("rollouts/").rsplit("/", 1)
                out.setdefault(batch, set()).add(name.removesuffix(".json"))
        return out

    def durable(self) -> dict[str, tuple[Any, Any]]:
        """Episode records and sealed checkpoints (what a resume must reuse, never rewrite):
        key -> (LastModified, ETag)."""
        return {k: (v.get("LastModified"), v.get("ETag")) for k, v in self.objects.items()
                if k.startswith("rollouts/") or (k.startswith("checkpoints/") and k.split("/")[1] in self.infos)}


def _stored_run(stack: Stack, run_id: str) -> StoredRun:
    from swerl.store import COMPLETE
    from training.checkpoint import INFO

    s3 = stack.s3()
    prefix = f"{stack.values['SWERL_S3_BUCKET']}/store/runs/{run_id}"
    objects = {k.removeprefix(prefix + "/"): v for k, v in s3.find(prefix, detail=True).items()}
    sealed = [k.split("/")[1] for k in objects if k.startswith("checkpoints/") and k.endswith("/" + COMPLETE)]
    infos = {name: json.loads(s3.cat(f"{prefix}/checkpoints/{name}/{INFO}")) for name in sealed}
    return StoredRun(run_id, prefix, objects, infos)


def _error_episodes(stack: Stack, run: StoredRun) -> set[str]:
    """Episode records of infrastructure errors: a resume runs those again (rollout.redo_errors)."""
    s3 = stack.s3()
    return {k for k in run.objects if k.startswith("rollouts/") and k.endswith(".json")
            and json.loads(s3.cat(f"{run.prefix}/{k}"))["status"] == "error"}


def _dapo_checkpoints(cfg: Any) -> list[str]:
    from training.run import checkpoint_name

    return [checkpoint_name(f"dapo-s{s + 1}", i) for s, stage in enumerate(cfg.dapo.stages)
            for i in range(stage.iterations)]


def _check_stages(stack: Stack, run: StoredRun, cfg: Any) -> None:
    """Every DAPO iteration exactly once, chained from the base model (the stack's runs skip
    RFT), each rolled out by its parent over whole groups."""
    s3 = stack.s3()

    def episode(batch: str, name: str) -> dict[str, Any]:
        return json.loads(s3.cat(f"{run.prefix}/rollouts/{batch}/{name}.json"))

    episodes = run.episodes()
    assert run.checkpoint_dirs() == set(run.infos), f"{run.run_id}: unsealed checkpoint directories left"
    dapo = _dapo_checkpoints(cfg)
    assert set(run.infos) == set(dapo), (run.run_id, sorted(run.infos))
    parent = "base"
    for name in dapo:
        info = run.infos[name]
        assert (info["parent"], info["run_id"], info["version"]) == (parent, run.run_id, name), info
        batch = f"{info['stage']}/{info['iteration']}"
        group = cfg.dapo.stages[int(info["stage"].removeprefix("dapo-s")) - 1].group_size
        tasks = {e.rsplit("__", 1)[0] for e in episodes[batch]}
        assert episodes[batch] == {f"{t}__{i}" for t in tasks for i in range(group)}, (batch, episodes[batch])
        assert {episode(batch, e)["policy_version"] for e in episodes[batch]} == {parent}, batch
        parent = name


def _wait_for(what: str, check: Any, timeout: float, interval: float = 2.0) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"gave up after {timeout:.0f}s waiting for {what}")


def _flow_run_processes(stack: Stack) -> dict[int, str]:
    """Host pid -> command line of the flow-run processes in the CPU worker's container. Prefect
    3.9's process worker starts `python -m prefect.runner._workspace_supervisor`, a child of the
    worker, which prepares the workspace and then execs `python -m prefect.engine` in place."""
    cid = stack.compose("ps", "-q", "worker-cpu").stdout.strip()
    top = _run(["docker", "top", cid, "-eo", "pid,args"]).stdout.splitlines()[1:]
    return {int(line.split()[0]): line.split(None, 1)[1] for line in top
            if re.search(r"-m prefect\.(engine|runner\._workspace_supervisor)\b", line)}


def _owner(hostname: str, host_pid: int) -> str:
    """The `swerl.owner` label the process stamps on its sandboxes (environments.sandbox.owner_label):
    the pid as its own PID namespace numbers it."""
    from environments.sandbox.lifecycle import proc_start_ticks as _proc_start_ticks

    nspid = re.search(r"^NSpid:\s+(.+)$", Path(f"/proc/{host_pid}/status").read_text(), re.M)
    assert nspid, f"/proc/{host_pid}/status has no NSpid line"
    return f"{hostname}:{nspid.group(1).split()[-1]}:{_proc_start_ticks(host_pid)}"


def _containers(label: str) -> list[str]:
    return _run(["docker", "ps", "-a", "-q", "--filter", f"label={label}"]).stdout.split()


def _batch(checkpoint: str) -> str:
    """The rollout batch a DAPO checkpoint learned from: dapo-s1-1 -> dapo-s1/1."""
    return "/".join(checkpoint.rsplit("-", 1))


def _rollout_lines(logs: str) -> dict[str, dict[str, Any]]:
    """training.stages' `BATCH rollouts: {json}` lines: episodes and reused per batch."""
    return {m[1]: json.loads(m[2]) for m in re.finditer(r"(\S+) rollouts: (\{.*\})", logs)}


@dataclass
class KilledAndResumed:
    """What the SIGKILL-then-resume scenario observed, for the tests below to check."""

    cfg: Any
    dapo: list[str]  # the DAPO checkpoints the preset makes, in order
    orphan_state: Any  # the killed flow run's state once Prefect gave up on it
    owner: str  # the `swerl.owner` label of the killed flow run's sandboxes
    left: list[str]  # its sandboxes still there right after the kill
    killed: StoredRun  # the bucket at the kill
    errors_then: set[str]  # infra-error episode records at the kill (a resume retries those)
    mlflow_ids: dict[str, str]  # the run's MLflow run ids at the kill
    resumed: PipelineRun  # the new flow run of the deployment with the same run_id
    after: StoredRun  # the bucket once it finished
    logs: str  # the restarted worker's log


@pytest.fixture(scope="module")
def killed_and_resumed(stack: Stack) -> KilledAndResumed:
    """Trigger the pipeline deployment, SIGKILL the CPU worker while the last DAPO iteration's
    episodes are in flight, restart the worker and run the deployment again with the same run_id.

    There is no separate uninterrupted run to compare with (CI's budget): what a resume must
    reuse is checked object by object against the bucket at the kill, and what it must produce
    against the preset."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from environments.sandbox.lifecycle import proc_start_ticks as _proc_start_ticks
    from flows.deploy import MISSED_BEATS, heartbeat_s, load_spec
    from swerl.config import load_config
    from swerl.store import COMPLETE

    cfg = load_config("smoke", STACK_OVERRIDES)
    dapo = _dapo_checkpoints(cfg)
    assert len(dapo) >= 2, "the smoke preset needs two DAPO iterations to kill between them"
    names = _deploy(stack)
    run_id = f"stack-kill-{uuid.uuid4().hex[:8]}"
    s3 = stack.s3()
    prefix = f"{stack.values['SWERL_S3_BUCKET']}/store/runs/{run_id}"

    with stack.prefect_client() as client:
        t0 = time.time()
        orphan = _run_pipeline(stack, names, run_id, timeout=0).flow_run

        def dapo_runs() -> list[Any]:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[orphan.id])))
            return sorted((t for t in runs if t.name.startswith("dapo-iteration")), key=lambda t: t.created)

        def in_last_iteration() -> bool:
            """The second-to-last DAPO checkpoint is sealed and the last iteration's task runs."""
            state = client.read_flow_run(orphan.id).state
            assert not state.is_final(), f"the run ended before its last DAPO iteration: {state}"
            s3.invalidate_cache()
            if not s3.exists(f"{prefix}/checkpoints/{dapo[-2]}/{COMPLETE}"):
                return False
            runs = dapo_runs()
            return len(runs) == len(dapo) and runs[-1].state is not None and runs[-1].state.is_running()

        _wait_for(f"{dapo[-1]} to start", in_last_iteration, timeout=3600)
        procs = _flow_run_processes(stack)
        assert len(procs) == 1, f"one flow-run process in the worker, found {procs}"
        pid = next(iter(procs))
        cid = stack.compose("ps", "-q", "worker-cpu").stdout.strip()
        hostname = _run(["docker", "inspect", "-f", "{{.Config.Hostname}}", cid]).stdout.strip()
        owner = _owner(hostname, pid)
        # Kill while the iteration's episodes are in flight, i.e. once their sandboxes exist.
        _wait_for(f"sandboxes owned by {owner}", lambda: _containers(f"swerl.owner={owner}"), timeout=300,
                  interval=1)
        t_kill = time.time()
        stack.compose("kill", "-s", "SIGKILL", "worker-cpu")
        # The worker is PID 1's child in the container's own PID namespace: when docker kills
        # PID 1 (the init), the kernel kills everything in that namespace, the flow run included.
        ticks = owner.rsplit(":", 1)[1]
        _wait_for("the flow-run process to die", lambda: _proc_start_ticks(pid) != ticks,
                  timeout=60, interval=0.5)
        left = _containers(f"swerl.owner={owner}")
        killed = _stored_run(stack, run_id)
        errors_then = _error_episodes(stack, killed)
        mlflow_ids = json.loads(s3.cat(f"{prefix}/mlflow_runs.json"))
        at_kill = {t.name: t.state.name for t in dapo_runs()}
        # The orphan's heartbeats stopped with it: `swerl deploy`'s automation marks it Crashed.
        beat = heartbeat_s(load_spec(ROOT / "prefect.yaml"))
        _wait_for("the automation to mark the orphan Crashed", lambda: client.read_flow_run(orphan.id).state.is_crashed(),
                  timeout=(MISSED_BEATS + 3) * beat + 60, interval=5)
        t_crashed = time.time()
        orphan_state = client.read_flow_run(orphan.id).state
        print(f"killed `{procs[pid]}` (pid {pid}, owner {owner}) {t_kill - t0:.0f}s after the trigger, "
              f"in {dapo[-1]}: DAPO task runs {at_kill}; "
              f"{len(killed.episodes().get(_batch(dapo[-1]), ()))} episodes of it stored; sealed "
              f"{sorted(killed.infos)}; {len(left)} sandboxes left; Prefect marked the flow run "
              f"{orphan_state.name} {t_crashed - t_kill:.0f}s after the kill: {orphan_state.message}")

        t_restart = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        stack.compose("up", "-d", "--wait", "worker-cpu")
        assert _flow_run_processes(stack) == {}, "the restarted worker runs no flow run of its own accord"
        # The orphan's task runs stay Running; the `gpu`/`sandbox` slots they held are leases that
        # the server revokes once they expire (60 s), so the new run may wait for its first slot.

    t1 = time.time()
    resumed = _run_pipeline(stack, names, run_id)
    logs = stack.compose("logs", "--no-log-prefix", "--since", t_restart, "worker-cpu").stdout
    with stack.prefect_client() as client:
        assert client.read_flow_run(orphan.id).state.is_crashed(), "the orphan stays Crashed"
    print(f"resumed run: {resumed.seconds:.0f}s ({t1 - t0:.0f}s from the first trigger to the resume)")
    return KilledAndResumed(cfg, dapo, orphan_state, owner, left, killed, errors_then, mlflow_ids,
                            resumed, _stored_run(stack, run_id), logs)


@needs_all_flows
@needs_pipeline
def test_sigkilled_worker_resumes_in_dapo(stack: Stack, killed_and_resumed: KilledAndResumed) -> None:
    """SIGKILL the CPU worker while the pipeline is in its last DAPO iteration; a new run of the
    deployment with the same run_id finishes it, reusing everything finished before the kill."""
    from mlflow import MlflowClient

    r = killed_and_resumed
    cfg, dapo, killed, after = r.cfg, r.dapo, r.killed, r.after
    assert "heartbeat" in (r.orphan_state.message or ""), r.orphan_state
    assert r.left, "the killed flow run left no sandbox behind: it was not killed mid-episode"
    assert dapo[-1] not in killed.infos, "killed too late: the last DAPO iteration had finished"
    assert r.resumed.flow_run.state.is_completed(), r.resumed.flow_run.state

    # The run ends as the preset says: every DAPO iteration once, chained, each rolled out by its
    # parent over whole groups; base and final evaluation over the same tasks and runs.
    _check_stages(stack, after, cfg)
    episodes, then = after.episodes(), killed.episodes()
    assert set(episodes) == {"eval-base/0", "eval-dapo/0", *map(_batch, dapo)}, sorted(episodes)
    assert len(episodes["eval-dapo/0"]) == len(episodes["eval-base/0"]) > 0

    # Nothing finished before the kill was redone: every episode record (but infra errors, which
    # a resume retries) and sealed checkpoint of that moment is still the very object written then.
    durable_then, durable_now = killed.durable(), after.durable()
    rewritten = sorted(k for k, stamp in durable_then.items() if durable_now.get(k) != stamp
                       and k not in r.errors_then)
    assert not rewritten, f"redone after the resume: {rewritten[:10]}"
    reused = sum(len(e) for e in then.values())
    total = sum(len(e) for e in episodes.values())
    for name in killed.infos:
        assert f"{name}: checkpoint already complete" in r.logs, f"no reuse of {name} in the worker's log"
    batches = _rollout_lines(r.logs)
    last = _batch(dapo[-1])
    assert last in batches, f"no `{last} rollouts:` line in the worker's log:\n{r.logs[-4000:]}"
    assert batches[last]["reused"] == len(then.get(last, ())) - len(
        {k for k in r.errors_then if k.startswith(f"rollouts/{last}/")}), batches[last]
    print(f"{reused} of {total} episodes reused, {total - reused} new; reused checkpoints "
          f"{sorted(killed.infos)}; rollouts of the resumed run "
          + ", ".join(f"{b} {v['reused']:.0f}/{v['episodes']:.0f} reused" for b, v in batches.items()))

    # MLflow: the resumed run logged into the killed run's runs, each DAPO step exactly once.
    s3 = stack.s3()
    mlflow = MlflowClient(tracking_uri=stack.url("SWERL_MLFLOW_PORT"))
    mlflow_ids_now = json.loads(s3.cat(f"{after.prefix}/mlflow_runs.json"))
    assert mlflow_ids_now.items() >= r.mlflow_ids.items(), (r.mlflow_ids, mlflow_ids_now)
    assert mlflow.get_run(r.mlflow_ids["parent"]).info.status == "FINISHED"
    steps = sorted(m.step for m in mlflow.get_metric_history(mlflow_ids_now["dapo"], "resolved_rate"))
    assert steps == list(range(len(dapo)))

    # The killed process's sandboxes were removed by the resumed run (their owner is gone).
    assert _containers(f"swerl.owner={r.owner}") == [], f"sandboxes of the killed flow run left: {r.owner}"


@needs_all_flows
@needs_pipeline
def test_worker_runs_the_smoke_pipeline(stack: Stack, killed_and_resumed: KilledAndResumed) -> None:
    """What the pipeline the worker finished left in the stack's servers: MLflow runs in
    PostgreSQL, a registered version with an alias, checkpoints and artifacts in the bucket."""
    from mlflow import MlflowClient

    flow_run, run_id = killed_and_resumed.resumed.flow_run, killed_and_resumed.resumed.run_id
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
    assert "preset: smoke" in s3.cat(f"{bucket}/store/runs/{run_id}/config.yaml").decode(), "the run's config too"
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
