"""Reads and writes of the controller database; the API, the sync loop, ingest and metrics go through here."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from flotilla.controller.db import (
    AllocationRow,
    DeadLetterRow,
    DecisionRow,
    IdempotencyRow,
    MemoryRow,
    NodeRow,
    QueueRow,
    QueueUsageRow,
    SampleRow,
    ServingDeploymentRow,
    TrainingJobRow,
    is_outage,
)
from flotilla.controller import queues as queue_records
from flotilla.controller.mirror import (
    DecisionRecord,
    JobRecord,
    NodeRecord,
    ServingRecord,
    job_changes,
    node_changes,
    serving_changes,
)
from flotilla.health.samples import Sample

RACK_LABEL = "flotilla.dev/rack"
OUTLOOKS = ("on-track", "at-risk", "missed", "rejected", "done", "no-deadline")
FINISHED = ("Succeeded", "Failed", "Rejected")
ADMITTED = ("Admitted", "Running", "Resharding")  # holding, or promised, a guaranteed share
# Mirrored kind -> (table, key column)
_TABLES: dict[str, tuple[type, Any]] = {
    "TrainingJob": (TrainingJobRow, TrainingJobRow.key),
    "ServingDeployment": (ServingDeploymentRow, ServingDeploymentRow.key),
    "Node": (NodeRow, NodeRow.name),
    "Queue": (QueueRow, QueueRow.name),
}


@dataclass(frozen=True)
class Page:
    items: list[Any]
    next_cursor: str | None


@dataclass(frozen=True)
class SyncResult:
    decisions: list[DecisionRecord]
    reshard_seconds: float | None = None  # set when the job just left phase Resharding


def outlook_expr(now: float) -> sa.ColumnElement[str]:
    """The deadline outlook of a training job, as SQL (so that lists filter and count by it)."""
    j = TrainingJobRow
    return sa.case(
        (j.phase == "Rejected", "rejected"),  # never admitted: not a deadline Flotilla promised and missed
        (j.deadline.is_(None), "no-deadline"),
        (j.phase == "Succeeded", "done"),
        (j.phase == "Failed", "missed"),
        (j.deadline < now, "missed"),
        (j.deadline_met.is_(False), "at-risk"),
        (sa.and_(j.estimated_completion.is_not(None), j.estimated_completion > j.deadline), "at-risk"),
        else_="on-track",
    )


def _job_record(row: TrainingJobRow) -> JobRecord:
    fields = {f.name for f in dataclasses.fields(JobRecord)} - {"last_condition", "uid", "lent_to", "queue", "reclaim"}
    return JobRecord(**{name: getattr(row, name) for name in fields}, uid=row.uid or "", last_condition="",
                     lent_to=row.lent_to or {}, queue=row.queue or "")


def _held(rec: JobRecord) -> dict[str, int]:
    """node -> GPUs the job holds: its placement while it runs, nothing once it has finished."""
    return {} if rec.phase in FINISHED else {n: g for n, g in rec.placement.items() if g > 0}


def _serving_record(row: ServingDeploymentRow) -> ServingRecord:
    record = ServingRecord(**{f.name: getattr(row, f.name) for f in dataclasses.fields(ServingRecord)
                              if f.name not in ("queue", "reclaim")})
    return dataclasses.replace(record, borrowed_from=row.borrowed_from or {},  # None: mirrored before 0004
                               queue=row.queue or "")


def _serving_gpus(rec: ServingRecord) -> int:
    return rec.prefill_replicas * rec.prefill_gpus_per_instance + rec.decode_replicas * rec.decode_gpus_per_instance


_NOT_STORED = ("last_condition", "reclaim")


def _queue_record(row: QueueRow) -> queue_records.QueueRecord:
    return queue_records.QueueRecord(**{f.name: getattr(row, f.name)
                                        for f in dataclasses.fields(queue_records.QueueRecord)
                                        if f.name != "namespaces"}, namespaces=tuple(row.namespaces))


def _reclaims(s: Session, kind: str, key: str, queue: str, gpus_from: int, gpus_to: int,
              rec: JobRecord | ServingRecord, now: float) -> list[DecisionRecord]:
    """The reclaim a smaller allocation carries out; none when it is not one, or when the reclaim that asked for
    it was already recorded (a job shrinking again under the same request is not reclaimed twice)."""
    found = queue_records.reclaim_decision(key, kind, queue, gpus_from, gpus_to, rec.reclaim, now)
    if found is None:
        return []
    last = s.scalars(sa.select(DecisionRow.inputs).where(DecisionRow.kind == "reclaim", DecisionRow.object_kind == kind,
                                                         DecisionRow.object == key)
                     .order_by(DecisionRow.id.desc()).limit(1)).first()
    if last is not None and last.get("signal") == found[0].inputs["signal"]:
        return []
    return [found[0]]


def _node_record(row: NodeRow) -> NodeRecord:
    return NodeRecord(**{f.name: getattr(row, f.name) for f in dataclasses.fields(NodeRecord)})


def _deleted(result: sa.Result[Any]) -> int:
    """The rows a DELETE removed."""
    return int(getattr(result, "rowcount", 0) or 0)


def _one_line(e: Exception) -> str:
    """`Kind: first line` of a database error, without SQLAlchemy's statement and parameters."""
    cause = getattr(e, "orig", None) or e
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0] if text else ''}"[:500]


