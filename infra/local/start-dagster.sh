#!/usr/bin/env bash
# The Dagster daemon (in the background) and webserver, without docker, on the databases of
# start-postgres.sh and the S3 endpoint of start-s3.sh. UI: http://127.0.0.1:3000
set -euo pipefail
cd "$(dirname "$0")/../.."
set -a; . infra/local/state.env; set +a
bin=$(dirname "${PYTHON:-.venv/bin/python}")

mkdir -p "$DAGSTER_HOME"
cp infra/dagster.yaml "$DAGSTER_HOME/dagster.yaml"
nohup "$bin/dagster-daemon" run -w workspace.yaml >.local/dagster-daemon.log 2>&1 &
echo $! >.local/dagster-daemon.pid
echo "started dagster-daemon (pid $!, log .local/dagster-daemon.log)"
exec "$bin/dagster-webserver" -h 127.0.0.1 -p "${DAGSTER_PORT:-3000}" -w workspace.yaml
