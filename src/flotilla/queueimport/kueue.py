"""Kueue's ClusterQueues and Cohorts (kueue.x-k8s.io/v1beta2) translated into Flotilla Queues (pure).

The mapping, field by field, and what has no equivalent: docs/queues-import.md. Two differences of model shape it:
a Kueue Cohort's nominalQuota is a pool *on top of* its members', while a Flotilla parent's nominal *holds* its
children's (so a cohort's Queue gets its own pool plus its members'); and Kueue shares nothing outside a cohort
tree (so a ClusterQueue with no cohort, and a root cohort, get borrowingLimit 0 and lendingLimit 0). What has no
equivalent is returned as a `Note` each, and left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from flotilla.tenancy import RESOURCE_GPU, QueueProblem, QueueSpec, Quota, validate_queues

API_VERSION = "flotilla.dev/v1alpha1"
NAME_LABEL = "kubernetes.io/metadata.name"
# Kueue ClusterQueue fields whose behaviour Flotilla has its own answer to (no equivalent field).
_NO_EQUIVALENT_SPEC = {
    "queueingStrategy": "Flotilla orders a queue's jobs by priority and deadline (admission against its nominal share)",
    "flavorFungibility": "GPU types are not yet resources of their own",
    "admissionChecks": "Flotilla admits against the queue's nominal share and the job's deadline only",
    "admissionChecksStrategy": "Flotilla admits against the queue's nominal share and the job's deadline only",
    "admissionScope": "Flotilla admits against the queue's nominal share and the job's deadline only",
    "stopPolicy": "no stopped-queue state; delete or lower the Queue instead",
}
_QUANTITY = re.compile(r"^([0-9]+)(k|M|G|T|P|E)?$")
_SUFFIX = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


@dataclass(frozen=True)
class Note:
    """Something of the Kueue objects that has no equivalent in the Queues printed (it was left out)."""

    kind: str  # ClusterQueue or Cohort
    name: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}: {self.field}: {self.message}"


@dataclass(frozen=True)
class Translation:
    queues: tuple[QueueSpec, ...]
    notes: tuple[Note, ...]
    problems: tuple[QueueProblem, ...] = ()  # validate_queues of what was translated
    sources: Mapping[str, str] = field(default_factory=dict)  # queue -> "ClusterQueue x" / "Cohort y"


@dataclass
class _Gpu:
    nominal: int = 0
    borrowing_limit: int | None = None
    lending_limit: int | None = None


def translate(objects: Sequence[Mapping[str, Any]],
              namespace_labels: Mapping[str, Mapping[str, str]] | None = None) -> Translation:
    """ClusterQueues and Cohorts (any other kind is noted and skipped) -> Queues, notes, and the problems
    `validate_queues` finds in them. `namespace_labels`: every namespace's labels, when a cluster was read; a
    namespaceSelector is then matched against them; without them only selectors by namespace name map."""
    notes: list[Note] = []
    cqs = [o for o in objects if o.get("kind") == "ClusterQueue"]
    cohorts = {_name(o): o for o in objects if o.get("kind") == "Cohort"}
    for o in objects:
        if o.get("kind") not in ("ClusterQueue", "Cohort"):
            notes.append(Note(str(o.get("kind") or "object"), _name(o), "kind",
                              "not a ClusterQueue or Cohort; skipped"))

    own: dict[str, _Gpu] = {}
    parent: dict[str, str | None] = {}
    weight: dict[str, float] = {}
    namespaces: dict[str, tuple[str, ...]] = {}
    sources: dict[str, str] = {}
    for cq in cqs:
        name, spec = _name(cq), _spec(cq)
        sources[name] = f"ClusterQueue {name}"
        own[name] = _gpu_quota("ClusterQueue", name, spec, notes)
        parent[name] = spec.get("cohortName") or None
        weight[name] = _weight("ClusterQueue", name, spec, notes)
        namespaces[name] = _namespaces(name, spec.get("namespaceSelector"), namespace_labels, notes)
        _preemption_notes(name, spec, notes)
        for key, why in _NO_EQUIVALENT_SPEC.items():
            if spec.get(key):
                notes.append(Note("ClusterQueue", name, f"spec.{key}", f"no equivalent ({why}); left out"))
        if parent[name] is None:  # a ClusterQueue outside any cohort is isolated
            own[name].borrowing_limit, own[name].lending_limit = 0, 0

    # Cohorts named by a ClusterQueue or a Cohort but never created are Kueue's implicit cohorts.
    named = {p for p in parent.values() if p} | {c for o in cohorts.values() if (c := _spec(o).get("parentName"))}
    for name in sorted(named | set(cohorts)):
        obj = cohorts.get(name, {})
        spec = _spec(obj)
        if name in sources:
            notes.append(Note("Cohort", name, "metadata.name", "a ClusterQueue has the same name; the Cohort "
                              "is left out and its members join the ClusterQueue's Queue"))
            continue
        sources[name] = f"Cohort {name}" if obj else f"Cohort {name} (implicit)"
        own[name] = _gpu_quota("Cohort", name, spec, notes)
        parent[name] = spec.get("parentName") or None
        weight[name] = _weight("Cohort", name, spec, notes)
        namespaces[name] = ()

    children: dict[str, list[str]] = {}
    for name, p in parent.items():
        if p is not None:
            children.setdefault(p, []).append(name)
    for name in own:
        if parent[name] is None and sources[name].startswith("Cohort") and children.get(name):
            # Kueue shares nothing between cohort trees: the root's Queue neither borrows nor lends.
            own[name].borrowing_limit, own[name].lending_limit = 0, 0

    nominal: dict[str, int] = {}

    def total(name: str, path: tuple[str, ...]) -> int:
        if name in nominal:
            return nominal[name]
        if name in path:  # a cycle of cohorts: validate_queues reports it
            return own[name].nominal
        nominal[name] = own[name].nominal + sum(total(c, path + (name,)) for c in children.get(name, ()))
        return nominal[name]

    queues = []
    for name in sorted(own):
        g = own[name]
        n = total(name, ())
        if g.lending_limit is not None and g.lending_limit > n:
            g.lending_limit = n
        queues.append(QueueSpec(name, {RESOURCE_GPU: Quota(n, g.borrowing_limit, g.lending_limit)},
                                weight[name], parent[name], namespaces[name]))
    return Translation(tuple(queues), tuple(notes), tuple(validate_queues(queues)), sources)


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec") or {}
    return spec if isinstance(spec, Mapping) else {}


def quantity(value: Any) -> int | None:
    """A Kubernetes quantity of whole units (8, "8", "2k") -> int; None when it is not a whole number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    found = _QUANTITY.match(str(value).strip())
    return int(found.group(1)) * _SUFFIX[found.group(2)] if found else None


