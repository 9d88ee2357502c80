"""`swerl deploy`: register every flow of prefect.yaml with a Prefect server.

prefect.yaml describes the deployments and Prefect's `prefect deploy --all` applies it. First,
through the client, this makes what that command does not: the work pools, the tag concurrency
limits (`gpu`: task runs holding the policy model; `sandbox`: task runs driving sandboxes) and
the zombie automation. Everything is an upsert: deploying twice changes nothing.

prefect.yaml's {{ $VAR }} placeholders (where runs go and keep their results) come from one of
two sources, never mixed: the local stack's generated .env (`stack_env`: whenever `make up` wrote
one and no other API is named), or else the config (`orchestration.*`, `storage.*`,
`tracking.uri`), which must then name a shared store and an MLflow server: a deployed run writing
to a worker's `file://` store or SQLite file is refused at deploy time. The preset and the tag
limits always come from the config.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from swerl.config import SwerlConfig

PROJECT_DIR = Path(__file__).resolve().parent.parent
PLACEHOLDER = re.compile(r"\{\{\s*\$(\w+)\s*\}\}")
# Deployed runs heartbeat as often as prefect.yaml's pools say (PREFECT_FLOWS_HEARTBEAT_FREQUENCY);
# one of them silent for MISSED_BEATS beats is marked Crashed by ZOMBIE_AUTOMATION. Only runs with
# the deployments' tag are watched: any other flow run heartbeats every 180 s (Prefect's default).
HEARTBEAT_ENV = "PREFECT_FLOWS_HEARTBEAT_FREQUENCY"
MISSED_BEATS = 3
DEPLOYMENT_TAG = "swerl"
ZOMBIE_AUTOMATION = "swerl: crash flow runs that stopped heartbeating"


class DeployError(RuntimeError):
    """The deployments could not be applied; the message says what to do."""


def default_stack_env(cfg: SwerlConfig, api_url: str | None = None, from_config: bool = False) -> Path | None:
    """The checkout's stack .env (`make up` writes it), unless `from_config` is asked for or the
    API named (`--api-url`, `orchestration.prefect_api_url`) is another server than the stack's:
    then the targets come from the config."""
    env_file = Path(os.environ.get("SWERL_ENV_FILE") or PROJECT_DIR / ".env")  # as infra/stack.sh picks it
    if from_config or not env_file.is_file():
        return None
    explicit = api_url or cfg.orchestration.prefect_api_url
    if explicit and explicit.rstrip("/") != stack_targets(env_file)["PREFECT_API_URL"]:
        return None
    return env_file


def local_targets(targets: dict[str, str]) -> list[str]:
    """Targets a worker would resolve on its own disk: a deployed run writing there is lost to
    everyone else (and to the next worker that resumes it)."""
    out = []
    if targets["SWERL_STORAGE_URI"].startswith("file://") or "://" not in targets["SWERL_STORAGE_URI"]:
        out.append(f"storage.uri={targets['SWERL_STORAGE_URI']}")
    if not targets["SWERL_TRACKING_URI"].startswith(("http://", "https://", "databricks")):
        out.append(f"tracking.uri={targets['SWERL_TRACKING_URI']}")
    return out


def stack_targets(env_file: Path) -> dict[str, str]:
    """The placeholder values for the stack an `infra/stack.sh up` .env describes."""
    from dotenv import dotenv_values

    v = {k: val or "" for k, val in dotenv_values(env_file).items()}
    need = ["SWERL_PREFECT_PORT", "SWERL_S3_PORT", "SWERL_S3_BUCKET", "SWERL_MLFLOW_PORT",
            "SWERL_CPU_POOL", "SWERL_GPU_POOL"]
    missing = [k for k in need if not v.get(k)]
    if missing:
        raise DeployError(f"{env_file} lacks {', '.join(missing)}: regenerate it with infra/stack.sh up")
    return {
        "PREFECT_API_URL": f"http://127.0.0.1:{v['SWERL_PREFECT_PORT']}/api",
        "SWERL_CPU_POOL": v["SWERL_CPU_POOL"],
        "SWERL_GPU_POOL": v["SWERL_GPU_POOL"],
        "SWERL_STORAGE_URI": f"s3://{v['SWERL_S3_BUCKET']}/store",
        "SWERL_S3_ENDPOINT_URL": f"http://127.0.0.1:{v['SWERL_S3_PORT']}",
        "SWERL_TRACKING_URI": f"http://127.0.0.1:{v['SWERL_MLFLOW_PORT']}",
    }


def config_targets(cfg: SwerlConfig) -> dict[str, str]:
    """The placeholder values from the config alone (a shared S3, MLflow and Prefect at scale)."""
    out = {
        "SWERL_CPU_POOL": cfg.orchestration.cpu_pool,
        "SWERL_GPU_POOL": cfg.orchestration.gpu_pool,
        "SWERL_STORAGE_URI": cfg.storage.uri,
        "SWERL_S3_ENDPOINT_URL": cfg.storage.s3_endpoint_url or "null",  # an override value: YAML null
        "SWERL_TRACKING_URI": cfg.tracking.uri,
    }
    if cfg.orchestration.prefect_api_url:
        out["PREFECT_API_URL"] = cfg.orchestration.prefect_api_url
    return out


def resolve_targets(cfg: SwerlConfig, api_url: str | None, stack_env: Path | None) -> dict[str, str]:
    """Placeholder values plus PREFECT_API_URL; never the ephemeral API (nothing would run there)."""
    targets = stack_targets(stack_env) if stack_env is not None else config_targets(cfg)
    url = api_url or cfg.orchestration.prefect_api_url or targets.get("PREFECT_API_URL") \
        or os.environ.get("PREFECT_API_URL")
    if not url:
        raise DeployError("no Prefect API to deploy to: start the stack (`make up`), or pass "
                          "--api-url, or set PREFECT_API_URL or orchestration.prefect_api_url")
    local = local_targets(targets)
    if local:
        raise DeployError(f"deployed runs would keep their results on each worker's disk ({', '.join(local)}): "
                          "start the stack (`make up`) and deploy to it, or set storage.uri=s3://... and "
                          "tracking.uri=http://... (an MLflow server) with --set")
    return {**targets, "PREFECT_API_URL": url.rstrip("/"), "SWERL_PRESET": cfg.preset}


def load_spec(prefect_file: Path) -> list[dict[str, Any]]:
    """The deployments of prefect.yaml, YAML anchors resolved."""
    spec = yaml.safe_load(prefect_file.read_text()) or {}
    deployments = spec.get("deployments") or []
    if not deployments:
        raise DeployError(f"{prefect_file} defines no deployments")
    return deployments


def missing_variables(deployments: list[dict[str, Any]], env: dict[str, str]) -> list[str]:
    """Placeholders that would stay literal (Prefect leaves unknown ones as they are).

    Only the deployments are checked: the pull step's $SWERL_CODE_DIR is read on the worker.
    """
    used = set(PLACEHOLDER.findall(json.dumps(deployments)))
    return sorted(v for v in used if not env.get(v))


def ensure_pools_and_limits(client: Any, pools: list[str], cfg: SwerlConfig) -> None:
    """Process work pools (with the process worker's job template) and the tag limits."""
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
    from prefect.workers.process import ProcessWorker

    for pool in dict.fromkeys(pools):
        try:
            client.read_work_pool(pool)
        except ObjectNotFound:
            try:
                client.create_work_pool(WorkPoolCreate(
                    name=pool, type=ProcessWorker.type,
                    base_job_template=ProcessWorker.get_default_base_job_template()))
            except ObjectAlreadyExists:  # a worker starting right now made it first
                pass
    client.create_concurrency_limit(tag="gpu", concurrency_limit=cfg.orchestration.gpu_limit)
    client.create_concurrency_limit(tag="sandbox", concurrency_limit=cfg.orchestration.sandbox_limit)


def heartbeat_s(deployments: list[dict[str, Any]]) -> int:
    """How often the deployments' runs heartbeat: prefect.yaml's pools set it, each must."""
    beats, unset = [], []
    for d in deployments:
        env = ((d.get("work_pool") or {}).get("job_variables") or {}).get("env") or {}
        if DEPLOYMENT_TAG not in (d.get("tags") or []) or not str(env.get(HEARTBEAT_ENV, "")).isdigit():
            unset.append(d.get("name"))
        else:
            beats.append(int(env[HEARTBEAT_ENV]))
    if unset:
        raise DeployError(f"deployments {unset} lack the tag {DEPLOYMENT_TAG!r} or {HEARTBEAT_ENV} in their "
                          "work_pool.job_variables.env: the zombie automation could not watch their runs")
    return max(beats)


def zombie_automation(heartbeat: int) -> Any:
    """Prefect's documented zombie detection, for deployed runs only (a local `swerl pipeline`
    takes its ephemeral server down with it): a run whose process died stays Running for good
    unless its silence marks it Crashed (resume it with the same run_id)."""
    from datetime import timedelta

    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    window = MISSED_BEATS * heartbeat
    return AutomationCore(
        name=ZOMBIE_AUTOMATION,
        description=f"A flow run tagged {DEPLOYMENT_TAG!r} that sent no heartbeat for {window} s (its process "
                    "is gone) is marked Crashed. Made by `swerl deploy` (flows/deploy.py).",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.*"},  # another beat, or any state change (a final one ends the watch)
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            match_related=ResourceSpecification({"prefect.resource.role": "tag",
                                                 "prefect.resource.id": f"prefect.tag.{DEPLOYMENT_TAG}"}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=window),
        ),
        actions=[ChangeFlowRunState(state=StateType.CRASHED, message=(
            f"no heartbeat for {window} s: its process died; resume it with the same run_id"))],
    )


