"""The controller's database: tables, engine, and migrations run at start-up.

Times are stored as Unix seconds (double precision) so that SQLite and
PostgreSQL behave the same; the API renders them as RFC 3339.
The schema is owned by the Alembic migrations shipped in
`flotilla/controller/migrations`; `Base.metadata` mirrors the head revision and
a test keeps the two in step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

MIGRATIONS = Path(__file__).with_name("migrations")
Seconds = sa.Float(precision=53)


class Base(DeclarativeBase):
    pass


class TrainingJobRow(Base):
    __tablename__ = "training_jobs"
    key: Mapped[str] = mapped_column(sa.String(512), primary_key=True)  # namespace/name
    namespace: Mapped[str] = mapped_column(sa.String(253), index=True)
    name: Mapped[str] = mapped_column(sa.String(253))
    uid: Mapped[str | None] = mapped_column(sa.String(64))  # None: mirrored before revision 0003
    phase: Mapped[str] = mapped_column(sa.String(32), index=True)
    priority: Mapped[int] = mapped_column(sa.Integer)
    best_effort: Mapped[bool] = mapped_column(sa.Boolean)
    created: Mapped[float | None] = mapped_column(Seconds)
    deadline: Mapped[float | None] = mapped_column(Seconds)
    total_steps: Mapped[int] = mapped_column(sa.BigInteger)
    steps: Mapped[int] = mapped_column(sa.BigInteger)
    steps_per_second: Mapped[float] = mapped_column(Seconds)
    min_gpus: Mapped[int] = mapped_column(sa.Integer)
    max_gpus: Mapped[int] = mapped_column(sa.Integer)
    gpus: Mapped[int] = mapped_column(sa.Integer)
    placement: Mapped[dict[str, int]] = mapped_column(sa.JSON)
    estimated_completion: Mapped[float | None] = mapped_column(Seconds)
    deadline_met: Mapped[bool | None] = mapped_column(sa.Boolean)
    reshards: Mapped[int] = mapped_column(sa.Integer)
    checkpoint_generation: Mapped[int] = mapped_column(sa.Integer)
    checkpoint_request: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)
    lent_to: Mapped[dict[str, int] | None] = mapped_column(sa.JSON)  # ServingDeployment -> GPUs (None before 0004)
    # When the job entered phase Resharding (None when not resharding): for the reshard duration metric.
    resharding_since: Mapped[float | None] = mapped_column(Seconds)
    queue: Mapped[str | None] = mapped_column(sa.String(253), index=True)  # status.queue (None before 0007)
    updated: Mapped[float] = mapped_column(Seconds)


class AllocationRow(Base):
    """GPUs a training job holds on one node (its placement, one row per node) for SQL aggregation.
    A finished job (Succeeded, Failed, Rejected) holds none, whatever its status.placement still says."""

    __tablename__ = "allocations"
    job: Mapped[str] = mapped_column(sa.String(512), primary_key=True)
    node: Mapped[str] = mapped_column(sa.String(253), primary_key=True, index=True)
    gpus: Mapped[int] = mapped_column(sa.Integer)


class ServingDeploymentRow(Base):
    __tablename__ = "serving_deployments"
    key: Mapped[str] = mapped_column(sa.String(512), primary_key=True)
    namespace: Mapped[str] = mapped_column(sa.String(253), index=True)
    name: Mapped[str] = mapped_column(sa.String(253))
    planner_mode: Mapped[str] = mapped_column(sa.String(16))
    prefill_replicas: Mapped[int] = mapped_column(sa.Integer)
    decode_replicas: Mapped[int] = mapped_column(sa.Integer)
    prefill_gpus_per_instance: Mapped[int] = mapped_column(sa.Integer)
    decode_gpus_per_instance: Mapped[int] = mapped_column(sa.Integer)
    slo: Mapped[dict[str, float]] = mapped_column(sa.JSON)
    observed: Mapped[dict[str, float]] = mapped_column(sa.JSON)
    predicted_goodput: Mapped[float | None] = mapped_column(Seconds)
    last_plan_time: Mapped[float | None] = mapped_column(Seconds)
    last_plan_reason: Mapped[str | None] = mapped_column(sa.Text)
    replan_request: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)
    borrowed_from: Mapped[dict[str, int] | None] = mapped_column(sa.JSON)  # TrainingJob -> GPUs (None before 0004)
    granted_gpus: Mapped[int | None] = mapped_column(sa.Integer)  # status.pool.grantedGPUs; None: no pool
    queue: Mapped[str | None] = mapped_column(sa.String(253), index=True)  # status.queue (None before 0007)
    updated: Mapped[float] = mapped_column(Seconds)


class NodeRow(Base):
    __tablename__ = "nodes"
    name: Mapped[str] = mapped_column(sa.String(253), primary_key=True)
    domain: Mapped[str] = mapped_column(sa.String(253), index=True)
    total_gpus: Mapped[int] = mapped_column(sa.Integer)
    labels: Mapped[dict[str, str]] = mapped_column(sa.JSON)
    ready: Mapped[bool] = mapped_column(sa.Boolean)
    unschedulable: Mapped[bool] = mapped_column(sa.Boolean)
    healthy: Mapped[bool] = mapped_column(sa.Boolean)
    health_reason: Mapped[str | None] = mapped_column(sa.String(253))
    health_message: Mapped[str | None] = mapped_column(sa.Text)
    taint: Mapped[dict[str, str] | None] = mapped_column(sa.JSON)  # the flotilla.dev/unhealthy taint
    updated: Mapped[float] = mapped_column(Seconds)
    # GPU index (as a string) -> why, for GPUs out of service on their own (flotilla.dev/unhealthy-gpus)
    gpus_out: Mapped[dict[str, str] | None] = mapped_column(sa.JSON)


class QueueRow(Base):
    """A team's Queue (cluster-scoped): its GPU quota and the status the operator writes."""

    __tablename__ = "queues"
    name: Mapped[str] = mapped_column(sa.String(253), primary_key=True)
    uid: Mapped[str] = mapped_column(sa.String(64))
    parent: Mapped[str | None] = mapped_column(sa.String(253))
    weight: Mapped[float] = mapped_column(Seconds)
    namespaces: Mapped[list[str]] = mapped_column(sa.JSON)
    nominal: Mapped[int] = mapped_column(sa.Integer)
    borrowing_limit: Mapped[int | None] = mapped_column(sa.Integer)
    lending_limit: Mapped[int | None] = mapped_column(sa.Integer)
    usage: Mapped[dict[str, int]] = mapped_column(sa.JSON)  # status: nominal, used, borrowed, lent, ...
    last_condition: Mapped[str] = mapped_column(sa.Text)
    spec: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    status: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    updated: Mapped[float] = mapped_column(Seconds)


