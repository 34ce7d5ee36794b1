"""A Queue (cluster-scoped), as the operator reads it: its spec as the tenancy decision's `QueueSpec`. Pure.
A malformed object raises ValueError naming the field (the API server's schema refuses most of them first)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from flotilla.resources.parse import conditions, integer, mapping, metadata, number, optional_integer
from flotilla.tenancy import QueueSpec, Quota

PLURAL = "queues"


@dataclass(frozen=True)
class Queue:
    name: str
    uid: str
    generation: int
    spec: QueueSpec
    status: Mapping[str, Any]
    conditions: tuple[Mapping[str, Any], ...]


def _quotas(spec: Mapping[str, Any]) -> dict[str, Quota]:
    raw = spec.get("resources") or []
    if not isinstance(raw, list):
        raise ValueError("spec.resources must be a list")
    out: dict[str, Quota] = {}
    for i, entry in enumerate(raw):
        where = f"spec.resources[{i}]"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where} must be an object")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}.name must be a non-empty string")
        if name in out:
            raise ValueError(f"{where}.name: {name!r} is listed twice")
        out[name] = Quota(nominal=integer(entry, "nominal", where),
                          borrowing_limit=optional_integer(entry, "borrowingLimit", where),
                          lending_limit=optional_integer(entry, "lendingLimit", where))
    return out


def parse(obj: Mapping[str, Any]) -> Queue:
    _, name, meta = metadata(obj, namespaced=False)
    spec, status = mapping(obj, "spec", ""), mapping(obj, "status", "")
    parent = spec.get("parent")
    if parent is not None and not isinstance(parent, str):
        raise ValueError("spec.parent must be a string")
    namespaces = spec.get("namespaces") or []
    if not isinstance(namespaces, list) or not all(isinstance(n, str) for n in namespaces):
        raise ValueError("spec.namespaces must be a list of strings")
    weight = number(spec, "weight", "spec")
    return Queue(
        name=name, uid=str(meta.get("uid") or ""), generation=integer(meta, "generation", "metadata"),
        spec=QueueSpec(name=name, quotas=_quotas(spec), weight=1.0 if weight is None else weight,
                       parent=parent or None, namespaces=tuple(namespaces)),
        status=status, conditions=conditions(status))


def crd_field(field: str) -> str:
    """A tenancy problem's field (`spec.quotas[nvidia.com/gpu].lendingLimit`) as the Queue CRD names it
    (`spec.resources[nvidia.com/gpu].lendingLimit`: the list is keyed by name)."""
    return field.replace("spec.quotas[", "spec.resources[", 1)
