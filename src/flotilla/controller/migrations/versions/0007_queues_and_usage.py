"""Teams' Queues mirrored (queues), their usage over time (queue_usage), and the queue each TrainingJob and
ServingDeployment is in (status.queue).

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

Seconds = sa.Float(precision=53)


def upgrade() -> None:
    op.create_table(
        "queues",
        sa.Column("name", sa.String(253), primary_key=True),
        sa.Column("uid", sa.String(64), nullable=False),
        sa.Column("parent", sa.String(253)),
        sa.Column("weight", Seconds, nullable=False),
        sa.Column("namespaces", sa.JSON(), nullable=False),
        sa.Column("nominal", sa.Integer(), nullable=False),
        sa.Column("borrowing_limit", sa.Integer()),
        sa.Column("lending_limit", sa.Integer()),
        sa.Column("usage", sa.JSON(), nullable=False),
        sa.Column("last_condition", sa.Text(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("status", sa.JSON(), nullable=False),
        sa.Column("updated", Seconds, nullable=False),
    )
    op.create_table(
        "queue_usage",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("time", Seconds, nullable=False),
        sa.Column("queue", sa.String(253), nullable=False),
        *(sa.Column(name, sa.Integer(), nullable=False)
          for name in ("nominal", "used", "borrowed", "lent", "guaranteed", "admitted", "pending")),
    )
    op.create_index("ix_queue_usage_queue_time", "queue_usage", ["queue", "time"])
    for table in ("training_jobs", "serving_deployments"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("queue", sa.String(253)))
            batch.create_index(f"ix_{table}_queue", ["queue"])


def downgrade() -> None:
    for table in ("serving_deployments", "training_jobs"):
        with op.batch_alter_table(table) as batch:
            batch.drop_index(f"ix_{table}_queue")
            batch.drop_column("queue")
    op.drop_index("ix_queue_usage_queue_time", "queue_usage")
    op.drop_table("queue_usage")
    op.drop_table("queues")
