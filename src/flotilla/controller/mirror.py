"""Pure translation of Kubernetes objects into the controller's records, and of
record changes into audit-trail decisions.

`parse_*` take the object as the API server returns it (a dict, camelCase) and
return a frozen record; a malformed object raises ValueError naming the field.
`*_changes(old, new, now)` compare two records of the same object and return the
decisions the change amounts to (allocation change, reshard, cordon, plan ...).
The watch loop in `flotilla.controller.kube` is the only caller outside tests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping

from flotilla.allocation.snapshot import NodeState

GROUP = "flotilla.dev"
VERSION = "v1alpha1"
CHECKPOINT_REQUEST = "flotilla.dev/checkpoint-request"
REPLAN_REQUEST = "flotilla.dev/replan-request"
UNHEALTHY_TAINT = "flotilla.dev/unhealthy"
HEALTH_CONDITION = "FlotillaGPUHealthy"
GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class DecisionRecord:
    """One entry of the audit trail."""

    kind: str  # allocation, reshard, phase, cordon, uncordon, health, plan, checkpoint-request, ...
    object_kind: str  # TrainingJob, ServingDeployment, Node
    object: str  # namespace/name, or the node name
    reason: str
    inputs: Mapping[str, Any] = field(default_factory=dict)
    actor: str = "observed"  # who acted: "observed" (seen in the cluster), a token name, "controller"
    time: float = 0.0


@dataclass(frozen=True)
class JobRecord:
    key: str
    namespace: str
    name: str
    uid: str  # a new object of the same name is another job: nothing of the old row carries over
    phase: str
    priority: int
    best_effort: bool
    created: float | None
    deadline: float | None
    total_steps: int
    steps: int
    steps_per_second: float
    min_gpus: int
    max_gpus: int
    gpus: int
    placement: Mapping[str, int]
    estimated_completion: float | None
    deadline_met: bool | None
    reshards: int
    checkpoint_generation: int
    checkpoint_request: Mapping[str, Any] | None
    last_condition: str  # "Reason: message" of the newest condition, for decision reasons
    lent_to: Mapping[str, int] = field(default_factory=dict)  # ServingDeployment -> GPUs lent through the pool


@dataclass(frozen=True)
class ServingRecord:
    key: str
    namespace: str
    name: str
    planner_mode: str
    prefill_replicas: int
    decode_replicas: int
    prefill_gpus_per_instance: int
    decode_gpus_per_instance: int
    slo: Mapping[str, float]
    observed: Mapping[str, float]
    predicted_goodput: float | None
    last_plan_time: float | None
    last_plan_reason: str | None
    replan_request: Mapping[str, Any] | None
    borrowed_from: Mapping[str, int] = field(default_factory=dict)  # TrainingJob -> GPUs borrowed through the pool
    granted_gpus: int | None = None  # what the unified pool grants (status.pool.grantedGPUs); None without a pool


@dataclass(frozen=True)
class NodeRecord:
    name: str
    domain: str
    total_gpus: int
    labels: Mapping[str, str]
    ready: bool
    unschedulable: bool
    healthy: bool
    health_reason: str | None
    health_message: str | None
    taint: Mapping[str, str] | None


def parse_time(value: Any, where: str) -> float | None:
    """RFC 3339 -> Unix seconds; None stays None."""
    if value is None:
        return None
    if isinstance(value, datetime):  # the kubernetes client deserialises some times
        return value.timestamp()
    if not isinstance(value, str):
        raise ValueError(f"{where} must be an RFC 3339 time, got {value!r}")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{where} must be an RFC 3339 time, got {value!r}") from None
    if parsed.tzinfo is None:
        raise ValueError(f"{where} must carry a time zone (e.g. 'Z'), got {value!r}")
    return parsed.timestamp()


def _dict(obj: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}.{key} must be an object")
    return value


def _int(obj: Mapping[str, Any], key: str, where: str, default: int = 0) -> int:
    value = obj.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}.{key} must be an integer, got {value!r}")
    return value


def _num(obj: Mapping[str, Any], key: str, where: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}.{key} must be a number, got {value!r}")
    return float(value)


def _metadata(obj: Mapping[str, Any], namespaced: bool) -> tuple[str, str, Mapping[str, Any]]:
    meta = _dict(obj, "metadata", "")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("metadata.name must be a non-empty string")
    namespace = meta.get("namespace") or ("default" if namespaced else "")
    if not isinstance(namespace, str):
        raise ValueError("metadata.namespace must be a string")
    return namespace, name, meta


def _annotation_json(meta: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    raw = _dict(meta, "annotations", "metadata").get(key)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        raise ValueError(f"metadata.annotations[{key!r}] must be a JSON object") from None
    generation = value.get("generation") if isinstance(value, dict) else None
    if not isinstance(value, dict) or isinstance(generation, bool) or not isinstance(generation, int):
        raise ValueError(f"metadata.annotations[{key!r}] must be a JSON object with an integer 'generation'")
    return value


def _last_condition(status: Mapping[str, Any]) -> str:
    conditions = status.get("conditions") or []
    if not isinstance(conditions, list) or not conditions:
        return ""
    newest = max((c for c in conditions if isinstance(c, Mapping)),
                 key=lambda c: str(c.get("lastTransitionTime") or ""), default=None)
    if newest is None:
        return ""
    return f"{newest.get('reason') or newest.get('type', '')}: {newest.get('message') or ''}".strip(": ")


def _loans(status: Mapping[str, Any], key: str, other: str) -> dict[str, int]:
    """status.lentTo / status.borrowedFrom ([{other: "ns/name", gpus}]) -> {ns/name: GPUs}."""
    raw = status.get(key) or []
    if not isinstance(raw, list):
        raise ValueError(f"status.{key} must be a list")
    out: dict[str, int] = {}
    for i, entry in enumerate(raw):
        if not isinstance(entry, Mapping) or not isinstance(entry.get(other), str):
            raise ValueError(f"status.{key}[{i}].{other} must be a string")
        out[entry[other]] = out.get(entry[other], 0) + _int(entry, "gpus", f"status.{key}[{i}]")
    return out


def parse_training_job(obj: Mapping[str, Any]) -> JobRecord:
    namespace, name, meta = _metadata(obj, namespaced=True)
    spec, status = _dict(obj, "spec", ""), _dict(obj, "status", "")
    created = parse_time(meta.get("creationTimestamp"), "metadata.creationTimestamp")
    deadline = parse_time(spec.get("deadline"), "spec.deadline")
    if deadline is None and spec.get("deadlineSeconds") is not None:
        if created is None:
            raise ValueError("spec.deadlineSeconds needs metadata.creationTimestamp")
        deadline = created + _int(spec, "deadlineSeconds", "spec")
    elasticity = _dict(spec, "elasticity", "spec")
    progress = _dict(status, "progress", "status")
    placement: dict[str, int] = {}
    raw_placement = status.get("placement") or []
    if not isinstance(raw_placement, list):
        raise ValueError("status.placement must be a list")
    for i, entry in enumerate(raw_placement):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("node"), str):
            raise ValueError(f"status.placement[{i}].node must be a string")
        placement[entry["node"]] = placement.get(entry["node"], 0) + _int(entry, "gpus", f"status.placement[{i}]")
    deadline_met = status.get("deadlineMet")
    if deadline_met is not None and not isinstance(deadline_met, bool):
        raise ValueError("status.deadlineMet must be a boolean")
    best_effort = spec.get("bestEffort", False)
    if not isinstance(best_effort, bool):
        raise ValueError("spec.bestEffort must be a boolean")
    return JobRecord(
        key=f"{namespace}/{name}", namespace=namespace, name=name, uid=str(meta.get("uid") or ""),
        phase=str(status.get("phase") or "Pending"),
        priority=_int(spec, "priority", "spec"),
        best_effort=best_effort,
        created=created,
        deadline=deadline,
        total_steps=_int(spec, "totalSteps", "spec"),
        steps=_int(progress, "steps", "status.progress"),
        steps_per_second=_num(progress, "stepsPerSecond", "status.progress") or 0.0,
        min_gpus=_int(elasticity, "minGPUs", "spec.elasticity"),
        max_gpus=_int(elasticity, "maxGPUs", "spec.elasticity"),
        gpus=_int(status, "gpus", "status", default=sum(placement.values())),
        placement=placement,
        estimated_completion=parse_time(status.get("estimatedCompletion"), "status.estimatedCompletion"),
        deadline_met=deadline_met,
        reshards=_int(status, "reshards", "status"),
        checkpoint_generation=_int(_dict(status, "checkpoint", "status"), "generation", "status.checkpoint"),
        checkpoint_request=_annotation_json(meta, CHECKPOINT_REQUEST),
        last_condition=_last_condition(status),
        lent_to=_loans(status, "lentTo", "serving"),
    )


def parse_serving_deployment(obj: Mapping[str, Any]) -> ServingRecord:
    namespace, name, meta = _metadata(obj, namespaced=True)
    spec, status = _dict(obj, "spec", ""), _dict(obj, "status", "")
    slo = _dict(spec, "slo", "spec")
    observed = _dict(status, "observed", "status")
    last_plan = _dict(status, "lastPlan", "status")
    slo_values = {k: v for k in ("ttftMs", "tpotMs", "attainment") if (v := _num(slo, k, "spec.slo")) is not None}
    observed_values = {k: v for k in ("requestsPerSecond", "ttftP90Ms", "tpotP90Ms", "attainment")
                       if (v := _num(observed, k, "status.observed")) is not None}
    return ServingRecord(
        key=f"{namespace}/{name}", namespace=namespace, name=name,
        planner_mode=str(_dict(spec, "planner", "spec").get("mode") or "auto"),
        prefill_replicas=_int(status, "prefillReplicas", "status"),
        decode_replicas=_int(status, "decodeReplicas", "status"),
        prefill_gpus_per_instance=_int(_dict(spec, "prefill", "spec"), "gpusPerInstance", "spec.prefill", 1),
        decode_gpus_per_instance=_int(_dict(spec, "decode", "spec"), "gpusPerInstance", "spec.decode", 1),
        slo=slo_values,
        observed=observed_values,
        predicted_goodput=_num(status, "predictedGoodput", "status"),
        last_plan_time=parse_time(last_plan.get("time"), "status.lastPlan.time"),
        last_plan_reason=last_plan.get("reason"),
        replan_request=_annotation_json(meta, REPLAN_REQUEST),
        borrowed_from=_loans(status, "borrowedFrom", "job"),
        granted_gpus=(_int(pool, "grantedGPUs", "status.pool") if (pool := _dict(status, "pool", "status")) else None),
    )


def parse_node(obj: Mapping[str, Any]) -> NodeRecord:
    _, name, meta = _metadata(obj, namespaced=False)
    spec, status = _dict(obj, "spec", ""), _dict(obj, "status", "")
    labels = {str(k): str(v) for k, v in _dict(meta, "labels", "metadata").items()}
    capacity = _dict(status, "capacity", "status")
    raw_gpus = capacity.get(GPU_RESOURCE, 0)
    try:
        total_gpus = int(raw_gpus)
    except (TypeError, ValueError):
        raise ValueError(f"status.capacity[{GPU_RESOURCE!r}] must be a whole number, got {raw_gpus!r}") from None
    conditions = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, Mapping)}
    health = conditions.get(HEALTH_CONDITION, {})
    healthy = health.get("status") != "False"
    taint = next((t for t in spec.get("taints") or [] if isinstance(t, Mapping) and t.get("key") == UNHEALTHY_TAINT),
                 None)
    return NodeRecord(
        name=name,
        domain=NodeState(name, total_gpus, labels=labels).domain,
        total_gpus=total_gpus,
        labels=labels,
        ready=conditions.get("Ready", {}).get("status") == "True",
        unschedulable=bool(spec.get("unschedulable", False)),
        healthy=healthy,
        health_reason=None if healthy else health.get("reason"),
        health_message=None if healthy else health.get("message"),
        taint={"value": str(taint.get("value") or ""), "effect": str(taint.get("effect") or "")} if taint else None,
    )


def job_changes(old: JobRecord | None, new: JobRecord, now: float) -> list[DecisionRecord]:
    if old is None:
        return []
    out: list[DecisionRecord] = []
    why = new.last_condition or "observed in TrainingJob status"
    if dict(old.placement) != dict(new.placement):
        out.append(DecisionRecord("allocation", "TrainingJob", new.key, why, {
            "from": dict(old.placement), "to": dict(new.placement), "gpusFrom": old.gpus, "gpusTo": new.gpus,
            "phase": new.phase}, time=now))
    if new.reshards > old.reshards:
        out.append(DecisionRecord("reshard", "TrainingJob", new.key, why, {
            "reshards": new.reshards, "step": new.steps, "checkpointGeneration": new.checkpoint_generation,
            "gpus": new.gpus}, time=now))
    if old.phase != new.phase:
        out.append(DecisionRecord("phase", "TrainingJob", new.key, why, {"from": old.phase, "to": new.phase},
                                  time=now))
    return out


def serving_changes(old: ServingRecord | None, new: ServingRecord, now: float) -> list[DecisionRecord]:
    if old is None:
        return []
    out: list[DecisionRecord] = []
    if (old.prefill_replicas, old.decode_replicas) != (new.prefill_replicas, new.decode_replicas):
        out.append(DecisionRecord("plan", "ServingDeployment", new.key, new.last_plan_reason or "observed plan change", {
            "from": {"prefill": old.prefill_replicas, "decode": old.decode_replicas},
            "to": {"prefill": new.prefill_replicas, "decode": new.decode_replicas},
            "observed": dict(new.observed), "predictedGoodput": new.predicted_goodput}, time=now))
    if dict(old.borrowed_from) != dict(new.borrowed_from):
        lent = sum(new.borrowed_from.values()) - sum(old.borrowed_from.values())
        out.append(DecisionRecord("loan", "ServingDeployment", new.key,
                                  f"{'borrowed' if lent > 0 else 'gave back'} {abs(lent)} GPUs of training jobs' "
                                  "surplus through the pool" if lent else "loans moved between training jobs",
                                  {"from": dict(old.borrowed_from), "to": dict(new.borrowed_from),
                                   "grantedGPUs": new.granted_gpus}, time=now))
    return out


def node_changes(old: NodeRecord | None, new: NodeRecord, now: float) -> list[DecisionRecord]:
    if old is None:
        return []
    out: list[DecisionRecord] = []
    if old.unschedulable != new.unschedulable:
        kind = "cordon" if new.unschedulable else "uncordon"
        out.append(DecisionRecord(kind, "Node", new.name, new.health_message or f"node {kind}ed",
                                  {"taint": dict(new.taint) if new.taint else None}, time=now))
    if old.healthy != new.healthy:
        out.append(DecisionRecord("health", "Node", new.name,
                                  f"{HEALTH_CONDITION}={'True' if new.healthy else 'False'}"
                                  + (f" ({new.health_reason}: {new.health_message})" if not new.healthy else ""),
                                  {"healthy": new.healthy, "reason": new.health_reason,
                                   "message": new.health_message}, time=now))
    return out