class QueueUsageRow(Base):
    """A queue's status numbers each time they changed: its usage over time. Kept after the queue is deleted."""

    __tablename__ = "queue_usage"
    __table_args__ = (sa.Index("ix_queue_usage_queue_time", "queue", "time"),)
    id: Mapped[int] = mapped_column(sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True,
                                    autoincrement=True)
    time: Mapped[float] = mapped_column(Seconds)
    queue: Mapped[str] = mapped_column(sa.String(253))
    nominal: Mapped[int] = mapped_column(sa.Integer)
    used: Mapped[int] = mapped_column(sa.Integer)
    borrowed: Mapped[int] = mapped_column(sa.Integer)
    lent: Mapped[int] = mapped_column(sa.Integer)
    guaranteed: Mapped[int] = mapped_column(sa.Integer)
    admitted: Mapped[int] = mapped_column(sa.Integer)
    pending: Mapped[int] = mapped_column(sa.Integer)


class DecisionRow(Base):
    __tablename__ = "decisions"
    __table_args__ = (sa.Index("ix_decisions_object", "object_kind", "object"),)
    id: Mapped[int] = mapped_column(sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True,
                                    autoincrement=True)
    time: Mapped[float] = mapped_column(Seconds, index=True)
    kind: Mapped[str] = mapped_column(sa.String(64), index=True)
    object_kind: Mapped[str] = mapped_column(sa.String(64))
    object: Mapped[str] = mapped_column(sa.String(512))
    actor: Mapped[str] = mapped_column(sa.String(253))
    reason: Mapped[str] = mapped_column(sa.Text)
    inputs: Mapped[dict[str, Any]] = mapped_column(sa.JSON)


