"""Internal: the sidecar's HTTP interface: REST API under /api/v1, /healthz, /metrics, snapshot pages."""
