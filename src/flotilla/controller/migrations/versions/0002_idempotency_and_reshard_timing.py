"""Idempotency keys for admin actions; when a job entered Resharding (reshard duration metric).

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

Seconds = sa.Float(precision=53)


def upgrade() -> None:
    op.create_table(
        "idempotency_keys",
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("request", sa.String(64), nullable=False),
        sa.Column("status", sa.Integer, nullable=False),
        sa.Column("response", sa.JSON, nullable=False),
        sa.Column("created", Seconds, nullable=False, index=True),
    )
    with op.batch_alter_table("training_jobs") as batch:
        batch.add_column(sa.Column("resharding_since", Seconds))


def downgrade() -> None:
    with op.batch_alter_table("training_jobs") as batch:
        batch.drop_column("resharding_since")
    op.drop_table("idempotency_keys")
