"""A TrainingJob's UID (a new job of an old name is another job); finished jobs hold no allocations.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

FINISHED = ("Succeeded", "Failed", "Rejected")


def upgrade() -> None:
    with op.batch_alter_table("training_jobs") as batch:
        batch.add_column(sa.Column("uid", sa.String(64)))
    jobs = sa.table("training_jobs", sa.column("key", sa.String), sa.column("phase", sa.String))
    allocations = sa.table("allocations", sa.column("job", sa.String))
    op.execute(allocations.delete().where(
        allocations.c.job.in_(sa.select(jobs.c.key).where(jobs.c.phase.in_(FINISHED)))))


def downgrade() -> None:
    with op.batch_alter_table("training_jobs") as batch:
        batch.drop_column("uid")
