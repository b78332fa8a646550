"""Listing snapshots: the filter, the summary columns and the page cursor the API hands out."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

from collector.storage.models import SnapshotRow


class BadCursor(ValueError):
    pass


def encode_cursor(created_at: float, id_: int) -> str:
    return base64.urlsafe_b64encode(json.dumps([created_at, id_]).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, int]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, id_ = json.loads(raw)
        return float(created), int(id_)
    except (ValueError, TypeError, json.JSONDecodeError) as exc:
        raise BadCursor("cursor is not one this API returned") from exc


@dataclass
class SnapshotFilter:
    engine: str | None = None
    host: str | None = None
    trigger: str | None = None
    incident_id: int | None = None
    since: float | None = None
    until: float | None = None


SUMMARY_COLUMNS = (
    SnapshotRow.id,
    SnapshotRow.incident_id,
    SnapshotRow.host,
    SnapshotRow.engine,
    SnapshotRow.created_at,
    SnapshotRow.fault_ts,
    SnapshotRow.trigger_kind,
    SnapshotRow.trigger_source,
    SnapshotRow.trigger_message,
    SnapshotRow.step_count,
    SnapshotRow.request_rows,
    SnapshotRow.first_step,
    SnapshotRow.last_step,
    SnapshotRow.summary,
)
