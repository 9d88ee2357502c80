#!/bin/bash
# `swerl-s3`: run SeaweedFS with one S3 identity (the .env key pair) on loopback-only ports and
# create the bucket once the server answers. `swerl-s3 health` is the container's healthcheck:
# healthy = the S3 port answers AND the bucket exists, so dependants never see a missing bucket.
set -euo pipefail
: "${SWERL_S3_PORT:?}" "${SWERL_S3_BUCKET:?}" "${SWERL_S3_ACCESS_KEY:?}" "${SWERL_S3_SECRET_KEY:?}"
: "${SWERL_WEED_MASTER_PORT:?}" "${SWERL_WEED_VOLUME_PORT:?}" "${SWERL_WEED_FILER_PORT:?}"
READY=/tmp/swerl-bucket-ready
MASTER=127.0.0.1:$SWERL_WEED_MASTER_PORT

if [ "${1:-}" = health ]; then
  test -f "$READY" && exec python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' \
    "http://127.0.0.1:$SWERL_S3_PORT/healthz"
  exit 1
fi

rm -f "$READY"
python3 - > /tmp/s3.json <<'PY'
import json, os
print(json.dumps({"identities": [{
    "name": "swerl",
    "credentials": [{"accessKey": os.environ["SWERL_S3_ACCESS_KEY"],
                     "secretKey": os.environ["SWERL_S3_SECRET_KEY"]}],
    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
}]}))
PY

create_bucket() {
  for _ in $(seq 1 120); do
    if echo "s3.bucket.list" | weed shell -master="$MASTER" 2>/dev/null | grep -qw "$SWERL_S3_BUCKET"; then
      touch "$READY"; echo "[s3] bucket $SWERL_S3_BUCKET ready"; return 0
    fi
    echo "s3.bucket.create -name $SWERL_S3_BUCKET" | weed shell -master="$MASTER" >/dev/null 2>&1 || true
    sleep 1
  done
  echo "[s3] ERROR: could not create bucket $SWERL_S3_BUCKET" >&2
}
create_bucket &

# Every port explicit: weed's defaults (8080, 8333, 9333, ...) clash with other servers, and
# gRPC ports default to http port + 10000. Iceberg/Lance catalogs are off.
exec weed server -dir=/data -ip=127.0.0.1 -ip.bind=127.0.0.1 \
  -master.port="$SWERL_WEED_MASTER_PORT" -master.volumeSizeLimitMB=1024 \
  -volume.port="$SWERL_WEED_VOLUME_PORT" -volume.max=0 \
  -filer.port="$SWERL_WEED_FILER_PORT" \
  -s3 -s3.port="$SWERL_S3_PORT" -s3.config=/tmp/s3.json -s3.port.iceberg=0 -s3.port.lance=0
