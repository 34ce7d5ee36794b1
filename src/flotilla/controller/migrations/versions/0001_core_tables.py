"""Core tables: mirrored objects, GPU allocations by node, decisions, samples.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Seconds = sa.Float(precision=53)
Id = sa.BigInteger().with_variant(sa.Integer, "sqlite")


def upgrade() -> None:
    op.create_table(
        "training_jobs",
        sa.Column("key", sa.String(512), primary_key=True),
        sa.Column("namespace", sa.String(253), nullable=False, index=True),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("phase", sa.String(32), nullable=False, index=True),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("best_effort", sa.Boolean, nullable=False),
        sa.Column("created", Seconds),
        sa.Column("deadline", Seconds),
        sa.Column("total_steps", sa.BigInteger, nullable=False),
        sa.Column("steps", sa.BigInteger, nullable=False),
        sa.Column("steps_per_second", Seconds, nullable=False),
        sa.Column("min_gpus", sa.Integer, nullable=False),
        sa.Column("max_gpus", sa.Integer, nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("placement", sa.JSON, nullable=False),
        sa.Column("estimated_completion", Seconds),
        sa.Column("deadline_met", sa.Boolean),
        sa.Column("reshards", sa.Integer, nullable=False),
        sa.Column("checkpoint_generation", sa.Integer, nullable=False),
        sa.Column("checkpoint_request", sa.JSON),
        sa.Column("updated", Seconds, nullable=False),
    )
    op.create_table(
        "allocations",
        sa.Column("job", sa.String(512), primary_key=True),
        sa.Column("node", sa.String(253), primary_key=True, index=True),
        sa.Column("gpus", sa.Integer, nullable=False),
    )
    op.create_table(
        "serving_deployments",
        sa.Column("key", sa.String(512), primary_key=True),
        sa.Column("namespace", sa.String(253), nullable=False, index=True),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("planner_mode", sa.String(16), nullable=False),
        sa.Column("prefill_replicas", sa.Integer, nullable=False),
        sa.Column("decode_replicas", sa.Integer, nullable=False),
        sa.Column("prefill_gpus_per_instance", sa.Integer, nullable=False),
        sa.Column("decode_gpus_per_instance", sa.Integer, nullable=False),
        sa.Column("slo", sa.JSON, nullable=False),
        sa.Column("observed", sa.JSON, nullable=False),
        sa.Column("predicted_goodput", Seconds),
        sa.Column("last_plan_time", Seconds),
        sa.Column("last_plan_reason", sa.Text),
        sa.Column("replan_request", sa.JSON),
        sa.Column("updated", Seconds, nullable=False),
    )
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(253), primary_key=True),
        sa.Column("domain", sa.String(253), nullable=False, index=True),
        sa.Column("total_gpus", sa.Integer, nullable=False),
        sa.Column("labels", sa.JSON, nullable=False),
        sa.Column("ready", sa.Boolean, nullable=False),
        sa.Column("unschedulable", sa.Boolean, nullable=False),
        sa.Column("healthy", sa.Boolean, nullable=False),
        sa.Column("health_reason", sa.String(253)),
        sa.Column("health_message", sa.Text),
        sa.Column("taint", sa.JSON),
        sa.Column("updated", Seconds, nullable=False),
    )
    op.create_table(
        "decisions",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("time", Seconds, nullable=False, index=True),
        sa.Column("kind", sa.String(64), nullable=False, index=True),
        sa.Column("object_kind", sa.String(64), nullable=False),
        sa.Column("object", sa.String(512), nullable=False),
        sa.Column("actor", sa.String(253), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("inputs", sa.JSON, nullable=False),
    )
    op.create_index("ix_decisions_object", "decisions", ["object_kind", "object"])
    op.create_table(
        "samples",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("ts", Seconds, nullable=False, index=True),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("metric", sa.String(128), nullable=False),
        sa.Column("value", Seconds, nullable=False),
        sa.Column("job", sa.String(512)),
        sa.Column("gpu", sa.Integer),
    )
    op.create_index("ix_samples_node_ts", "samples", ["node", "ts"])


def downgrade() -> None:
    for table in ("samples", "decisions", "nodes", "serving_deployments", "allocations", "training_jobs"):
        op.drop_table(table)
