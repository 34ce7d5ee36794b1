"""GPUs lent between training and serving through the unified pool (status.lentTo, status.borrowedFrom) and a
ServingDeployment's pool grant (status.pool.grantedGPUs), mirrored for the console.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("training_jobs") as batch:
        batch.add_column(sa.Column("lent_to", sa.JSON()))
    with op.batch_alter_table("serving_deployments") as batch:
        batch.add_column(sa.Column("borrowed_from", sa.JSON()))
        batch.add_column(sa.Column("granted_gpus", sa.Integer()))


def downgrade() -> None:
    with op.batch_alter_table("serving_deployments") as batch:
        batch.drop_column("granted_gpus")
        batch.drop_column("borrowed_from")
    with op.batch_alter_table("training_jobs") as batch:
        batch.drop_column("lent_to")
