#!/bin/sh
# Runs once, when the postgres container creates its data folder: a read-only role for Grafana.
# The sidecars' migrations create the tables later, as POSTGRES_USER, so the grant is a default
# privilege on that user's future tables.
set -eu
if [ -z "${GRAFANA_PG_PASSWORD:-}" ]; then
  echo "GRAFANA_PG_PASSWORD is not set: no grafana_reader role (the dashboard's SQL panels stay empty)"
  exit 0
fi
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  -v reader_password="$GRAFANA_PG_PASSWORD" <<'SQL'
CREATE ROLE grafana_reader LOGIN PASSWORD :'reader_password';
GRANT CONNECT ON DATABASE :"DBNAME" TO grafana_reader;
GRANT USAGE ON SCHEMA public TO grafana_reader;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO grafana_reader;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO grafana_reader;
-- a dashboard query that runs away must not hold the sidecars' tables
ALTER ROLE grafana_reader SET statement_timeout = '30s';
SQL
