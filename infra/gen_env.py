"""Write the local stack's `.env`: its ports, pool names and random credentials.

The file is git-ignored and read by `docker compose` (variable interpolation) and by
`swerl deploy` (the endpoints the deployments' default parameters point at). Values already in
the file are kept, because the database and bucket were initialised with them; keys that are
missing (a new stack version, a hand-edited file) are added. Explicit KEY=VALUE arguments win,
which is how the integration test makes a second stack on free ports next to yours.

Usage: python infra/gen_env.py [PATH] [KEY=VALUE ...]      (PATH defaults to ./.env)
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

from dotenv import dotenv_values

# Ports avoid each server's own default where other tools on the same machine use it
# (PostgreSQL 5432, SeaweedFS 8080/9333/8888, worker webserver 8080). SeaweedFS also listens on
# each of its ports + 10000 (gRPC), so those must stay below 55536 and be free too.
DEFAULTS: dict[str, str] = {
    "COMPOSE_PROFILES": "",  # "gpu" on a GPU host: adds the GPU worker and the vLLM server
    "SWERL_PG_PORT": "55432",
    "SWERL_PREFECT_PORT": "4200",
    "SWERL_MLFLOW_PORT": "5000",
    "SWERL_S3_PORT": "8333",
    "SWERL_S3_BUCKET": "swerl",
    "SWERL_WEED_MASTER_PORT": "19333",
    "SWERL_WEED_VOLUME_PORT": "18080",
    "SWERL_WEED_FILER_PORT": "18888",
    "SWERL_CPU_WORKER_PORT": "18481",  # the workers' health endpoints
    "SWERL_GPU_WORKER_PORT": "18482",
    "SWERL_VLLM_PORT": "8000",
    "SWERL_VLLM_MODEL": "Qwen/Qwen2.5-Coder-7B-Instruct",
    "SWERL_CPU_POOL": "swerl-cpu",
    "SWERL_GPU_POOL": "swerl-gpu",
    "SWERL_DOCKER_SOCKET": "/var/run/docker.sock",
}
# Hex only: safe unquoted in URLs, SQL, YAML and shell.
SECRETS = ("SWERL_PG_PREFECT_PASSWORD", "SWERL_PG_MLFLOW_PASSWORD",
           "SWERL_S3_ACCESS_KEY", "SWERL_S3_SECRET_KEY")

HEADER = """\
# The local stack's settings (infra/gen_env.py). Git-ignored: it holds credentials.
# Edit a port here, then `make up`. Passwords are re-applied to PostgreSQL at every start;
# the S3 key pair too. Delete the file and `make down -v` to start from scratch.
"""


def ensure_env(path: Path, overrides: dict[str, str] | None = None) -> dict[str, str]:
    """Create or complete the env file at `path`; return its values."""
    current = {k: v or "" for k, v in dotenv_values(path).items()} if path.exists() else {}
    values = dict(DEFAULTS)
    values.update({k: secrets.token_hex(16) for k in SECRETS})
    values.update(current)
    values.update(overrides or {})
    if values != current:
        ordered = list(DEFAULTS) + list(SECRETS)
        ordered += [k for k in values if k not in ordered]
        path.write_text(HEADER + "".join(f"{k}={values[k]}\n" for k in ordered))
        path.chmod(0o600)
    return values


def main(argv: list[str]) -> int:
    args = [a for a in argv if "=" not in a]
    overrides = dict(a.split("=", 1) for a in argv if "=" in a)
    path = Path(args[0] if args else ".env")
    existed = path.exists()
    ensure_env(path, overrides)
    print(f"[stack] {'using' if existed else 'generated'} {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