def _decision_row(d: DecisionRecord, now: float) -> DecisionRow:
    return DecisionRow(time=d.time or now, kind=d.kind, object_kind=d.object_kind, object=d.object,
                       actor=d.actor, reason=d.reason, inputs=dict(d.inputs))


class Store:
    def __init__(self, engine: sa.Engine, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.session = sessionmaker(engine, expire_on_commit=False)
        self.clock = clock

    # ---- mirror of cluster objects (called by the sync loop and after actions) ----

    def upsert_job(self, rec: JobRecord) -> SyncResult:
        now = self.clock()
        with self.session.begin() as s:
            row = s.get(TrainingJobRow, rec.key)
            # The same name with another UID: the old job was deleted and a new one created while the watch was
            # away. Nothing of the old row (changes, resharding time, allocations) is the new job's.
            same = row is not None and (not row.uid or not rec.uid or row.uid == rec.uid)
            old = _job_record(row) if row is not None and same else None
            values = {f.name: getattr(rec, f.name) for f in dataclasses.fields(JobRecord) if f.name not in _NOT_STORED}
            values["placement"] = dict(rec.placement)
            values["lent_to"] = dict(rec.lent_to)
            values["checkpoint_request"] = dict(rec.checkpoint_request) if rec.checkpoint_request else None
            since = row.resharding_since if row is not None and same else None
            reshard_seconds = None
            if rec.phase == "Resharding":
                since = since or now
            elif since is not None:
                reshard_seconds, since = now - since, None
            if row is None:
                row = TrainingJobRow(**values, resharding_since=since, updated=now)
                s.add(row)
            else:
                for k, v in values.items():
                    setattr(row, k, v)
                row.resharding_since, row.updated = since, now
            if old is None or _held(old) != _held(rec):
                s.execute(sa.delete(AllocationRow).where(AllocationRow.job == rec.key))
                s.add_all(AllocationRow(job=rec.key, node=n, gpus=g) for n, g in _held(rec).items())
            decisions = job_changes(old, rec, now)
            if old is not None:
                decisions += _reclaims(s, "TrainingJob", rec.key, rec.queue, old.gpus, rec.gpus, rec, now)
            s.add_all(_decision_row(d, now) for d in decisions)
        return SyncResult(decisions, reshard_seconds)

    def upsert_serving(self, rec: ServingRecord) -> SyncResult:
        now = self.clock()
        with self.session.begin() as s:
            row = s.get(ServingDeploymentRow, rec.key)
            old = _serving_record(row) if row is not None else None
            values = {f.name: getattr(rec, f.name) for f in dataclasses.fields(ServingRecord) if f.name != "reclaim"}
            for k in ("slo", "observed", "replan_request", "borrowed_from"):
                values[k] = dict(values[k]) if values[k] is not None else None
            if row is None:
                s.add(ServingDeploymentRow(**values, updated=now))
            else:
                for k, v in values.items():
                    setattr(row, k, v)
                row.updated = now
            decisions = serving_changes(old, rec, now)
            if old is not None:
                decisions += _reclaims(s, "ServingDeployment", rec.key, rec.queue, _serving_gpus(old), _serving_gpus(rec),
                                       rec, now)
            s.add_all(_decision_row(d, now) for d in decisions)
        return SyncResult(decisions)

    def upsert_queue(self, rec: queue_records.QueueRecord) -> SyncResult:
        """Mirror one Queue; a change of its status numbers adds a point to its usage history, a change of what
        it borrows or lends a `loan` decision."""
        now = self.clock()
        with self.session.begin() as s:
            row = s.get(QueueRow, rec.name)
            old = _queue_record(row) if row is not None and row.uid == rec.uid else None
            values = {f.name: getattr(rec, f.name) for f in dataclasses.fields(queue_records.QueueRecord)}
            values.update(namespaces=list(rec.namespaces), usage=dict(rec.usage), spec=dict(rec.spec),
                          status=dict(rec.status))
            if row is None:
                s.add(QueueRow(**values, updated=now))
            else:
                for k, v in values.items():
                    setattr(row, k, v)
                row.updated = now
            if old is None or dict(old.usage) != dict(rec.usage):
                s.add(QueueUsageRow(time=now, queue=rec.name, **rec.usage))
            decisions = queue_records.queue_changes(old, rec, now)
            s.add_all(_decision_row(d, now) for d in decisions)
        return SyncResult(decisions)

    def upsert_node(self, rec: NodeRecord) -> SyncResult:
        now = self.clock()
        with self.session.begin() as s:
            row = s.get(NodeRow, rec.name)
            old = _node_record(row) if row is not None else None
            values = {f.name: getattr(rec, f.name) for f in dataclasses.fields(NodeRecord)}
            values["labels"] = dict(rec.labels)
            values["taint"] = dict(rec.taint) if rec.taint else None
            values["gpus_out"] = dict(rec.gpus_out) if rec.gpus_out else None
            if row is None:
                s.add(NodeRow(**values, updated=now))
            else:
                for k, v in values.items():
                    setattr(row, k, v)
                row.updated = now
            decisions = node_changes(old, rec, now)
            s.add_all(_decision_row(d, now) for d in decisions)
        return SyncResult(decisions)

    def delete_object(self, kind: str, key: str) -> None:
        with self.session.begin() as s:
            s.execute(sa.delete(_TABLES[kind][0]).where(_TABLES[kind][1] == key))
            if kind == "TrainingJob":
                s.execute(sa.delete(AllocationRow).where(AllocationRow.job == key))

    def keep_only(self, kind: str, keys: set[str]) -> None:
        """After a full list from the API server: forget objects of `kind` that no longer exist."""
        for key in set(self.object_keys(kind)) - keys:
            self.delete_object(kind, key)

    def object_keys(self, kind: str) -> list[str]:
        with self.session() as s:
            return list(s.scalars(sa.select(_TABLES[kind][1])))

    # ---- direct updates made by actions before the watch reports them ----

    def set_job_fields(self, key: str, **values: Any) -> None:
        with self.session.begin() as s:
            s.execute(sa.update(TrainingJobRow).where(TrainingJobRow.key == key).values(**values))

    def set_serving_fields(self, key: str, **values: Any) -> None:
        with self.session.begin() as s:
            s.execute(sa.update(ServingDeploymentRow).where(ServingDeploymentRow.key == key).values(**values))

    def set_node_fields(self, name: str, **values: Any) -> None:
        with self.session.begin() as s:
            s.execute(sa.update(NodeRow).where(NodeRow.name == name).values(**values))

    # ---- decisions ----

    def record(self, decisions: Iterable[DecisionRecord]) -> None:
        now = self.clock()
        with self.session.begin() as s:
            s.add_all(_decision_row(d, now) for d in decisions)

    def decisions(self, *, limit: int, cursor: str | None = None, since: float | None = None,
                  until: float | None = None, kind: str | None = None, object_kind: str | None = None,
                  obj: str | None = None, kinds: Sequence[str] | None = None, queue: str | None = None) -> Page:
        """Newest first. `queue`: decisions whose inputs name it as fromQueue or toQueue (reclaims)."""
        q = sa.select(DecisionRow).order_by(DecisionRow.id.desc()).limit(limit + 1)
        if cursor is not None:
            q = q.where(DecisionRow.id < int(cursor))
        if since is not None:
            q = q.where(DecisionRow.time >= since)
        if until is not None:
            q = q.where(DecisionRow.time < until)
        if kind is not None:
            q = q.where(DecisionRow.kind == kind)
        if kinds is not None:
            q = q.where(DecisionRow.kind.in_(kinds))
        if object_kind is not None:
            q = q.where(DecisionRow.object_kind == object_kind)
        if obj is not None:
            q = q.where(DecisionRow.object == obj)
        if queue is not None:
            q = q.where(sa.or_(DecisionRow.inputs["fromQueue"].as_string() == queue,
                               DecisionRow.inputs["toQueue"].as_string() == queue))
        with self.session() as s:
            rows = list(s.scalars(q))
        return Page(rows[:limit], str(rows[limit - 1].id) if len(rows) > limit else None)

    # ---- training jobs ----

    def jobs(self, *, limit: int, cursor: str | None = None, namespace: str | None = None,
             phase: str | None = None, outlook: str | None = None, node: str | None = None) -> Page:
        now = self.clock()
        ol = outlook_expr(now).label("outlook")
        q = sa.select(TrainingJobRow, ol).order_by(TrainingJobRow.key).limit(limit + 1)
        if cursor is not None:
            q = q.where(TrainingJobRow.key > cursor)
        if namespace is not None:
            q = q.where(TrainingJobRow.namespace == namespace)
        if phase is not None:
            q = q.where(TrainingJobRow.phase == phase)
        if outlook is not None:
            q = q.where(outlook_expr(now) == outlook)
        if node is not None:
            q = q.where(TrainingJobRow.key.in_(sa.select(AllocationRow.job).where(AllocationRow.node == node)))
        with self.session() as s:
            rows = [(r, o) for r, o in s.execute(q)]
        return Page(rows[:limit], rows[limit - 1][0].key if len(rows) > limit else None)

    def job(self, key: str) -> tuple[TrainingJobRow, str] | None:
        with self.session() as s:
            found = s.execute(sa.select(TrainingJobRow, outlook_expr(self.clock()))
                              .where(TrainingJobRow.key == key)).first()
            return (found[0], found[1]) if found else None

    def job_of_node(self) -> dict[str, str]:
        """node -> the training job holding GPUs on it (the job with most GPUs there)."""
        with self.session() as s:
            rows = s.execute(sa.select(AllocationRow.node, AllocationRow.job, AllocationRow.gpus)).all()
        best: dict[str, tuple[int, str]] = {}
        for node, job, gpus in rows:
            if node not in best or gpus > best[node][0]:
                best[node] = (gpus, job)
        return {node: job for node, (_, job) in best.items()}

    def node_domains(self) -> dict[str, str]:
        """node -> its topology domain, for every node."""
        with self.session() as s:
            return {name: domain for name, domain in s.execute(sa.select(NodeRow.name, NodeRow.domain))}

    def jobs_on_node(self, node: str) -> list[TrainingJobRow]:
        with self.session() as s:
            return list(s.scalars(sa.select(TrainingJobRow).join(AllocationRow, AllocationRow.job == TrainingJobRow.key)
                                  .where(AllocationRow.node == node).order_by(TrainingJobRow.key)))

    def jobs_by_phase(self) -> dict[str, int]:
        with self.session() as s:
            return {p: n for p, n in s.execute(sa.select(TrainingJobRow.phase, sa.func.count()).group_by(TrainingJobRow.phase))}

    def outlook_counts(self) -> dict[str, int]:
        ol = outlook_expr(self.clock())
        with self.session() as s:
            counts = {o: n for o, n in s.execute(sa.select(ol, sa.func.count()).group_by(ol))}
        return {o: counts.get(o, 0) for o in OUTLOOKS}

    # ---- serving ----

    def servings(self, *, limit: int, cursor: str | None = None, namespace: str | None = None) -> Page:
        q = sa.select(ServingDeploymentRow).order_by(ServingDeploymentRow.key).limit(limit + 1)
        if cursor is not None:
            q = q.where(ServingDeploymentRow.key > cursor)
        if namespace is not None:
            q = q.where(ServingDeploymentRow.namespace == namespace)
        with self.session() as s:
            rows = list(s.scalars(q))
        return Page(rows[:limit], rows[limit - 1].key if len(rows) > limit else None)

    def serving(self, key: str) -> ServingDeploymentRow | None:
        with self.session() as s:
            return s.get(ServingDeploymentRow, key)

    def all_servings(self) -> list[ServingDeploymentRow]:
        with self.session() as s:
            return list(s.scalars(sa.select(ServingDeploymentRow)))

    # ---- nodes and capacity ----

    def _node_alloc_query(self) -> sa.Select[NodeRow, Any]:
        allocated = (sa.select(AllocationRow.node, sa.func.sum(AllocationRow.gpus).label("gpus"))
                     .group_by(AllocationRow.node).subquery())
        return (sa.select(NodeRow, sa.func.coalesce(allocated.c.gpus, 0))
                .outerjoin(allocated, allocated.c.node == NodeRow.name))

    def nodes(self, *, limit: int, cursor: str | None = None, domain: str | None = None,
              healthy: bool | None = None, schedulable: bool | None = None) -> Page:
        q = self._node_alloc_query().order_by(NodeRow.name).limit(limit + 1)
        if cursor is not None:
            q = q.where(NodeRow.name > cursor)
        if domain is not None:
            q = q.where(NodeRow.domain == domain)
        if healthy is not None:
            q = q.where(NodeRow.healthy.is_(healthy))
        if schedulable is not None:
            q = q.where(NodeRow.unschedulable.is_(not schedulable))
        with self.session() as s:
            rows = [(r, int(a)) for r, a in s.execute(q)]
        return Page(rows[:limit], rows[limit - 1][0].name if len(rows) > limit else None)

    def node(self, name: str) -> tuple[NodeRow, int] | None:
        with self.session() as s:
            found = s.execute(self._node_alloc_query().where(NodeRow.name == name)).first()
            return (found[0], int(found[1])) if found else None

    def domains(self, *, limit: int, cursor: str | None = None) -> Page:
        """Per topology domain: nodes, GPUs, schedulable GPUs, GPUs allocated to training."""
        allocated = (sa.select(NodeRow.domain.label("domain"), sa.func.sum(AllocationRow.gpus).label("gpus"))
                     .join(AllocationRow, AllocationRow.node == NodeRow.name).group_by(NodeRow.domain).subquery())
        schedulable = sa.case((sa.and_(NodeRow.unschedulable.is_(False), NodeRow.healthy.is_(True)),
                               NodeRow.total_gpus), else_=0)
        q = (sa.select(NodeRow.domain, sa.func.count(), sa.func.sum(NodeRow.total_gpus), sa.func.sum(schedulable),
                       sa.func.coalesce(sa.func.max(allocated.c.gpus), 0))
             .outerjoin(allocated, allocated.c.domain == NodeRow.domain)
             .group_by(NodeRow.domain).order_by(NodeRow.domain).limit(limit + 1))
        if cursor is not None:
            q = q.where(NodeRow.domain > cursor)
        with self.session() as s:
            rows = [tuple(r) for r in s.execute(q)]
        return Page(rows[:limit], rows[limit - 1][0] if len(rows) > limit else None)

    def capacity(self) -> dict[str, int]:
        """Cluster totals: GPUs, schedulable GPUs, GPUs held by training and serving."""
        schedulable = sa.case((sa.and_(NodeRow.unschedulable.is_(False), NodeRow.healthy.is_(True)),
                               NodeRow.total_gpus), else_=0)
        sd = ServingDeploymentRow
        with self.session() as s:
            nodes, total, sched = s.execute(sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(NodeRow.total_gpus), 0),
                                                      sa.func.coalesce(sa.func.sum(schedulable), 0))).one()
            training = s.scalar(sa.select(sa.func.coalesce(sa.func.sum(AllocationRow.gpus), 0)))
            serving = s.scalar(sa.select(sa.func.coalesce(sa.func.sum(
                sd.prefill_replicas * sd.prefill_gpus_per_instance + sd.decode_replicas * sd.decode_gpus_per_instance), 0)))
        training, serving = int(training or 0), int(serving or 0)
        return {"nodes": int(nodes), "gpus": int(total), "schedulableGpus": int(sched),
                "trainingGpus": training, "servingGpus": serving, "freeGpus": max(0, int(sched) - training - serving)}

    def gpu_map(self) -> tuple[list[tuple[Any, ...]], list[tuple[str, str, int]]]:
        """Every node (name, domain, rack label or None, GPUs, ready, unschedulable, healthy, taint, GPUs out) by
        name, and
        every training allocation (node, job, GPUs): what the console's GPU map draws, in two queries. Polled by
        every open console, so it reads only these columns (the rack out of the labels in SQL) and skips the ORM
        (2-3 times faster at 1,000 nodes)."""
        n = NodeRow
        nodes_q = sa.select(n.name, n.domain, n.labels[RACK_LABEL].as_string(), n.total_gpus, n.ready,
                            n.unschedulable, n.healthy, n.taint, n.gpus_out).order_by(n.name)
        allocations_q = sa.select(AllocationRow.node, AllocationRow.job, AllocationRow.gpus).order_by(AllocationRow.job)
        with self.engine.connect() as c:
            nodes = [tuple(r) for r in c.execute(nodes_q)]
            allocations = [(node, job, gpus) for node, job, gpus in c.execute(allocations_q)]
        return nodes, allocations

    def reservations(self) -> list[tuple[str, str, int, int, float]]:
        """(key, phase, minGPUs, GPUs now, deadline) of every admitted, unfinished job with a deadline ahead."""
        j = TrainingJobRow
        with self.session() as s:
            return [tuple(r) for r in s.execute(  # type: ignore[misc]
                sa.select(j.key, j.phase, j.min_gpus, j.gpus, j.deadline)
                .where(j.phase.in_(ADMITTED), j.deadline.is_not(None), j.deadline > self.clock())
                .order_by(j.deadline.desc(), j.key))]

    def node_health_counts(self) -> dict[str, int]:
        with self.session() as s:
            healthy = s.scalar(sa.select(sa.func.count()).where(NodeRow.healthy.is_(True)))
            cordoned = s.scalar(sa.select(sa.func.count()).where(NodeRow.unschedulable.is_(True)))
            total = s.scalar(sa.select(sa.func.count()).select_from(NodeRow))
        return {"total": int(total or 0), "unhealthy": int(total or 0) - int(healthy or 0),
                "cordoned": int(cordoned or 0)}

    # ---- samples ----

    def add_samples(self, samples: Sequence[Sample]) -> None:
        if not samples:
            return
        with self.session.begin() as s:
            s.execute(sa.insert(SampleRow), [
                {"ts": x.ts, "node": x.node, "metric": x.metric, "value": x.value, "job": x.job, "gpu": x.gpu,
                 "role": x.role, "rank": x.rank}
                for x in samples])

    def add_samples_or_refuse(self, samples: Sequence[Sample]) -> list[tuple[Sample, str]]:
        """Store what the database takes -> [(a sample it refused, why)]. One transaction for the batch; when
        that is refused, a transaction per sample, so that one bad sample costs no other. An outage raises."""
        try:
            self.add_samples(samples)
            return []
        except Exception as e:
            if is_outage(e):
                raise
        refused = []
        for sample in samples:
            try:
                self.add_samples([sample])
            except Exception as e:
                if is_outage(e):
                    raise
                refused.append((sample, _one_line(e)))
        return refused

    # ---- deciders' memory ----

    def remember(self, kind: str, key: str, value: dict[str, Any] | None) -> None:
        """Keep (None: forget) what decider `kind` must remember about `key` across a restart."""
        with self.session.begin() as s:
            if value is None:
                s.execute(sa.delete(MemoryRow).where(MemoryRow.kind == kind, MemoryRow.key == key))
            else:
                s.merge(MemoryRow(kind=kind, key=key, value=value, updated=self.clock()))

    def recall(self, kind: str) -> dict[str, dict[str, Any]]:
        """key -> what decider `kind` remembered."""
        with self.session() as s:
            return {r.key: r.value for r in s.scalars(sa.select(MemoryRow).where(MemoryRow.kind == kind))}

    # ---- dead letters ----

    def add_dead_letters(self, letters: Iterable[tuple[str, str, str, bytes]]) -> None:
        """(transport, source, reason, raw) of entries never to be stored."""
        now = self.clock()
        with self.session.begin() as s:
            s.add_all(DeadLetterRow(time=now, transport=t, source=src, reason=why, raw=raw)
                      for t, src, why, raw in letters)

    def dead_letters(self, limit: int = 100) -> list[DeadLetterRow]:
        """The newest first."""
        with self.session() as s:
            return list(s.scalars(sa.select(DeadLetterRow).order_by(DeadLetterRow.id.desc()).limit(limit)))

    def drop_dead_letters_before(self, ts: float) -> int:
        with self.session.begin() as s:
            return _deleted(s.execute(sa.delete(DeadLetterRow).where(DeadLetterRow.time < ts)))

    def latest_samples(self, node: str, limit: int = 50) -> list[SampleRow]:
        """The newest sample of each metric (and GPU) seen from `node`."""
        newest = (sa.select(SampleRow.metric, SampleRow.gpu, sa.func.max(SampleRow.ts).label("ts"))
                  .where(SampleRow.node == node).group_by(SampleRow.metric, SampleRow.gpu).subquery())
        q = (sa.select(SampleRow).join(newest, sa.and_(SampleRow.metric == newest.c.metric,
                                                       SampleRow.ts == newest.c.ts,
                                                       sa.or_(SampleRow.gpu == newest.c.gpu,
                                                              sa.and_(SampleRow.gpu.is_(None), newest.c.gpu.is_(None)))))
             .where(SampleRow.node == node).order_by(SampleRow.metric, SampleRow.gpu).limit(limit))
        with self.session() as s:
            return list(s.scalars(q))

    def drop_samples_before(self, ts: float) -> int:
        with self.session.begin() as s:
            return _deleted(s.execute(sa.delete(SampleRow).where(SampleRow.ts < ts)))

    # ---- idempotency keys ----

    def idempotent_answer(self, key: str) -> IdempotencyRow | None:
        with self.session() as s:
            return s.get(IdempotencyRow, key)

    def remember_answer(self, key: str, request: str, status: int, response: dict[str, Any]) -> None:
        with self.session.begin() as s:
            s.merge(IdempotencyRow(key=key, request=request, status=status, response=response, created=self.clock()))

    def drop_answers_before(self, ts: float) -> int:
        with self.session.begin() as s:
            return _deleted(s.execute(sa.delete(IdempotencyRow).where(IdempotencyRow.created < ts)))

    # ---- queues ----

    def all_queues(self) -> list[QueueRow]:
        with self.session() as s:
            return list(s.scalars(sa.select(QueueRow).order_by(QueueRow.name)))

    def queue_records(self) -> list[queue_records.QueueRecord]:
        return [_queue_record(r) for r in self.all_queues()]

    def queue(self, name: str) -> QueueRow | None:
        with self.session() as s:
            return s.get(QueueRow, name)

    def queue_members(self, name: str) -> tuple[list[tuple[TrainingJobRow, str]], list[ServingDeploymentRow]]:
        """The TrainingJobs (with their outlook) and ServingDeployments whose status.queue is `name`."""
        with self.session() as s:
            jobs = [(r, o) for r, o in s.execute(sa.select(TrainingJobRow, outlook_expr(self.clock()))
                                                  .where(TrainingJobRow.queue == name).order_by(TrainingJobRow.key))]
            servings = list(s.scalars(sa.select(ServingDeploymentRow).where(ServingDeploymentRow.queue == name)
                                      .order_by(ServingDeploymentRow.key)))
        return jobs, servings

    def queue_outlooks(self) -> dict[str, dict[str, int]]:
        """queue -> {outlook: TrainingJobs}, for the queues' jobs."""
        ol = outlook_expr(self.clock())
        out: dict[str, dict[str, int]] = {}
        with self.session() as s:
            for queue, outlook, n in s.execute(sa.select(TrainingJobRow.queue, ol, sa.func.count())
                                               .where(TrainingJobRow.queue.is_not(None), TrainingJobRow.queue != "")
                                               .group_by(TrainingJobRow.queue, ol)):
                out.setdefault(str(queue), {o: 0 for o in OUTLOOKS})[outlook] = int(n)
        return out

    def queue_usage(self, name: str, *, limit: int, since: float | None = None, until: float | None = None,
                    cursor: str | None = None) -> Page:
        """A queue's usage points (one each time its status numbers changed), oldest first."""
        q = sa.select(QueueUsageRow).where(QueueUsageRow.queue == name).order_by(QueueUsageRow.id).limit(limit + 1)
        if cursor is not None:
            q = q.where(QueueUsageRow.id > int(cursor))
        if since is not None:
            q = q.where(QueueUsageRow.time >= since)
        if until is not None:
            q = q.where(QueueUsageRow.time < until)
        with self.session() as s:
            rows = list(s.scalars(q))
        return Page(rows[:limit], str(rows[limit - 1].id) if len(rows) > limit else None)

    def drop_queue_usage_before(self, ts: float) -> int:
        with self.session.begin() as s:
            return _deleted(s.execute(sa.delete(QueueUsageRow).where(QueueUsageRow.time < ts)))

    def ping(self) -> None:
        with self.session() as s:
            s.execute(sa.text("SELECT 1"))

