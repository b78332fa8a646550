"""fleet: crash signature columns, coarse series, the outbox, events partitioned by time (Postgres)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03

On Postgres ``events``, ``engine_series`` and ``gpu_series`` are range-partitioned on ``ts``
(collector/storage/partitions.py): ``events`` is rebuilt as a partitioned table and its rows
copied, with partitions from its oldest row's day to two days ahead and a DEFAULT one. Their
unique keys hold ``ts`` (Postgres requires the partition key in them), on SQLite too, so the
models are one schema. SQLite gets the same tables unpartitioned.
"""
from __future__ import annotations

import time

from alembic import op
import sqlalchemy as sa

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

SPAN_S = 86400.0  # the migration's partitions: one a day (the sidecar makes later ones its own size)
_EVENT_COLS = "id, uid, ts, host, kind, source, severity, engine, gpu, xid, pid, process, message, data, snapshot_id"
_EVENT_INDEXES = {
    'ix_events_ts': ['ts'],
    'ix_events_kind_ts': ['kind', 'ts'],
    'ix_events_engine_ts': ['engine', 'ts'],
    'ix_events_uid': ['uid'],
    'ix_events_host_ts': ['host', 'ts'],
}
_SNAPSHOT_INDEXES = {
    'ix_snapshots_signature': ['signature', 'fault_ts'],
    'ix_snapshots_host_fault': ['host', 'fault_ts'],
    'ix_snapshots_xid': ['xid'],
    'ix_snapshots_model': ['model'],
    'ix_snapshots_vllm_version': ['vllm_version'],
}


def _pg() -> bool:
    return op.get_bind().dialect.name == 'postgresql'


def _series_tables(partitioned: bool) -> None:
    tail = {'postgresql_partition_by': 'RANGE (ts)'} if partitioned else {}
    op.create_table('engine_series',
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('engine', sa.String(length=128), nullable=False),
    sa.Column('ts', sa.Double(), nullable=False),
    sa.Column('part', sa.BigInteger(), nullable=False),
    sa.Column('span_s', sa.Double(), nullable=False),
    sa.Column('steps', sa.Integer(), nullable=False),
    sa.Column('running_sum', sa.Double(), nullable=True),
    sa.Column('running_samples', sa.Integer(), nullable=False),
    sa.Column('running_max', sa.Integer(), nullable=True),
    sa.Column('waiting_max', sa.Integer(), nullable=True),
    sa.Column('kv_cache_usage_sum', sa.Double(), nullable=True),
    sa.Column('kv_cache_usage_samples', sa.Integer(), nullable=False),
    sa.Column('kv_cache_usage_max', sa.Double(), nullable=True),
    sa.Column('preemptions', sa.Integer(), nullable=True),
    sa.Column('prompt_tokens', sa.BigInteger(), nullable=True),
    sa.Column('generation_tokens', sa.BigInteger(), nullable=True),
    sa.Column('mirror_rows_max', sa.Integer(), nullable=True),
    sa.PrimaryKeyConstraint('host', 'engine', 'ts', 'part'),
    **tail,
    )
    op.create_table('gpu_series',
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('gpu', sa.String(length=128), nullable=False),
    sa.Column('ts', sa.Double(), nullable=False),
    sa.Column('part', sa.BigInteger(), nullable=False),
    sa.Column('span_s', sa.Double(), nullable=False),
    sa.Column('samples', sa.Integer(), nullable=False),
    sa.Column('utilization_sum', sa.Double(), nullable=True),
    sa.Column('utilization_samples', sa.Integer(), nullable=False),
    sa.Column('memory_used_max', sa.BigInteger(), nullable=True),
    sa.Column('temperature_max', sa.Double(), nullable=True),
    sa.Column('power_w_sum', sa.Double(), nullable=True),
    sa.Column('power_w_samples', sa.Integer(), nullable=False),
    sa.Column('sm_clock_mhz_min', sa.Double(), nullable=True),
    sa.Column('clock_event_reasons', sa.BigInteger(), nullable=True),
    sa.Column('ecc_volatile_uncorrected_max', sa.BigInteger(), nullable=True),
    sa.Column('remapped_rows_uncorrectable_max', sa.Integer(), nullable=True),
    sa.Column('pcie_replay_max', sa.BigInteger(), nullable=True),
    sa.PrimaryKeyConstraint('host', 'gpu', 'ts', 'part'),
    **tail,
    )


def _partition_events_pg() -> None:
    """Rebuild ``events`` as a table partitioned on ts, rows, ids and links kept."""
    for name in ('ix_events_ts', 'ix_events_kind_ts', 'ix_events_engine_ts', 'ix_events_uid', 'uq_events_host_uid'):
        op.execute(f'DROP INDEX IF EXISTS {name}')
    op.execute('ALTER TABLE events RENAME TO events_unpartitioned')
    op.execute('ALTER TABLE events_unpartitioned RENAME CONSTRAINT events_pkey TO events_unpartitioned_pkey')
    op.execute('ALTER SEQUENCE events_id_seq OWNED BY NONE')
    op.execute(
        """CREATE TABLE events (
            id BIGINT NOT NULL DEFAULT nextval('events_id_seq'),
            uid VARCHAR(40),
            ts DOUBLE PRECISION NOT NULL,
            host VARCHAR(255) NOT NULL,
            kind VARCHAR(32) NOT NULL,
            source VARCHAR(64) NOT NULL,
            severity VARCHAR(16) NOT NULL,
            engine VARCHAR(128),
            gpu VARCHAR(128),
            xid INTEGER,
            pid INTEGER,
            process VARCHAR(128),
            message TEXT NOT NULL,
            data JSONB NOT NULL,
            snapshot_id INTEGER REFERENCES snapshots (id) ON DELETE SET NULL,
            CONSTRAINT events_pkey PRIMARY KEY (id, ts)
        ) PARTITION BY RANGE (ts)"""
    )
    op.execute('ALTER SEQUENCE events_id_seq OWNED BY events.id')
    _make_partitions('events', 'SELECT MIN(ts) FROM events_unpartitioned')
    op.execute(f'INSERT INTO events ({_EVENT_COLS}) SELECT {_EVENT_COLS} FROM events_unpartitioned')
    op.execute('DROP TABLE events_unpartitioned')


