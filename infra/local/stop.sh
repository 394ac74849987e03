#!/usr/bin/env bash
# Stops what infra/local/*.sh started: the moto server, the Dagster daemon and the local
# PostgreSQL cluster (never the machine's own PostgreSQL server).
set -uo pipefail
cd "$(dirname "$0")/../.."

for name in moto dagster-daemon; do
  if [ -f ".local/$name.pid" ]; then
    kill "$(cat ".local/$name.pid")" 2>/dev/null && echo "stopped $name"
    rm -f ".local/$name.pid"
  fi
done
if [ -f .local/postgres/postmaster.pid ]; then
  bindir=$(pg_config --bindir 2>/dev/null || dirname "$(command -v pg_ctl)")
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$bindir/pg_ctl" -D .local/postgres stop
  else
    "$bindir/pg_ctl" -D .local/postgres stop
  fi
fi
