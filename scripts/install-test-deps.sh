#!/usr/bin/env bash
# System parts the tests talk to for real: Alertmanager, Prometheus and promtool (Debian packages
# prometheus-alertmanager and prometheus), Chromium for the page test, PgBouncer (the fleet tests
# start one in transaction mode in front of Postgres), and a running Postgres.
# Idempotent: installs only what is missing, starts Postgres only if it is down.
set -euo pipefail

need=()
command -v prometheus-alertmanager >/dev/null 2>&1 || command -v alertmanager >/dev/null 2>&1 || need+=(prometheus-alertmanager)
{ command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; } || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
command -v pg_ctlcluster >/dev/null 2>&1 || need+=(postgresql)
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || need+=(pgbouncer)
if ((${#need[@]})); then
    echo "installing: ${need[*]}"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
fi

# Postgres on 127.0.0.1:5432 with trust auth and a database `test` (the tests' default;
# FLIGHTREC_TEST_PG points elsewhere).
if [ -z "${FLIGHTREC_TEST_PG:-}" ]; then
    if ! pg_isready -q -h 127.0.0.1 -p 5432; then
        echo "starting postgres"
        for v in /etc/postgresql/*; do
            pg_ctlcluster --skip-systemctl-redirect "$(basename "$v")" main start || true
        done
        for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
    fi
    pg_isready -h 127.0.0.1 -p 5432
    psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='test'" | grep -q 1 \
        || psql -h 127.0.0.1 -U postgres -c "CREATE DATABASE test"
fi
