"""The stack's files agree with each other: compose variables, the generated .env, prefect.yaml."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from flows.deploy import (DeployError, default_stack_env, heartbeat_s, load_spec, missing_variables,
                          resolve_targets)
from swerl.config import load_config

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _gen_env():
    spec = importlib.util.spec_from_file_location("gen_env", ROOT / "infra" / "gen_env.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_compose_variable_is_generated() -> None:
    gen = _gen_env()
    used = set(re.findall(r"\$\{(\w+)", (ROOT / "docker-compose.yml").read_text()))
    assert used, "the compose file reads its settings from .env"
    assert used <= set(gen.DEFAULTS) | set(gen.SECRETS)


def test_env_file_keeps_values_and_adds_missing(tmp_path: Path) -> None:
    gen = _gen_env()
    path = tmp_path / ".env"
    first = gen.ensure_env(path)
    assert len({first[k] for k in gen.SECRETS}) == len(gen.SECRETS), "independent secrets"
    assert all(re.fullmatch(r"[0-9a-f]{32}", first[k]) for k in gen.SECRETS)
    assert path.stat().st_mode & 0o077 == 0, "credentials readable by the owner only"

    text = path.read_text().replace(f"SWERL_S3_SECRET_KEY={first['SWERL_S3_SECRET_KEY']}\n", "")
    path.write_text(text.replace("SWERL_PG_PORT=55432", "SWERL_PG_PORT=50000"))
    second = gen.ensure_env(path)
    assert second["SWERL_PG_PORT"] == "50000", "hand edits survive"
    assert second["SWERL_PG_PREFECT_PASSWORD"] == first["SWERL_PG_PREFECT_PASSWORD"]
    assert re.fullmatch(r"[0-9a-f]{32}", second["SWERL_S3_SECRET_KEY"]), "a missing key is added"
    assert gen.ensure_env(path, {"SWERL_PG_PORT": "50001"})["SWERL_PG_PORT"] == "50001"


def test_prefect_yaml_deploys_every_flow() -> None:
    spec = load_spec(ROOT / "prefect.yaml")
    entrypoints = {d["entrypoint"] for d in spec}
    assert entrypoints == {
        "flows/pipeline.py:pipeline", "flows/curate.py:curate", "flows/pipeline.py:difficulty_filter",
        "flows/pipeline.py:rft", "flows/pipeline.py:dapo", "flows/pipeline.py:evaluate",
        "flows/registry_flows.py:promote",
    }
    for d in spec:
        params = d["parameters"]["params"] if d["name"] == "pipeline" else d["parameters"]
        assert d["work_pool"]["name"] and set(params) == {"preset", "overrides"}, d["name"]
    scheduled = {d["name"]: [s["cron"] for s in d["schedules"]] for d in spec if d.get("schedules")}
    assert set(scheduled) == {"evaluate", "curate"}


def test_every_deployed_run_heartbeats_for_the_zombie_automation() -> None:
    """A run the automation cannot see die would stay Running for good; one it watches but that
    beats every 180 s (Prefect's default) would be crashed while healthy: both are deploy errors."""
    spec = load_spec(ROOT / "prefect.yaml")
    assert heartbeat_s(spec) == 30
    silent = [dict(d, work_pool={"name": d["work_pool"]["name"]}) if d["name"] == "dapo" else d for d in spec]
    with pytest.raises(DeployError, match="dapo"):
        heartbeat_s(silent)
    untagged = [dict(d, tags=[]) if d["name"] == "curate" else d for d in spec]
    with pytest.raises(DeployError, match="curate"):
        heartbeat_s(untagged)


def test_stack_env_fills_every_placeholder(tmp_path: Path) -> None:
    gen = _gen_env()
    env_file = tmp_path / ".env"
    values = gen.ensure_env(env_file, {"SWERL_S3_PORT": "18333", "SWERL_CPU_POOL": "cpu-here"})
    cfg = load_config("smoke")
    spec = load_spec(ROOT / "prefect.yaml")
    targets = resolve_targets(cfg, None, env_file)
    assert missing_variables(spec, targets) == []
    assert targets["PREFECT_API_URL"] == f"http://127.0.0.1:{values['SWERL_PREFECT_PORT']}/api"
    assert targets["SWERL_S3_ENDPOINT_URL"] == "http://127.0.0.1:18333"
    assert targets["SWERL_CPU_POOL"] == "cpu-here", "the stack's workers poll the .env pools"
    assert targets["SWERL_PRESET"] == "smoke"


def test_without_a_stack_the_config_says_where(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    cfg = load_config("smoke", ["storage.uri=s3://team/swerl", "tracking.uri=https://mlflow.example",
                                "orchestration.prefect_api_url=https://prefect.example/api/"])
    targets = resolve_targets(cfg, None, None)
    assert missing_variables(load_spec(ROOT / "prefect.yaml"), targets) == []
    assert targets["PREFECT_API_URL"] == "https://prefect.example/api"
    assert targets["SWERL_STORAGE_URI"] == "s3://team/swerl"
    assert targets["SWERL_S3_ENDPOINT_URL"] == "null", "unset stays unset (a YAML null override)"
    assert resolve_targets(cfg, "http://other/api", None)["PREFECT_API_URL"] == "http://other/api"


def test_deploy_refuses_the_ephemeral_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with pytest.raises(DeployError, match="no Prefect API"):
        resolve_targets(load_config("smoke"), None, None)


def test_deploy_refuses_targets_on_the_workers_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Config mode with the default file:// store or a SQLite MLflow: each worker would keep its
    runs to itself; refused before anything is deployed, naming what to set."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with pytest.raises(DeployError, match=r"storage.uri=file://.swerl/store, tracking.uri=sqlite"):
        resolve_targets(load_config("smoke"), "http://127.0.0.1:4200/api", None)
    s3_only = load_config("smoke", ["storage.uri=s3://team/swerl"])
    with pytest.raises(DeployError, match=r"\(tracking.uri=sqlite:///.swerl/mlflow.db\)"):
        resolve_targets(s3_only, "http://127.0.0.1:4200/api", None)


def test_api_url_of_the_stack_keeps_the_stack_targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's `swerl deploy --api-url http://127.0.0.1:PORT/api` after `make up`: the
    stack's S3 and MLflow, not the config's local defaults; another API or --from-config: the config."""
    import flows.deploy as deploy_mod

    gen = _gen_env()
    values = gen.ensure_env(tmp_path / ".env", {"SWERL_PREFECT_PORT": "14200", "SWERL_S3_PORT": "18333",
                                                "SWERL_MLFLOW_PORT": "15000"})
    monkeypatch.setattr(deploy_mod, "PROJECT_DIR", tmp_path)
    monkeypatch.delenv("SWERL_ENV_FILE", raising=False)
    cfg = load_config("smoke")
    for api in (None, "http://127.0.0.1:14200/api", "http://127.0.0.1:14200/api/"):
        env = default_stack_env(cfg, api)
        assert env == tmp_path / ".env", api
        targets = resolve_targets(cfg, api, env)
        assert targets["SWERL_STORAGE_URI"] == f"s3://{values['SWERL_S3_BUCKET']}/store"
        assert targets["SWERL_TRACKING_URI"] == "http://127.0.0.1:15000"
    assert default_stack_env(cfg, "https://prefect.example/api") is None
    assert default_stack_env(cfg, None, from_config=True) is None


def test_compose_binds_nothing_beyond_loopback() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name, svc in compose["services"].items():
        assert svc["network_mode"] == "host" and "ports" not in svc, name
        assert svc["labels"]["swerl"] == "stack", name
        assert "healthcheck" in svc, name
