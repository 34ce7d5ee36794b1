"""Dead letters: samples the validator or the database refused, kept with why (never retried); the controller's
memory: what its deciders must remember across a restart (the serving re-planner's hysteresis).

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dead_letters",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("time", sa.Float(precision=53), nullable=False),
        sa.Column("transport", sa.String(16), nullable=False),
        sa.Column("source", sa.String(64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("raw", sa.LargeBinary(), nullable=False),
    )
    op.create_index("ix_dead_letters_time", "dead_letters", ["time"])
    op.create_table(
        "controller_memory",
        sa.Column("kind", sa.String(32), primary_key=True),
        sa.Column("key", sa.String(512), primary_key=True),
        sa.Column("value", sa.JSON(), nullable=False),
        sa.Column("updated", sa.Float(precision=53), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("controller_memory")
    op.drop_index("ix_dead_letters_time", table_name="dead_letters")
    op.drop_table("dead_letters")