def _gpu_quota(kind: str, name: str, spec: Mapping[str, Any], notes: list[Note]) -> _Gpu:
    """The nvidia.com/gpu quota over every flavor (summed, noted when more than one flavor holds GPUs)."""
    gpu = _Gpu()
    flavors_with_gpu: list[str] = []
    limits: dict[str, list[int | None]] = {"borrowingLimit": [], "lendingLimit": []}
    for i, group in enumerate(spec.get("resourceGroups") or []):
        for flavor in group.get("flavors") or []:
            for resource in flavor.get("resources") or []:
                rname = resource.get("name")
                where = f"spec.resourceGroups[{i}].flavors[{flavor.get('name')}].resources[{rname}]"
                if rname != RESOURCE_GPU:
                    notes.append(Note(kind, name, where, f"no equivalent (Queues hold {RESOURCE_GPU} only); "
                                                         "left out"))
                    continue
                flavors_with_gpu.append(str(flavor.get("name")))
                n = quantity(resource.get("nominalQuota", 0))
                if n is None:
                    notes.append(Note(kind, name, f"{where}.nominalQuota",
                                      f"{resource.get('nominalQuota')!r} is not a whole number of GPUs; left out"))
                    n = 0
                gpu.nominal += n
                for key in limits:
                    raw = resource.get(key)
                    value = quantity(raw) if raw is not None else None
                    if raw is not None and value is None:
                        notes.append(Note(kind, name, f"{where}.{key}", f"{raw!r} is not a whole number; left out"))
                    limits[key].append(value)
    if len(flavors_with_gpu) > 1:
        notes.append(Note(kind, name, "spec.resourceGroups",
                          f"{RESOURCE_GPU} in flavors {', '.join(flavors_with_gpu)}: no equivalent for flavors beyond "
                          "one (GPU types are not yet resources of their own); their quotas are summed"))
    gpu.borrowing_limit = _summed(limits["borrowingLimit"])
    gpu.lending_limit = _summed(limits["lendingLimit"])
    return gpu


