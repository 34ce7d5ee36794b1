"""A Node, as the operator and the controller read it: GPUs, readiness and Flotilla's health marks. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from flotilla.resources import names
from flotilla.resources.parse import conditions, mapping, metadata


@dataclass(frozen=True)
class Node:
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, Any]
    capacity_gpus: int  # status.capacity: what the machine has
    allocatable_gpus: int | None  # status.allocatable: what pods may request; None when it names no GPUs
    ready: bool
    unschedulable: bool
    healthy_condition: Mapping[str, Any]  # the FlotillaGPUHealthy condition; {} when there is none
    unhealthy_taint: Mapping[str, Any] | None  # Flotilla's unhealthy taint, when the node has it

    @property
    def healthy(self) -> bool:
        return self.healthy_condition.get("status") != "False"

    @property
    def schedulable(self) -> bool:
        """Ready, not cordoned, not tainted unhealthy: the allocator may place work on it."""
        return self.ready and not self.unschedulable and self.unhealthy_taint is None


def _gpus(resources: Mapping[str, Any], where: str) -> int | None:
    if names.GPU_RESOURCE not in resources:
        return None
    raw = resources[names.GPU_RESOURCE]
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{where}[{names.GPU_RESOURCE!r}] must be a whole number, got {raw!r}") from None


def parse(obj: Mapping[str, Any]) -> Node:
    _, name, meta = metadata(obj, namespaced=False)
    spec, status = mapping(obj, "spec", ""), mapping(obj, "status", "")
    by_type = {c.get("type"): c for c in conditions(status)}
    taints = spec.get("taints") or []
    taint = next((t for t in taints if isinstance(t, Mapping) and t.get("key") == names.TAINT_UNHEALTHY), None)
    return Node(
        name=name,
        labels={str(k): str(v) for k, v in mapping(meta, "labels", "metadata").items()},
        annotations=mapping(meta, "annotations", "metadata"),
        capacity_gpus=_gpus(mapping(status, "capacity", "status"), "status.capacity") or 0,
        allocatable_gpus=_gpus(mapping(status, "allocatable", "status"), "status.allocatable"),
        ready=by_type.get("Ready", {}).get("status") == "True",
        unschedulable=bool(spec.get("unschedulable", False)),
        healthy_condition=by_type.get(names.NODE_CONDITION_HEALTHY, {}),
        unhealthy_taint=taint,
    )
