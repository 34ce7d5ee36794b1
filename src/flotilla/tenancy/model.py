"""Teams' queues as the tenancy decision reads them: quotas, weights, a tree, namespaces; their validation.

Field names follow Kueue's ClusterQueue and KAI's Queue (nominal, borrowingLimit, lendingLimit, weight,
parent). Resources are keyed by name so that GPU types can become resources of their own later.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

RESOURCE_GPU = "nvidia.com/gpu"
IMPLICIT_QUEUE = ""  # the queue a job is in when the cluster has no Queue objects


@dataclass(frozen=True)
class Quota:
    """One resource's share of a queue.

    nominal: what the queue is guaranteed; its deadlines are promised out of it.
    borrowing_limit: the most it may use above its nominal (None: no limit).
    lending_limit: the most of its unused nominal that others may borrow (None: all of it).
    """

    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None


@dataclass(frozen=True)
class QueueSpec:
    name: str
    quotas: Mapping[str, Quota]  # keyed by resource name; today only RESOURCE_GPU
    weight: float = 1.0  # share of idle GPUs
    parent: str | None = None  # a tree: children's nominal fits inside the parent's
    namespaces: tuple[str, ...] = ()  # namespaces it serves by default

    def quota(self, resource: str = RESOURCE_GPU) -> Quota:
        return self.quotas.get(resource, Quota(0, 0, 0))


@dataclass(frozen=True)
class QueueProblem:
    queue: str
    field: str  # like "spec.quotas[nvidia.com/gpu].borrowingLimit"
    message: str


def _quota_field(resource: str, name: str) -> str:
    return f"spec.quotas[{resource}].{name}"


def validate_queues(queues: Sequence[QueueSpec], cluster: Mapping[str, int] | None = None) -> list[QueueProblem]:
    """Every problem of a set of queues, each naming its queue and field; an empty list when they are sound.

    `cluster`: capacity per resource; the sum of the roots' nominal above it is reported (not fatal: the
    guarantees are then kept in the order of the tree, and a node loss can do the same).
    """
    problems: list[QueueProblem] = []
    by_name: dict[str, QueueSpec] = {}
    for q in queues:
        if not q.name:
            problems.append(QueueProblem(q.name, "metadata.name", "a queue needs a name"))
        elif q.name in by_name:
            problems.append(QueueProblem(q.name, "metadata.name", f"queue {q.name!r} is defined twice"))
        else:
            by_name[q.name] = q
    for q in by_name.values():
        problems.extend(_own_problems(q))
    problems.extend(_tree_problems(by_name))
    problems.extend(_namespace_problems(list(by_name.values())))
    if cluster is not None:
        problems.extend(_capacity_problems(by_name, cluster))
    return problems


def _own_problems(q: QueueSpec) -> list[QueueProblem]:
    out: list[QueueProblem] = []
    if not q.weight > 0:
        out.append(QueueProblem(q.name, "spec.weight", f"weight must be > 0, got {q.weight}"))
    if q.parent is not None and q.parent == q.name:
        out.append(QueueProblem(q.name, "spec.parent", "a queue cannot be its own parent"))
    for resource, quota in q.quotas.items():
        if quota.nominal < 0:
            out.append(QueueProblem(q.name, _quota_field(resource, "nominal"),
                                    f"nominal must be >= 0, got {quota.nominal}"))
        if quota.borrowing_limit is not None and quota.borrowing_limit < 0:
            out.append(QueueProblem(q.name, _quota_field(resource, "borrowingLimit"),
                                    f"borrowingLimit must be >= 0, got {quota.borrowing_limit}"))
        if quota.lending_limit is not None:
            if quota.lending_limit < 0:
                out.append(QueueProblem(q.name, _quota_field(resource, "lendingLimit"),
                                        f"lendingLimit must be >= 0, got {quota.lending_limit}"))
            elif quota.lending_limit > quota.nominal >= 0:
                out.append(QueueProblem(q.name, _quota_field(resource, "lendingLimit"),
                                        f"lendingLimit ({quota.lending_limit}) must be <= nominal "
                                        f"({quota.nominal})"))
    return out


def _tree_problems(by_name: Mapping[str, QueueSpec]) -> list[QueueProblem]:
    out: list[QueueProblem] = []
    for q in by_name.values():
        if q.parent is not None and q.parent != q.name and q.parent not in by_name:
            out.append(QueueProblem(q.name, "spec.parent", f"parent queue {q.parent!r} does not exist"))
    in_cycle: set[str] = set()
    for q in by_name.values():
        seen: list[str] = []
        cur: QueueSpec | None = q
        while cur is not None and cur.name not in seen:
            seen.append(cur.name)
            cur = by_name.get(cur.parent) if cur.parent is not None else None
        if cur is not None and cur.name == q.name and cur.parent != cur.name and q.name not in in_cycle:
            cycle = seen[seen.index(cur.name):]
            in_cycle.update(cycle)
            out.append(QueueProblem(q.name, "spec.parent",
                                    "the parents form a cycle: " + " -> ".join(cycle + [cycle[0]])))
    for parent in by_name.values():
        children = [c for c in by_name.values() if c.parent == parent.name and c.name != parent.name]
        if not children:
            continue
        for resource in sorted({r for c in children for r in c.quotas} | set(parent.quotas)):
            total = sum(c.quota(resource).nominal for c in children)
            own = parent.quota(resource).nominal
            if total > own:
                names = ", ".join(sorted(c.name for c in children))
                out.append(QueueProblem(parent.name, _quota_field(resource, "nominal"),
                                        f"the children's nominal ({total}: {names}) exceeds the parent's ({own})"))
    return out


def _namespace_problems(queues: Sequence[QueueSpec]) -> list[QueueProblem]:
    out: list[QueueProblem] = []
    owner: dict[str, str] = {}
    for q in queues:
        for i, ns in enumerate(q.namespaces):
            if ns in owner and owner[ns] != q.name:
                out.append(QueueProblem(q.name, f"spec.namespaces[{i}]",
                                        f"namespace {ns!r} is already served by queue {owner[ns]!r}"))
            else:
                owner.setdefault(ns, q.name)
    return out


def _capacity_problems(by_name: Mapping[str, QueueSpec], cluster: Mapping[str, int]) -> list[QueueProblem]:
    out: list[QueueProblem] = []
    roots = [q for q in by_name.values() if q.parent is None or q.parent not in by_name]
    for resource, capacity in sorted(cluster.items()):
        total = sum(q.quota(resource).nominal for q in roots)
        if total > capacity:
            for q in roots:
                if q.quota(resource).nominal > 0:
                    out.append(QueueProblem(q.name, _quota_field(resource, "nominal"),
                                            f"the root queues' nominal ({total}) exceeds the cluster's "
                                            f"{resource} ({capacity}); guarantees beyond it cannot all be kept"))
    return out


def queue_for(namespace: str, requested: str | None, queues: Sequence[QueueSpec]) -> str | None:
    """The queue a job of `namespace` is in: the one it names; else the queue serving its namespace; else None
    (no queue: the implicit queue)."""
    if requested:
        return requested
    for q in queues:
        if namespace in q.namespaces:
            return q.name
    return None
