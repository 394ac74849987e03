-- The two databases of the platform, each with its own owner: the state catalog (written by
-- state_runtime) and Dagster's own instance storage (runs, events, schedules). Idempotent:
-- run by the postgres image on first start and by infra/local/start-postgres.sh every time.
-- Development passwords: change them with the URLs in docker-compose.yml / local/state.env.
SELECT 'CREATE ROLE state LOGIN PASSWORD ''state'''
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'state')\gexec
SELECT 'CREATE ROLE dagster LOGIN PASSWORD ''dagster'''
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'dagster')\gexec
SELECT 'CREATE DATABASE state_catalog OWNER state'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'state_catalog')\gexec
SELECT 'CREATE DATABASE dagster OWNER dagster'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'dagster')\gexec
-- The catalog's least-privilege roles (docs/running-for-real.md): streaming jobs log in as
-- state_runtime, Dagster and statestore's maintenance as state_maintenance, people reading
-- as state_reader. Their rights come from the owner (state) running
-- `python -m state_runtime.catalog grants --apply` once; every later upgrade re-applies them.
SELECT 'CREATE ROLE state_runtime LOGIN PASSWORD ''state_runtime'''
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'state_runtime')\gexec
SELECT 'CREATE ROLE state_maintenance LOGIN PASSWORD ''state_maintenance'''
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'state_maintenance')\gexec
SELECT 'CREATE ROLE state_reader LOGIN PASSWORD ''state_reader'''
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'state_reader')\gexec
