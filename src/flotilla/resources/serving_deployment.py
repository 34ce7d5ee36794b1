"""A ServingDeployment, as the operator and the controller read it: one typed parse of the object the API
server returns (the planner's inputs are read by flotilla.serving.spec). Pure. A malformed object raises
ValueError naming the field."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from flotilla.resources.parse import (
    conditions,
    integer,
    keyed_gpus,
    mapping,
    metadata,
    number,
    optional_integer,
    parse_time,
    queue_name,
)
from flotilla.serving.spec import OBSERVED_FIELDS

SLO_FIELDS = ("ttftMs", "tpotMs", "attainment")


@dataclass(frozen=True)
class PoolRecord:
    """status.pool: the unified pool's last decision for the deployment."""

    granted_gpus: int
    peak_gpus: int
    peak_at: float | None
    below_since: float | None


@dataclass(frozen=True)
class ServingDeployment:
    namespace: str
    name: str
    uid: str
    # spec
    planner_mode: str  # auto | fixed
    prefill_gpus_per_instance: int | None  # pinned by spec.<role>.gpusPerInstance
    decode_gpus_per_instance: int | None
    min_gpus: int
    max_gpus: int | None
    slo: Mapping[str, float]
    # status
    prefill_replicas: int
    decode_replicas: int
    observed: Mapping[str, float]
    predicted_goodput: float | None
    last_plan_time: float | None
    last_plan_reason: str | None
    pool: PoolRecord | None
    conditions: tuple[Mapping[str, Any], ...]
    borrowed_from: Mapping[str, int] = field(default_factory=dict)  # TrainingJob key -> GPUs borrowed
    queue: str | None = None  # spec.queue: the Queue it names, if any

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _pool(status: Mapping[str, Any]) -> PoolRecord | None:
    pool = mapping(status, "pool", "status")
    if not pool:
        return None
    return PoolRecord(granted_gpus=integer(pool, "grantedGPUs", "status.pool"),
                      peak_gpus=integer(pool, "peakGPUs", "status.pool"),
                      peak_at=parse_time(pool.get("peakAt") or None, "status.pool.peakAt"),
                      below_since=parse_time(pool.get("belowSince") or None, "status.pool.belowSince"))


def _numbers(obj: Mapping[str, Any], keys: tuple[str, ...], where: str) -> dict[str, float]:
    return {k: v for k in keys if (v := number(obj, k, where)) is not None}


def parse(obj: Mapping[str, Any]) -> ServingDeployment:
    namespace, name, meta = metadata(obj, namespaced=True)
    spec, status = mapping(obj, "spec", ""), mapping(obj, "status", "")
    last_plan = mapping(status, "lastPlan", "status")
    return ServingDeployment(
        namespace=namespace, name=name, uid=str(meta.get("uid") or ""),
        planner_mode=str(mapping(spec, "planner", "spec").get("mode") or "auto"),
        prefill_gpus_per_instance=optional_integer(mapping(spec, "prefill", "spec"), "gpusPerInstance",
                                                   "spec.prefill"),
        decode_gpus_per_instance=optional_integer(mapping(spec, "decode", "spec"), "gpusPerInstance", "spec.decode"),
        min_gpus=integer(spec, "minGPUs", "spec"),
        max_gpus=optional_integer(spec, "maxGPUs", "spec"),
        slo=_numbers(mapping(spec, "slo", "spec"), SLO_FIELDS, "spec.slo"),
        prefill_replicas=integer(status, "prefillReplicas", "status"),
        decode_replicas=integer(status, "decodeReplicas", "status"),
        observed=_numbers(mapping(status, "observed", "status"), OBSERVED_FIELDS, "status.observed"),
        predicted_goodput=number(status, "predictedGoodput", "status"),
        last_plan_time=parse_time(last_plan.get("time"), "status.lastPlan.time"),
        last_plan_reason=last_plan.get("reason"),
        pool=_pool(status),
        conditions=conditions(status),
        borrowed_from=keyed_gpus(status, "borrowedFrom", "job"),
        queue=queue_name(spec),
    )
