"""node scale: unknown step figures are NULL, one row per engine step, scrape series, event ids

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

_NULLABLE = ('running', 'waiting', 'kv_cache_usage', 'preemptions', 'prompt_tokens', 'generation_tokens')
_TYPES = {'kv_cache_usage': sa.Double()}


def upgrade() -> None:
    # Duplicates written before steps had a unique key (a step's halves in two flushes): keep
    # the first row of each (engine, step).
    op.execute(
        "DELETE FROM engine_steps WHERE id NOT IN "
        "(SELECT MIN(id) FROM engine_steps GROUP BY engine_id, step)"
    )
    with op.batch_alter_table('engine_steps', schema=None) as batch_op:
        batch_op.add_column(sa.Column('run', sa.BigInteger(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('host_blocks', sa.Integer(), nullable=True))
        for name in _NULLABLE:
            batch_op.alter_column(name, existing_type=_TYPES.get(name, sa.Integer()), nullable=True)
        batch_op.create_unique_constraint('uq_engine_steps_engine_run_step', ['engine_id', 'run', 'step'])

    op.create_table('engine_scrapes',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('engine_id', sa.Integer(), nullable=False),
    sa.Column('ts', sa.Double(), nullable=False),
    sa.Column('running', sa.Double(), nullable=True),
    sa.Column('waiting', sa.Double(), nullable=True),
    sa.Column('kv_cache_usage', sa.Double(), nullable=True),
    sa.Column('values', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.ForeignKeyConstraint(['engine_id'], ['engines.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('engine_scrapes', schema=None) as batch_op:
        batch_op.create_index('ix_engine_scrapes_engine_ts', ['engine_id', 'ts'], unique=False)

    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.add_column(sa.Column('uid', sa.String(length=40), nullable=True))
        batch_op.create_index('ix_events_uid', ['uid'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.drop_index('ix_events_uid')
        batch_op.drop_column('uid')
    with op.batch_alter_table('engine_scrapes', schema=None) as batch_op:
        batch_op.drop_index('ix_engine_scrapes_engine_ts')
    op.drop_table('engine_scrapes')
    op.execute("DELETE FROM engine_steps WHERE " + " OR ".join(f"{n} IS NULL" for n in _NULLABLE))
    with op.batch_alter_table('engine_steps', schema=None) as batch_op:
        batch_op.drop_constraint('uq_engine_steps_engine_run_step', type_='unique')
        for name in _NULLABLE:
            batch_op.alter_column(name, existing_type=_TYPES.get(name, sa.Integer()), nullable=False)
        batch_op.drop_column('host_blocks')
        batch_op.drop_column('run')