def _make_partitions(table: str, oldest_sql: str | None) -> None:
    from collector.storage.partitions import create_default, ensure

    conn = op.get_bind()
    now = time.time()
    oldest = conn.execute(sa.text(oldest_sql)).scalar() if oldest_sql else None
    # a row years off (a clock far wrong) goes to the DEFAULT partition, not thousands of days
    since = max(float(oldest), now - 400 * 86400) if oldest is not None else now
    ensure(conn, table, now=now, span_s=SPAN_S, since=since)
    create_default(conn, table)


def upgrade() -> None:
    pg = _pg()
    with op.batch_alter_table('snapshots', schema=None) as batch_op:
        batch_op.add_column(sa.Column('signature', sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column('fault_class', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('gpu', sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column('xid', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('model', sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column('vllm_version', sa.String(length=64), nullable=True))
        for name, cols in _SNAPSHOT_INDEXES.items():
            batch_op.create_index(name, cols, unique=False)

    if pg:
        _partition_events_pg()
        for name, cols in _EVENT_INDEXES.items():
            op.create_index(name, 'events', cols, unique=False)
    else:
        with op.batch_alter_table('events', schema=None) as batch_op:
            batch_op.drop_index('uq_events_host_uid')
            batch_op.create_index('ix_events_host_ts', ['host', 'ts'], unique=False)
    op.create_index('uq_events_host_uid', 'events', ['host', 'uid', 'ts'], unique=True)

    _series_tables(partitioned=pg)
    if pg:
        _make_partitions('engine_series', None)
        _make_partitions('gpu_series', None)

    op.create_table('outbox',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('created_at', sa.Double(), nullable=False),
    sa.Column('payload', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )


def downgrade() -> None:
    pg = _pg()
    op.drop_table('outbox')
    op.drop_table('gpu_series')
    op.drop_table('engine_series')
    op.drop_index('uq_events_host_uid', table_name='events')
    if pg:
        for name in _EVENT_INDEXES:
            op.execute(f'DROP INDEX IF EXISTS {name}')
        op.execute('ALTER TABLE events RENAME TO events_partitioned')
        op.execute('ALTER TABLE events_partitioned RENAME CONSTRAINT events_pkey TO events_partitioned_pkey')
        op.execute('ALTER SEQUENCE events_id_seq OWNED BY NONE')
        op.execute(
            """CREATE TABLE events (
                id BIGINT NOT NULL DEFAULT nextval('events_id_seq'),
                ts DOUBLE PRECISION NOT NULL, host VARCHAR(255) NOT NULL, kind VARCHAR(32) NOT NULL,
                source VARCHAR(64) NOT NULL, severity VARCHAR(16) NOT NULL, engine VARCHAR(128),
                gpu VARCHAR(128), xid INTEGER, pid INTEGER, process VARCHAR(128), message TEXT NOT NULL,
                data JSONB NOT NULL, snapshot_id INTEGER REFERENCES snapshots (id) ON DELETE SET NULL,
                uid VARCHAR(40), CONSTRAINT events_pkey PRIMARY KEY (id)
            )"""
        )
        op.execute('ALTER SEQUENCE events_id_seq OWNED BY events.id')
        # one row per (host, uid) again: a uid stored at two times keeps its first row
        op.execute(
            f'INSERT INTO events ({_EVENT_COLS}) SELECT {_EVENT_COLS} FROM events_partitioned e WHERE e.uid IS NULL '
            'OR e.id = (SELECT MIN(e2.id) FROM events_partitioned e2 WHERE e2.host = e.host AND e2.uid = e.uid)'
        )
        op.execute('DROP TABLE events_partitioned')
        for name, cols in {'ix_events_ts': ['ts'], 'ix_events_kind_ts': ['kind', 'ts'], 'ix_events_engine_ts': ['engine', 'ts'], 'ix_events_uid': ['uid']}.items():
            op.create_index(name, 'events', cols, unique=False)
    else:
        op.execute(
            'DELETE FROM events WHERE uid IS NOT NULL AND id NOT IN (SELECT MIN(id) FROM events WHERE uid IS NOT NULL GROUP BY host, uid)'
        )
        with op.batch_alter_table('events', schema=None) as batch_op:
            batch_op.drop_index('ix_events_host_ts')
    op.create_index('uq_events_host_uid', 'events', ['host', 'uid'], unique=True)
    with op.batch_alter_table('snapshots', schema=None) as batch_op:
        for name in _SNAPSHOT_INDEXES:
            batch_op.drop_index(name)
        for col in ('vllm_version', 'model', 'xid', 'gpu', 'fault_class', 'signature'):
            batch_op.drop_column(col)
