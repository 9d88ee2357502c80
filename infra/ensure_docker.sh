#!/usr/bin/env bash
# Make sure a Docker daemon is reachable (and mmdebstrap is there for the offline base image).
# As root on Debian we install and start what is missing; otherwise we say exactly what to do.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }
is_root() { [ "$(id -u)" = 0 ]; }
apt_install() {
  if ! is_root || ! have apt-get; then return 1; fi
  if [ ! -f /tmp/.swerl-apt-updated ]; then apt-get update -qq && touch /tmp/.swerl-apt-updated; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if docker info >/dev/null 2>&1; then
  :
else
  if ! have dockerd; then
    echo "[swerl] installing docker.io (dockerd missing)"
    apt_install docker.io || {
      echo "[swerl] ERROR: no Docker daemon. Install Docker (Debian: sudo apt-get install docker.io) and start it" >&2
      echo "        (sudo dockerd --bridge=none --iptables=false &), or add yourself to the docker group." >&2
      exit 1; }
  fi
  if ! is_root; then
    echo "[swerl] ERROR: the Docker daemon is not reachable. Start it: sudo systemctl start docker" >&2
    echo "        (or: sudo dockerd --bridge=none --iptables=false &), then re-run." >&2
    exit 1
  fi
  echo "[swerl] starting dockerd (log: /tmp/swerl-dockerd.log)"
  if have setsid; then
    setsid dockerd --bridge=none --iptables=false >/tmp/swerl-dockerd.log 2>&1 < /dev/null &
  else
    nohup dockerd --bridge=none --iptables=false >/tmp/swerl-dockerd.log 2>&1 < /dev/null &
  fi
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { echo "[swerl] ERROR: dockerd did not come up; see /tmp/swerl-dockerd.log" >&2; exit 1; }
fi

if ! have mmdebstrap; then
  apt_install mmdebstrap || echo "[swerl] note: mmdebstrap missing; the offline base-image route needs it (apt-get install mmdebstrap)"
fi
if ! have bwrap; then apt_install bubblewrap || true; fi