def _summed(values: list[int | None]) -> int | None:
    """Limits over flavors: their sum when every flavor sets one; no limit when any flavor has none."""
    return sum(v for v in values if v is not None) if values and all(v is not None for v in values) else None


def _weight(kind: str, name: str, spec: Mapping[str, Any], notes: list[Note]) -> float:
    raw = (spec.get("fairSharing") or {}).get("weight")
    if raw is None:
        return 1.0
    text = str(raw).strip()
    try:
        w = float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    except ValueError:
        w = -1.0
    if w <= 0:
        notes.append(Note(kind, name, "spec.fairSharing.weight",
                          f"{raw!r}: no equivalent (Flotilla weights are > 0); the default 1 is used"))
        return 1.0
    return w


def _preemption_notes(name: str, spec: Mapping[str, Any], notes: list[Note]) -> None:
    preemption = spec.get("preemption") or {}
    for key in ("reclaimWithinCohort", "withinClusterQueue"):
        policy = preemption.get(key)
        if policy and policy != "Never":
            notes.append(Note("ClusterQueue", name, f"spec.preemption.{key}",
                              f"{policy}: no equivalent (Flotilla reclaims a queue's nominal GPUs by shrinking "
                              "borrowers through checkpoints, never by eviction; within a queue, by priority)"))
    borrow = (preemption.get("borrowWithinCohort") or {}).get("policy")
    if borrow and borrow != "Never":
        notes.append(Note("ClusterQueue", name, "spec.preemption.borrowWithinCohort",
                          f"{borrow}: no equivalent (nothing is ever promised out of borrowed GPUs)"))


def _namespaces(name: str, selector: Any, labels: Mapping[str, Mapping[str, str]] | None,
                notes: list[Note]) -> tuple[str, ...]:
    if selector is None:  # Kueue: no namespace may submit; Flotilla: jobs must name the queue
        return ()
    if labels is not None and selector:
        return tuple(sorted(ns for ns, lab in labels.items() if _matches(selector, {**lab, NAME_LABEL: ns})))
    by_name = _names_selected(selector)
    if by_name is None:
        what = "every namespace" if not selector else "namespaces by labels"
        notes.append(Note("ClusterQueue", name, "spec.namespaceSelector",
                          f"selects {what}: no equivalent offline (Queues list their namespaces; read the "
                          "cluster instead of -f, or name the queue in each job's spec.queue); left out"))
        return ()
    return by_name


def _names_selected(selector: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The namespaces a selector picks by name alone (kubernetes.io/metadata.name); None when it needs labels."""
    match = dict(selector.get("matchLabels") or {})
    expressions = list(selector.get("matchExpressions") or [])
    if not match and not expressions:
        return None
    names: set[str] | None = None
    if match:
        if set(match) != {NAME_LABEL}:
            return None
        names = {match[NAME_LABEL]}
    for e in expressions:
        if e.get("key") != NAME_LABEL or e.get("operator") != "In":
            return None
        values = set(e.get("values") or [])
        names = values if names is None else names & values
    return tuple(sorted(names or ()))


def _matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), set(e.get("values") or [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def queue_object(q: QueueSpec) -> dict[str, Any]:
    """A QueueSpec as the Queue object to apply."""
    quota = q.quota(RESOURCE_GPU)
    gpu: dict[str, Any] = {"name": RESOURCE_GPU, "nominal": quota.nominal}
    if quota.borrowing_limit is not None:
        gpu["borrowingLimit"] = quota.borrowing_limit
    if quota.lending_limit is not None:
        gpu["lendingLimit"] = quota.lending_limit
    spec: dict[str, Any] = {"resources": [gpu]}
    if q.weight != 1.0:
        spec["weight"] = q.weight
    if q.parent:
        spec["parent"] = q.parent
    if q.namespaces:
        spec["namespaces"] = list(q.namespaces)
    return {"apiVersion": API_VERSION, "kind": "Queue", "metadata": {"name": q.name}, "spec": spec}
