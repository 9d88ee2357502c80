#!/usr/bin/env bash
# Quickstart timing from a clean clone: a fresh HOME (no pip/model caches) and a second, empty dockerd.
# Usage: bash bench/quickstart_time.sh [REPO]   (as root; leaves /tmp/qs, /tmp/qshome, /tmp/qsdocker; stop that dockerd after)
set -uo pipefail
rm -rf /tmp/qs /tmp/qshome /tmp/qsdocker; mkdir -p /tmp/qshome /tmp/qsdocker
dockerd --bridge=none --iptables=false --data-root /tmp/qsdocker/data --exec-root /tmp/qsdocker/exec \
  --pidfile /tmp/qsdocker/pid -H unix:///tmp/qsdocker/sock >/tmp/qsdocker.log 2>&1 &
export DOCKER_HOST=unix:///tmp/qsdocker/sock HOME=/tmp/qshome
for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
docker images
start=$(date +%s)
git clone -q "${1:-$(git -C "$(dirname "$0")" rev-parse --show-toplevel)}" /tmp/qs && cd /tmp/qs
( make demo PRESET=smoke 2>&1 | while IFS= read -r l; do printf '[%4ds] %s\n' $(( $(date +%s) - start )) "$l"; done )
echo "TOTAL $(( $(date +%s) - start )) s rc=${PIPESTATUS[0]}"
