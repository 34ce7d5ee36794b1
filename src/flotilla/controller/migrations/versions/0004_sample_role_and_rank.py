"""Samples carry the role of their machine within the job (e.g. "pp1/4") and the worker's rank.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("samples") as batch:
        batch.add_column(sa.Column("role", sa.String(63)))
        batch.add_column(sa.Column("rank", sa.Integer))


def downgrade() -> None:
    with op.batch_alter_table("samples") as batch:
        batch.drop_column("rank")
        batch.drop_column("role")