def ensure_zombie_automation(client: Any, heartbeat: int) -> None:
    """Create or update ZOMBIE_AUTOMATION (an upsert by name, like everything `deploy` makes);
    an operator's choice to disable it is kept."""
    automation = zombie_automation(heartbeat)
    found = [a for a in client.read_automations_by_name(ZOMBIE_AUTOMATION) if a.name == ZOMBIE_AUTOMATION]
    if found:
        automation.enabled = found[0].enabled
        client.update_automation(found[0].id, automation)
        for extra in found[1:]:  # two deploys racing each made one
            client.delete_automation(extra.id)
    else:
        client.create_automation(automation)


def run_prefect_deploy(prefect_file: Path, targets: dict[str, str]) -> None:
    cmd = [sys.executable, "-m", "prefect", "deploy", "--all", "--prefect-file", str(prefect_file)]
    env = {**os.environ, **targets, "PREFECT_CLI_PROMPT": "false"}
    out = subprocess.run(cmd, cwd=prefect_file.parent, env=env, capture_output=True, text=True,
                         timeout=900)
    if out.returncode != 0:
        tail = "\n".join((out.stdout + out.stderr).strip().splitlines()[-40:])
        raise DeployError(f"`prefect deploy --all` failed (rc={out.returncode}):\n{tail}")