class SampleRow(Base):
    __tablename__ = "samples"
    __table_args__ = (sa.Index("ix_samples_node_ts", "node", "ts"),)
    id: Mapped[int] = mapped_column(sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True,
                                    autoincrement=True)
    ts: Mapped[float] = mapped_column(Seconds, index=True)
    node: Mapped[str] = mapped_column(sa.String(253))
    metric: Mapped[str] = mapped_column(sa.String(128))
    value: Mapped[float] = mapped_column(Seconds)
    job: Mapped[str | None] = mapped_column(sa.String(512))
    gpu: Mapped[int | None] = mapped_column(sa.Integer)
    role: Mapped[str | None] = mapped_column(sa.String(63))
    rank: Mapped[int | None] = mapped_column(sa.Integer)


class IdempotencyRow(Base):
    """The stored answer to an action sent with an Idempotency-Key header."""

    __tablename__ = "idempotency_keys"
    key: Mapped[str] = mapped_column(sa.String(255), primary_key=True)
    request: Mapped[str] = mapped_column(sa.String(64))  # sha256 of method, path and body
    status: Mapped[int] = mapped_column(sa.Integer)
    response: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    created: Mapped[float] = mapped_column(Seconds, index=True)


class DeadLetterRow(Base):
    """A sample (or a whole stream entry) that will never be stored: refused by the validator or the database.
    Kept with why, so that it is acknowledged at once and blocks nothing behind it."""

    __tablename__ = "dead_letters"
    id: Mapped[int] = mapped_column(sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True,
                                    autoincrement=True)
    time: Mapped[float] = mapped_column(Seconds, index=True)
    transport: Mapped[str] = mapped_column(sa.String(16))  # redis, http
    source: Mapped[str] = mapped_column(sa.String(64))  # the stream entry's id; "" over HTTP
    reason: Mapped[str] = mapped_column(sa.Text)
    raw: Mapped[bytes] = mapped_column(sa.LargeBinary)  # as received (bytes: whatever it holds, NUL included)


class MemoryRow(Base):
    """What a decider of the controller remembers across a restart (kind: whose memory; key: about what)."""

    __tablename__ = "controller_memory"
    kind: Mapped[str] = mapped_column(sa.String(32), primary_key=True)
    key: Mapped[str] = mapped_column(sa.String(512), primary_key=True)
    value: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    updated: Mapped[float] = mapped_column(Seconds)


# The database could not be reached (down, restarting, the network): the request or entry is retried, never
# refused. Anything else a database raises is about what was asked of it.
OUTAGES: tuple[type[Exception], ...] = (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.TimeoutError,
                                        sa.exc.DisconnectionError)


def is_outage(e: BaseException) -> bool:
    return isinstance(e, OUTAGES) or bool(getattr(e, "connection_invalidated", False))


def create_engine(url: str) -> sa.Engine:
    """An engine for `url`; a SQLite file's folder is created, and SQLite runs in WAL mode."""
    if url.startswith("sqlite"):
        database = sa.make_url(url).database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @sa.event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        return engine
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    # A server that does not answer fails a connection in seconds (the API then answers 503), not minutes.
    return sa.create_engine(url, pool_pre_ping=True, connect_args={"connect_timeout": 3})


def alembic_config(connection: sa.Connection) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = connection
    return cfg


def upgrade(engine: sa.Engine, revision: str = "head") -> None:
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), revision)


def downgrade(engine: sa.Engine, revision: str) -> None:
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), revision)


def current_revision(engine: sa.Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert head is not None
    return head
