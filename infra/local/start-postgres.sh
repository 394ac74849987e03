#!/usr/bin/env bash
# PostgreSQL for the state catalog and Dagster, without docker. Uses the machine's server if
# one answers on 127.0.0.1:$DAGSTER_PG_PORT (as the superuser $PGSUPERUSER, default postgres;
# set PGPASSWORD if it needs one), else starts a cluster of its own in .local/postgres. Then
# creates both databases (infra/postgres/init.sql), upgrades the catalog schema and grants the
# roles their rights, as the catalog's owner.
set -euo pipefail
cd "$(dirname "$0")/../.."
set -a; . infra/local/state.env; set +a

host=127.0.0.1
port=$DAGSTER_PG_PORT
superuser=${PGSUPERUSER:-postgres}
data=$PWD/.local/postgres

as_owner() {  # initdb and pg_ctl refuse to run as root
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

if pg_isready -q -h "$host" -p "$port"; then
  echo "using the PostgreSQL server on $host:$port"
else
  bindir=$(pg_config --bindir 2>/dev/null || dirname "$(command -v initdb)")
  mkdir -p .local
  if [ ! -f "$data/PG_VERSION" ]; then
    mkdir -p "$data"
    [ "$(id -u)" = 0 ] && chown postgres "$data"
    as_owner "$bindir/initdb" -D "$data" -U "$superuser" --auth=trust >/dev/null
  fi
  [ "$(id -u)" = 0 ] && chown postgres .local
  as_owner "$bindir/pg_ctl" -D "$data" -l "$data/server.log" -w \
    -o "-p $port -c listen_addresses=$host -k /tmp" start
  echo "started a local PostgreSQL cluster in $data on $host:$port"
fi

psql -v ON_ERROR_STOP=1 -q -h "$host" -p "$port" -U "$superuser" -d postgres \
  -f infra/postgres/init.sql
echo "databases ready: state_catalog (STATE_CATALOG_URL) and $DAGSTER_PG_DB (Dagster)"

python=${PYTHON:-.venv/bin/python}
# as the owner: the schema, then the least-privilege roles' rights
"$python" -m state_runtime.catalog upgrade --url "$CATALOG_OWNER_URL"
"$python" -m state_runtime.catalog grants --apply --url "$CATALOG_OWNER_URL" >/dev/null
