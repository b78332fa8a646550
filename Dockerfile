# The flight-recorder sidecar. One per node, next to the vLLM engines it watches:
#   docker build -t vllm-flight-recorder .
#   docker run -e FLIGHTREC_API_TOKEN=... -v ./deploy/flightrec.yaml:/etc/flightrec/flightrec.yaml:ro vllm-flight-recorder
# docker-compose.yml runs it with Postgres, Prometheus, Alertmanager and Grafana (docs/deploy.md).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY collector ./collector
# the migrations: setup.py ships alembic/ inside the package (collector.storage.migrations)
COPY alembic ./alembic
# installed as data: `flightrec rules` renders it with the deployment's runbook links
COPY rules/flightrec-alerts.yml ./rules/flightrec-alerts.yml
# The kubernetes extra (grpcio, protobuf) reads the kubelet's PodResources API in the DaemonSet.
# DL3013: this is the project itself with one of its extras; pyproject.toml sets the versions.
# hadolint ignore=DL3013
RUN pip install '.[kubernetes]' && rm -rf /src

# Non-root by default (uid 10001). On a GPU node the kernel log and the engines' rings need more:
# the compose file's GPU-node settings, or the Kubernetes DaemonSet (root, CAP_SYSLOG only).
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/flightrec --shell /usr/sbin/nologin flightrec \
    && mkdir -p /var/lib/flightrec/spool /etc/flightrec \
    && chown -R flightrec:flightrec /var/lib/flightrec
WORKDIR /var/lib/flightrec
USER 10001:10001

# Snapshots wait here while the database is down (a volume in docker-compose.yml).
ENV FLIGHTREC_SPOOL_DIR=/var/lib/flightrec/spool
EXPOSE 8787
# /healthz needs no token; "degraded" still answers 200, so only a dead process fails this.
# `flightrec health` reads the same settings as serve: the check follows a changed port.
HEALTHCHECK --interval=10s --timeout=4s --start-period=20s --retries=3 \
    CMD ["flightrec", "health", "--config", "/etc/flightrec/flightrec.yaml"]

# host 0.0.0.0 (in the config file) refuses to start without an api_token: set FLIGHTREC_API_TOKEN.
ENTRYPOINT ["flightrec"]
CMD ["serve", "--config", "/etc/flightrec/flightrec.yaml"]
