"""A Node, as the operator and the controller read it: GPUs, readiness and Flotilla's health marks. Pure."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
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
    # GPU index -> why, for GPUs out of service on their own (a device-local fault; names.ANNOTATION_UNHEALTHY_GPUS)
    gpus_out: Mapping[int, str] = field(default_factory=dict)
    # Why that annotation could not be read (the node is then not schedulable: which GPUs are out is unknown)
    gpus_out_error: str | None = None

    @property
    def healthy(self) -> bool:
        return self.healthy_condition.get("status") != "False"

    @property
    def in_service_gpus(self) -> int | None:
        """Allocatable GPUs less those out of service on their own: what placement may give out."""
        if self.allocatable_gpus is None:
            return None
        return max(0, self.allocatable_gpus - sum(1 for g in self.gpus_out if g < self.allocatable_gpus))

    @property
    def schedulable(self) -> bool:
        """Ready, not cordoned, not tainted unhealthy, its out-of-service GPUs known: the allocator may place work
        on it."""
        return (self.ready and not self.unschedulable and self.unhealthy_taint is None
                and self.gpus_out_error is None)


def _gpus(resources: Mapping[str, Any], where: str) -> int | None:
    if names.GPU_RESOURCE not in resources:
        return None
    raw = resources[names.GPU_RESOURCE]
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{where}[{names.GPU_RESOURCE!r}] must be a whole number, got {raw!r}") from None


def gpus_out(annotations: Mapping[str, Any]) -> dict[int, str]:
    """The node's out-of-service GPUs from its annotation (`{"<index>": "<why>"}`); {} when it has none."""
    key = names.ANNOTATION_UNHEALTHY_GPUS
    raw = annotations.get(key)
    if raw in (None, ""):
        return {}
    where = f"metadata.annotations[{key!r}]"
    try:
        parsed = json.loads(str(raw))
    except ValueError:
        raise ValueError(f"{where} must be a JSON object {{\"<GPU index>\": \"<reason>\"}}, got {raw!r}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"{where} must be a JSON object {{\"<GPU index>\": \"<reason>\"}}, got {raw!r}")
    out = {}
    for k, why in parsed.items():
        if not str(k).isdigit():
            raise ValueError(f"{where}: key {k!r} must be a GPU index (a whole number >= 0)")
        out[int(k)] = str(why)
    return out


def parse(obj: Mapping[str, Any]) -> Node:
    _, name, meta = metadata(obj, namespaced=False)
    spec, status = mapping(obj, "spec", ""), mapping(obj, "status", "")
    by_type = {c.get("type"): c for c in conditions(status)}
    taints = spec.get("taints") or []
    taint = next((t for t in taints if isinstance(t, Mapping) and t.get("key") == names.TAINT_UNHEALTHY), None)
    annotations = mapping(meta, "annotations", "metadata")
    try:
        out, out_error = gpus_out(annotations), None
    except ValueError as e:
        out, out_error = {}, str(e)
    return Node(
        name=name,
        labels={str(k): str(v) for k, v in mapping(meta, "labels", "metadata").items()},
        annotations=annotations,
        capacity_gpus=_gpus(mapping(status, "capacity", "status"), "status.capacity") or 0,
        allocatable_gpus=_gpus(mapping(status, "allocatable", "status"), "status.allocatable"),
        ready=by_type.get("Ready", {}).get("status") == "True",
        unschedulable=bool(spec.get("unschedulable", False)),
        healthy_condition=by_type.get(names.NODE_CONDITION_HEALTHY, {}),
        unhealthy_taint=taint,
        gpus_out=out,
        gpus_out_error=out_error,
    )
