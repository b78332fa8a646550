"""Internal: paging: alerts built from events and detector states, sent to Alertmanager's v2 API."""

from collector.alerting.alertmanager import AlertmanagerClient, ClientStats, TargetStats
from collector.alerting.alerts import (
    Alert,
    AlertKey,
    alert_for_event,
    alert_for_state,
    alerts_for_transition,
)
from collector.alerting.config import AlertingSettings

__all__ = [
    "Alert",
    "AlertKey",
    "AlertingSettings",
    "AlertmanagerClient",
    "ClientStats",
    "TargetStats",
    "alert_for_event",
    "alert_for_state",
    "alerts_for_transition",
]
