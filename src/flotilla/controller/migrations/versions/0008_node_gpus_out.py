"""A node's GPUs out of service on their own (a device-local fault): {"<index>": "<why>"} from its annotation.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("gpus_out", sa.JSON))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("gpus_out")
