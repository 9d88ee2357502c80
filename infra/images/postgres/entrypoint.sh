#!/bin/bash
# Initialise the data volume on first start, make sure the `prefect` and `mlflow` roles and
# databases exist with the passwords of the current .env (so regenerating .env never locks the
# services out of a kept volume), then run the server on loopback only.
set -euo pipefail
: "${SWERL_PG_PORT:?}" "${SWERL_PG_PREFECT_PASSWORD:?}" "${SWERL_PG_MLFLOW_PASSWORD:?}"

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  echo "[postgres] initialising $PGDATA"
  initdb -D "$PGDATA" -U postgres --encoding=UTF8 --locale=C.UTF-8 \
         --auth-local=peer --auth-host=scram-sha-256 >/dev/null
fi

# Roles and databases through the unix socket only, before any TCP client can connect.
pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
for svc in prefect mlflow; do
  pw_var="SWERL_PG_${svc^^}_PASSWORD"
  psql -v ON_ERROR_STOP=1 -q -d postgres -v role="$svc" -v pw="${!pw_var}" <<'SQL'
SELECT format('CREATE ROLE %I LOGIN', :'role') WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'role')\gexec
ALTER ROLE :"role" WITH LOGIN PASSWORD :'pw';
SELECT format('CREATE DATABASE %I OWNER %I', :'role', :'role') WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'role')\gexec
SQL
done
pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null

echo "[postgres] serving on 127.0.0.1:$SWERL_PG_PORT"
exec postgres -D "$PGDATA" -c listen_addresses=127.0.0.1 -c port="$SWERL_PG_PORT" \
     -c max_connections=200 "$@"
