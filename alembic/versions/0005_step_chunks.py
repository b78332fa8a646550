"""steps stored as chunks and per second, scrapes' figures packed

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-06

New steps go to ``engine_step_chunks`` (collector/storage/stepchunks.py: a few seconds of one
engine's steps per row, the columns packed in one blob); ``engine_steps`` keeps the steps stored
before, which the readers read beside the chunks until retention prunes them (an upgrade copies
no rows, so it takes no time on a full store). ``engine_step_seconds`` holds the per-second
series made from the same steps, from now on. A scrape's figures go to ``engine_scrapes.packed``
(collector/storage/scrapepack.py); ``values`` keeps those of rows stored before, and becomes
nullable. The downgrade writes the chunks' steps back as rows, and the packed figures back as JSON.
"""

from __future__ import annotations

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "engine_step_chunks",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("engine_id", sa.Integer(), nullable=False),
        sa.Column("run", sa.BigInteger(), nullable=False),
        sa.Column("first_step", sa.BigInteger(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        sa.Column("ts_min", sa.Double(), nullable=False),
        sa.Column("ts_max", sa.Double(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("encoding", sa.String(length=32), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["engine_id"], ["engines.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("engine_id", "run", "first_step", name="uq_engine_step_chunks_first_step"),
    )
    op.create_index("ix_engine_step_chunks_last_step", "engine_step_chunks", ["engine_id", "run", "last_step"], unique=False)
    op.create_index("ix_engine_step_chunks_ts", "engine_step_chunks", ["engine_id", "ts_max"], unique=False)
    op.create_table(
        "engine_step_seconds",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("engine_id", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Double(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("running", sa.Integer(), nullable=True),
        sa.Column("waiting", sa.Integer(), nullable=True),
        sa.Column("kv_cache_usage", sa.Double(), nullable=True),
        sa.Column("preemptions", sa.BigInteger(), nullable=True),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=True),
        sa.Column("generation_tokens", sa.BigInteger(), nullable=True),
        sa.Column("mirror_rows", sa.Integer(), nullable=True),
        sa.Column("host_blocks", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["engine_id"], ["engines.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_engine_step_seconds_engine_ts", "engine_step_seconds", ["engine_id", "ts"], unique=False)
    with op.batch_alter_table("engine_scrapes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("packed", sa.LargeBinary(), nullable=True))
        batch_op.alter_column("values", existing_type=_JSON, nullable=True)


def downgrade() -> None:
    from collector.columns import STEP_COLUMNS, to_python
    from collector.storage.scrapepack import unpack
    from collector.storage.stepchunks import decode

    conn = op.get_bind()
    steps = sa.table("engine_steps", *(sa.column(c) for c in ("engine_id", *STEP_COLUMNS)))
    chunks = conn.execute(sa.text("SELECT engine_id, steps, encoding, payload FROM engine_step_chunks ORDER BY id")).all()
    for engine_id, n, encoding, payload in chunks:
        rows = [
            dict(zip(("engine_id", *STEP_COLUMNS), (engine_id, *(to_python(v) for v in row)), strict=True))
            for row in decode(payload, n, encoding).tolist()
        ]
        if rows:
            conn.execute(steps.insert(), rows)
    scrapes = sa.table("engine_scrapes", sa.column("id"), sa.column("values", _JSON))
    for sid, packed in conn.execute(sa.text("SELECT id, packed FROM engine_scrapes WHERE packed IS NOT NULL")).all():
        conn.execute(scrapes.update().where(scrapes.c.id == sid).values(values=unpack(packed)))
    op.execute('UPDATE engine_scrapes SET "values" = \'{}\' WHERE "values" IS NULL')
    with op.batch_alter_table("engine_scrapes", schema=None) as batch_op:
        batch_op.alter_column("values", existing_type=_JSON, nullable=False)
        batch_op.drop_column("packed")
    op.drop_index("ix_engine_step_seconds_engine_ts", table_name="engine_step_seconds")
    op.drop_table("engine_step_seconds")
    op.drop_index("ix_engine_step_chunks_ts", table_name="engine_step_chunks")
    op.drop_index("ix_engine_step_chunks_last_step", table_name="engine_step_chunks")
    op.drop_table("engine_step_chunks")
