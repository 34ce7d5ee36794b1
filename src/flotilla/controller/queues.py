"""Teams' Queues as the controller sees them (pure): the Queue object read into a record, the audit-trail
decisions a change of it amounts to (loans), the loans between queues, and the reclaims seen on jobs.

A Queue is the cluster-scoped `flotilla.dev/v1alpha1` object the operator writes status to (see
docs/tenancy.md): spec.resources [{name, nominal, borrowingLimit?, lendingLimit?}], weight, parent,
namespaces; status nominal, used, borrowed, lent, admitted, pending, guaranteed, conditions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from flotilla.controller.mirror import DecisionRecord
from flotilla.controller.reclaims import ReclaimSign
from flotilla.resources import parse, queue
from flotilla.tenancy import RESOURCE_GPU, QueueSpec, Quota

# The numbers of a Queue's status, in the order the API, the usage history and the metrics show them.
USAGE_FIELDS = ("nominal", "used", "borrowed", "lent", "guaranteed", "admitted", "pending")


@dataclass(frozen=True)
class QueueRecord:
    name: str
    uid: str
    parent: str | None
    weight: float
    namespaces: tuple[str, ...]
    nominal: int  # spec: nvidia.com/gpu nominal
    borrowing_limit: int | None
    lending_limit: int | None
    usage: Mapping[str, int]  # status: USAGE_FIELDS -> int (0 before the operator wrote any)
    last_condition: str  # "Reason: message" of the newest status condition
    spec: Mapping[str, Any] = field(default_factory=dict)  # as the object says, for the API
    status: Mapping[str, Any] = field(default_factory=dict)


def parse_queue(obj: Mapping[str, Any]) -> QueueRecord:
    """A Queue object as the API server returns it -> QueueRecord; ValueError naming the field when malformed
    (flotilla.resources.queue reads it)."""
    q = queue.parse(obj)
    gpu = q.spec.quotas.get(RESOURCE_GPU) or Quota(nominal=0)
    return QueueRecord(
        name=q.name, uid=q.uid, parent=q.spec.parent, weight=q.spec.weight, namespaces=q.spec.namespaces,
        nominal=gpu.nominal, borrowing_limit=gpu.borrowing_limit, lending_limit=gpu.lending_limit,
        usage={f: parse.integer(q.status, f, "status") for f in USAGE_FIELDS},
        last_condition=parse.last_condition(q.conditions),
        spec=dict(parse.mapping(obj, "spec", "")), status=dict(q.status))


def queue_spec(rec: QueueRecord) -> QueueSpec:
    return QueueSpec(rec.name, {RESOURCE_GPU: Quota(rec.nominal, rec.borrowing_limit, rec.lending_limit)},
                     rec.weight, rec.parent, rec.namespaces)


def queue_changes(old: QueueRecord | None, new: QueueRecord, now: float) -> list[DecisionRecord]:
    """Loans (borrowed or lent GPUs changed) and quota changes of one queue, for the audit trail."""
    out: list[DecisionRecord] = []
    before = dict(old.usage) if old is not None else {f: 0 for f in USAGE_FIELDS}
    why = new.last_condition
    for what, verb_up, verb_down in (("borrowed", "borrowed", "gave back"), ("lent", "lent", "got back")):
        delta = new.usage[what] - before[what]
        if delta:
            reason = f"{verb_up if delta > 0 else verb_down} {abs(delta)} GPUs (now {what} {new.usage[what]})"
            out.append(DecisionRecord("loan", "Queue", new.name, f"{reason}: {why}" if why else reason, {
                "field": what, "from": before[what], "to": new.usage[what], "used": new.usage["used"],
                "nominal": new.usage["nominal"] or new.nominal}, time=now))
    if old is not None and (old.nominal, old.borrowing_limit, old.lending_limit, old.weight, old.parent) != (
            new.nominal, new.borrowing_limit, new.lending_limit, new.weight, new.parent):
        out.append(DecisionRecord("quota", "Queue", new.name, "Queue spec changed", {
            "from": _quota_view(old), "to": _quota_view(new)}, time=now))
    return out


def _quota_view(rec: QueueRecord) -> dict[str, Any]:
    return {"nominal": rec.nominal, "borrowingLimit": rec.borrowing_limit, "lendingLimit": rec.lending_limit,
            "weight": rec.weight, "parent": rec.parent}


@dataclass(frozen=True)
class Loan:
    lender: str
    borrower: str
    gpus: int


def loans(queues: Sequence[QueueRecord]) -> list[Loan]:
    """Who borrows from whom, from the queues' status (which says only how much each lent and borrowed).

    Among the leaf queues (a parent's status sums its children's), each borrower, by name, takes what it
    borrowed first from its siblings' lent GPUs, then from the other lenders', split between the lenders of
    each group in proportion to what they still lend (largest remainder, ties by name). Exact with one lender;
    with several it is the proportional estimate the status allows, the same on every call."""
    parents = {q.parent for q in queues if q.parent}
    leaves = [q for q in queues if q.name not in parents]
    remaining = {q.name: q.usage["lent"] for q in sorted(leaves, key=lambda q: q.name) if q.usage["lent"] > 0}
    parent_of = {q.name: q.parent for q in leaves}
    out: list[Loan] = []
    for b in sorted((q for q in leaves if q.usage["borrowed"] > 0), key=lambda q: q.name):
        want = b.usage["borrowed"]
        siblings = [n for n in remaining if n != b.name and b.parent is not None and parent_of[n] == b.parent]
        others = [n for n in remaining if n != b.name and n not in siblings]
        for group in (siblings, others):
            take = min(want, sum(remaining[n] for n in group))
            if take <= 0:
                continue
            for name, gpus in _split(take, {n: remaining[n] for n in group}).items():
                if gpus:
                    remaining[name] -= gpus
                    out.append(Loan(name, b.name, gpus))
            want -= take
    return sorted(out, key=lambda x: (x.borrower, x.lender))


def _split(total: int, weights: Mapping[str, int]) -> dict[str, int]:
    """`total` split in proportion to `weights` (largest remainder, ties by name); no share above its weight."""
    whole = sum(weights.values())
    exact = {n: total * w / whole for n, w in weights.items()}
    shares = {n: int(x) for n, x in exact.items()}
    for n in sorted(exact, key=lambda n: (-(exact[n] - shares[n]), n))[:total - sum(shares.values())]:
        shares[n] += 1
    return shares


def reclaim_decision(key: str, object_kind: str, queue: str, gpus_from: int, gpus_to: int,
                     sign: ReclaimSign | None, now: float) -> tuple[DecisionRecord, float | None] | None:
    """A job that gave GPUs back while a reclaim was asked of it -> the reclaim decision and how long the
    reclaim took (from the operator's condition or request to the smaller allocation seen); None otherwise."""
    if sign is None or gpus_to >= gpus_from:
        return None
    seconds = max(0.0, now - sign.since) if sign.since is not None else None
    return DecisionRecord("reclaim", object_kind, key, sign.reason, {
        "fromQueue": queue, "toQueue": sign.to_queue, "gpusFrom": gpus_from, "gpusTo": gpus_to,
        "gpus": gpus_from - gpus_to, "seconds": seconds, "signal": sign.signal}, time=now), seconds
