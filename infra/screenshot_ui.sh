#!/usr/bin/env bash
# Screenshot a web UI page (the Prefect or MLflow UI of a run) with headless Chromium.
#   infra/screenshot_ui.sh URL OUT.png [WAIT_MS]
# The UIs are single-page apps that fetch their data after the first paint: WAIT_MS (default
# 15000) of virtual time lets them finish before the picture is taken. A throwaway profile keeps
# two screenshots from fighting over one profile lock. Set SIZE=W,H to change the window.
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 URL OUT.png [WAIT_MS]" >&2
  exit 2
fi
url=$1 out=$(realpath -m "$2") wait_ms=${3:-15000} size=${SIZE:-1600,1000}

browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then
  echo "no Chromium found; install it (Debian: sudo apt-get install -y chromium)" >&2
  exit 1
fi

profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
mkdir -p "$(dirname "$out")"
rm -f "$out"
# --no-sandbox: Chromium refuses to start as root otherwise (containers, CI).
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
  --user-data-dir="$profile" --window-size="$size" --virtual-time-budget="$wait_ms" \
  --screenshot="$out" "$url" >/dev/null 2>&1 || true
if [ ! -s "$out" ]; then
  echo "no screenshot written for $url (is the server up?)" >&2
  exit 1
fi
echo "$out"
