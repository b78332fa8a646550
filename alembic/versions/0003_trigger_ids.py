"""trigger ids: one snapshot per trigger and engine, one event row per event id

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('snapshots', schema=None) as batch_op:
        batch_op.add_column(sa.Column('trigger_uid', sa.String(length=40), nullable=True))
        batch_op.create_index('uq_snapshots_trigger_uid', ['host', 'engine', 'trigger_uid'], unique=True)
    # Rows of one event written twice before events had a unique id key: keep the first, and
    # move what pointed at a snapshot onto it.
    op.execute(
        "UPDATE events SET snapshot_id = (SELECT MAX(e2.snapshot_id) FROM events e2 "
        "WHERE e2.host = events.host AND e2.uid = events.uid) "
        "WHERE uid IS NOT NULL AND snapshot_id IS NULL"
    )
    op.execute(
        "DELETE FROM events WHERE uid IS NOT NULL AND id NOT IN "
        "(SELECT MIN(id) FROM events WHERE uid IS NOT NULL GROUP BY host, uid)"
    )
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.create_index('uq_events_host_uid', ['host', 'uid'], unique=True)


def downgrade() -> None:
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.drop_index('uq_events_host_uid')
    with op.batch_alter_table('snapshots', schema=None) as batch_op:
        batch_op.drop_index('uq_snapshots_trigger_uid')
        batch_op.drop_column('trigger_uid')
