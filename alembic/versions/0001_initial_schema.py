"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-30
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table('engines',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('url', sa.String(length=1024), nullable=True),
    sa.Column('pair', sa.String(length=128), nullable=True),
    sa.Column('vllm_version', sa.String(length=64), nullable=True),
    sa.Column('state', sa.String(length=32), nullable=False),
    sa.Column('first_seen', sa.Double(), nullable=False),
    sa.Column('last_seen', sa.Double(), nullable=False),
    sa.Column('fingerprint', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('host', 'name', name='uq_engines_host_name')
    )
    op.create_table('gpus',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('gpu', sa.String(length=128), nullable=False),
    sa.Column('index', sa.Integer(), nullable=False),
    sa.Column('bus_id', sa.String(length=64), nullable=True),
    sa.Column('name', sa.String(length=128), nullable=True),
    sa.Column('first_seen', sa.Double(), nullable=False),
    sa.Column('last_seen', sa.Double(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('host', 'gpu', name='uq_gpus_host_gpu')
    )
    op.create_table('incidents',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('key', sa.String(length=255), nullable=False),
    sa.Column('title', sa.Text(), nullable=False),
    sa.Column('opened_at', sa.Double(), nullable=False),
    sa.Column('updated_at', sa.Double(), nullable=False),
    sa.Column('trigger_kind', sa.String(length=32), nullable=False),
    sa.Column('hosts', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('engines', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('snapshot_count', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('incidents', schema=None) as batch_op:
        batch_op.create_index('ix_incidents_opened', ['opened_at'], unique=False)

    op.create_table('engine_steps',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('engine_id', sa.Integer(), nullable=False),
    sa.Column('ts', sa.Double(), nullable=False),
    sa.Column('step', sa.BigInteger(), nullable=False),
    sa.Column('running', sa.Integer(), nullable=False),
    sa.Column('waiting', sa.Integer(), nullable=False),
    sa.Column('kv_cache_usage', sa.Double(), nullable=False),
    sa.Column('preemptions', sa.Integer(), nullable=False),
    sa.Column('prompt_tokens', sa.Integer(), nullable=False),
    sa.Column('generation_tokens', sa.Integer(), nullable=False),
    sa.Column('mirror_rows', sa.Integer(), nullable=True),
    sa.ForeignKeyConstraint(['engine_id'], ['engines.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('engine_steps', schema=None) as batch_op:
        batch_op.create_index('ix_engine_steps_engine_ts', ['engine_id', 'ts'], unique=False)

    op.create_table('gpu_samples',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('gpu_id', sa.Integer(), nullable=False),
    sa.Column('ts', sa.Double(), nullable=False),
    sa.Column('memory_used', sa.BigInteger(), nullable=True),
    sa.Column('memory_total', sa.BigInteger(), nullable=True),
    sa.Column('utilization', sa.Double(), nullable=True),
    sa.Column('temperature', sa.Double(), nullable=True),
    sa.Column('power_w', sa.Double(), nullable=True),
    sa.Column('sm_clock_mhz', sa.Double(), nullable=True),
    sa.Column('clock_event_reasons', sa.BigInteger(), nullable=True),
    sa.Column('ecc_volatile_uncorrected', sa.BigInteger(), nullable=True),
    sa.Column('remapped_rows_uncorrectable', sa.Integer(), nullable=True),
    sa.Column('pcie_replay', sa.BigInteger(), nullable=True),
    sa.ForeignKeyConstraint(['gpu_id'], ['gpus.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('gpu_samples', schema=None) as batch_op:
        batch_op.create_index('ix_gpu_samples_gpu_ts', ['gpu_id', 'ts'], unique=False)

    op.create_table('snapshots',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('incident_id', sa.Integer(), nullable=True),
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('engine', sa.String(length=128), nullable=False),
    sa.Column('created_at', sa.Double(), nullable=False),
    sa.Column('fault_ts', sa.Double(), nullable=False),
    sa.Column('trigger_kind', sa.String(length=32), nullable=False),
    sa.Column('trigger_source', sa.String(length=32), nullable=False),
    sa.Column('trigger_message', sa.Text(), nullable=False),
    sa.Column('step_count', sa.Integer(), nullable=False),
    sa.Column('request_rows', sa.Integer(), nullable=False),
    sa.Column('first_step', sa.BigInteger(), nullable=True),
    sa.Column('last_step', sa.BigInteger(), nullable=True),
    sa.Column('summary', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('fingerprint', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.ForeignKeyConstraint(['incident_id'], ['incidents.id'], ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('snapshots', schema=None) as batch_op:
        batch_op.create_index('ix_snapshots_created', ['created_at'], unique=False)
        batch_op.create_index('ix_snapshots_engine', ['engine'], unique=False)
        batch_op.create_index('ix_snapshots_trigger', ['trigger_kind'], unique=False)

    op.create_table('events',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('ts', sa.Double(), nullable=False),
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('source', sa.String(length=64), nullable=False),
    sa.Column('severity', sa.String(length=16), nullable=False),
    sa.Column('engine', sa.String(length=128), nullable=True),
    sa.Column('gpu', sa.String(length=128), nullable=True),
    sa.Column('xid', sa.Integer(), nullable=True),
    sa.Column('pid', sa.Integer(), nullable=True),
    sa.Column('process', sa.String(length=128), nullable=True),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('data', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('snapshot_id', sa.Integer(), nullable=True),
    sa.ForeignKeyConstraint(['snapshot_id'], ['snapshots.id'], ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.create_index('ix_events_engine_ts', ['engine', 'ts'], unique=False)
        batch_op.create_index('ix_events_kind_ts', ['kind', 'ts'], unique=False)
        batch_op.create_index('ix_events_ts', ['ts'], unique=False)

    op.create_table('snapshot_parts',
    sa.Column('snapshot_id', sa.Integer(), nullable=False),
    sa.Column('part', sa.String(length=32), nullable=False),
    sa.Column('encoding', sa.String(length=16), nullable=False),
    sa.Column('payload', sa.LargeBinary(), nullable=False),
    sa.ForeignKeyConstraint(['snapshot_id'], ['snapshots.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('snapshot_id', 'part')
    )



def downgrade() -> None:

    op.drop_table('snapshot_parts')
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.drop_index('ix_events_ts')
        batch_op.drop_index('ix_events_kind_ts')
        batch_op.drop_index('ix_events_engine_ts')

    op.drop_table('events')
    with op.batch_alter_table('snapshots', schema=None) as batch_op:
        batch_op.drop_index('ix_snapshots_trigger')
        batch_op.drop_index('ix_snapshots_engine')
        batch_op.drop_index('ix_snapshots_created')

    op.drop_table('snapshots')
    with op.batch_alter_table('gpu_samples', schema=None) as batch_op:
        batch_op.drop_index('ix_gpu_samples_gpu_ts')

    op.drop_table('gpu_samples')
    with op.batch_alter_table('engine_steps', schema=None) as batch_op:
        batch_op.drop_index('ix_engine_steps_engine_ts')

    op.drop_table('engine_steps')
    with op.batch_alter_table('incidents', schema=None) as batch_op:
        batch_op.drop_index('ix_incidents_opened')

    op.drop_table('incidents')
    op.drop_table('gpus')
    op.drop_table('engines')

