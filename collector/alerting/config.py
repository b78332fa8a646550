"""Alerting settings (mounted by the application settings as ``alerting:``).

The Alertmanager URLs themselves are the top-level ``alertmanager:`` list, and the base of the
alerts' links (``generatorURL``) is the top-level ``public_url`` (default: the sidecar's own
address).
"""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator


class AlertingSettings(BaseModel):
    # Base of the runbook links: an alert's runbook_url is {runbook_base}#{alertname lower-cased},
    # for the sidecar's alerts and for the rules `flightrec rules` renders. Absolute (a pager
    # follows nothing else), or empty: no runbook link.
    runbook_base: str = ""
    # The `host` label; empty means the machine's host name.
    host: str = ""
    # Like Prometheus: resend firing alerts every minute with endsAt 4 intervals ahead,
    # and resend resolved ones for 15 minutes.
    resend_interval: float = Field(60.0, gt=0)
    resolved_resend_for: float = Field(900.0, ge=0)
    # How long an alert built from a one-off event (crash, Xid) keeps firing before it resolves.
    event_hold: float = Field(3600.0, gt=0)
    batch_max: int = Field(64, ge=1)
    queue_max: int = Field(10000, ge=1)
    backoff_min: float = Field(0.1, gt=0)
    backoff_max: float = Field(10.0, gt=0)
    timeout: float = Field(5.0, gt=0)

    @field_validator("runbook_base")
    @classmethod
    def _absolute(cls, v: str) -> str:
        v = v.strip().rstrip("/")
        if v and not (v.startswith(("http://", "https://")) and len(v.split("://", 1)[1].split("/", 1)[0]) > 0):
            raise ValueError("must be an absolute http(s) URL (a pager follows nothing else), or empty")
        return v