def read_back(client: Any, deployments: list[dict[str, Any]]) -> list[str]:
    """`flow/deployment` names as the server has them; raises if one of ours is missing."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    wanted = {(d["name"], d["entrypoint"]) for d in deployments}
    found = client.read_deployments(deployment_filter=DeploymentFilter(
        name=DeploymentFilterName(any_=sorted({name for name, _ in wanted}))))
    ours = [d for d in found if (d.name, d.entrypoint) in wanted]
    missing = wanted - {(d.name, d.entrypoint) for d in ours}
    if missing:
        raise DeployError(f"deployments missing after `prefect deploy`: {sorted(missing)}")
    return sorted(f"{client.read_flow(d.flow_id).name}/{d.name}" for d in ours)


def schedule_text(s: Any) -> str:
    """`cron '0 3 * * *' UTC (nightly-champion, active)`; interval and rrule schedules alike."""
    sch = s.schedule
    if getattr(sch, "cron", None):
        what = f"cron '{sch.cron}'"
    elif getattr(sch, "interval", None):
        what = f"every {sch.interval}"
    else:
        what = f"rrule '{getattr(sch, 'rrule', sch)}'"
    state = "active" if s.active else "paused"
    return f"{what} {getattr(sch, 'timezone', None) or 'UTC'} ({s.slug or 'unnamed'}, {state})"


def describe(api_url: str, names: list[str]) -> list[str]:
    """One line per deployment: its pool and schedules, which `prefect deployment ls` (3.9) does
    not show, so an operator sees right after deploying when the scheduled runs will come."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        found = [client.read_deployment_by_name(name) for name in names]
    width, pool_width = max(map(len, names), default=0), max((len(d.work_pool_name) for d in found), default=0)
    return [f"{name:<{width}}  pool {d.work_pool_name:<{pool_width}}  "
            + ("; ".join(schedule_text(s) for s in d.schedules) or "no schedule")
            for name, d in zip(names, found)]


def deploy(cfg: SwerlConfig, api_url: str | None = None, *, stack_env: Path | None = None,
           prefect_file: Path | None = None) -> list[str]:
    """Create pools, tag limits and every deployment of prefect.yaml; return `flow/deployment` names.

    `stack_env`: the local stack's .env (see `default_stack_env`); None = targets from `cfg`.
    """
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    prefect_file = prefect_file or PROJECT_DIR / "prefect.yaml"
    targets = resolve_targets(cfg, api_url, stack_env)
    deployments = load_spec(prefect_file)
    missing = missing_variables(deployments, targets)
    if missing:
        raise DeployError(f"{prefect_file.name} uses {', '.join(missing)}, which swerl deploy "
                          "does not set (flows/deploy.py: stack_targets/config_targets)")
    heartbeat = heartbeat_s(deployments)

    url = targets["PREFECT_API_URL"]
    with temporary_settings({PREFECT_API_URL: url}), get_client(sync_client=True) as client:
        err = client.api_healthcheck()
        if err is not None:
            raise DeployError(f"Prefect API {url} is not reachable ({type(err).__name__}: {err}); "
                              "is the stack up (`make up`)?") from err
        ensure_pools_and_limits(client, [targets["SWERL_CPU_POOL"], targets["SWERL_GPU_POOL"]], cfg)
        ensure_zombie_automation(client, heartbeat)
        run_prefect_deploy(prefect_file, targets)
        return read_back(client, deployments)
