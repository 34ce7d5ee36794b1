"""Pure translation of Kubernetes objects into the controller's records, and of
record changes into audit-trail decisions.

`parse_*` take the object as the API server returns it (a dict, camelCase) and
return a frozen record; a malformed object raises ValueError naming the field.
`*_changes(old, new, now)` compare two records of the same object and return the
decisions the change amounts to (allocation change, reshard, cordon, plan ...).
The watch loop in `flotilla.controller.kube` is the only caller outside tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from flotilla.allocation.snapshot import NodeState
from flotilla.controller.reclaims import ReclaimSign, reclaim_sign
from flotilla.reshard import encoding
from flotilla.resources import names, parse, serving_deployment, training_job
from flotilla.resources import node as k8s_node
from flotilla.resources.parse import parse_time

__all__ = ["DecisionRecord", "JobRecord", "NodeRecord", "ServingRecord", "job_changes", "node_changes",
           "parse_node", "parse_serving_deployment", "parse_time", "parse_training_job", "serving_changes"]


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
    queue: str = ""  # status.queue, the team's Queue the operator resolved ("" before it did, or with no Queues)
    reclaim: ReclaimSign | None = None  # a reclaim the operator asked of the job (not stored: read each time)


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
    queue: str = ""  # status.queue
    reclaim: ReclaimSign | None = None


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
    gpus_out: Mapping[str, str] | None = None  # GPU index -> why, for GPUs out of service on their own


def parse_training_job(obj: Mapping[str, Any]) -> JobRecord:
    job = training_job.parse(obj)
    meta = parse.mapping(obj, "metadata", "")
    return JobRecord(
        key=job.key, namespace=job.namespace, name=job.name, uid=job.uid,
        phase=job.phase or "Pending",
        priority=job.priority,
        best_effort=job.best_effort,
        created=job.created,
        deadline=job.deadline,
        total_steps=job.total_steps,
        steps=job.steps,
        steps_per_second=job.steps_per_second,
        min_gpus=job.min_gpus,
        max_gpus=job.max_gpus,
        gpus=job.gpus,
        placement=job.placement,
        estimated_completion=job.estimated_completion,
        deadline_met=job.deadline_met,
        reshards=job.reshards,
        checkpoint_generation=job.checkpoint_generation,
        checkpoint_request=encoding.strict_request(meta.get("annotations")),
        last_condition=parse.last_condition(job.conditions),
        lent_to=job.lent_to,
        queue=status_queue(obj),
        reclaim=reclaim_sign(obj),
    )


def parse_serving_deployment(obj: Mapping[str, Any]) -> ServingRecord:
    sd = serving_deployment.parse(obj)
    meta = parse.mapping(obj, "metadata", "")
    return ServingRecord(
        key=sd.key, namespace=sd.namespace, name=sd.name,
        planner_mode=sd.planner_mode,
        prefill_replicas=sd.prefill_replicas,
        decode_replicas=sd.decode_replicas,
        prefill_gpus_per_instance=_or_one(sd.prefill_gpus_per_instance),
        decode_gpus_per_instance=_or_one(sd.decode_gpus_per_instance),
        slo=sd.slo,
        observed=sd.observed,
        predicted_goodput=sd.predicted_goodput,
        last_plan_time=sd.last_plan_time,
        last_plan_reason=sd.last_plan_reason,
        replan_request=parse.annotation_request(meta, names.ANNOTATION_REPLAN_REQUEST),
        borrowed_from=sd.borrowed_from,
        granted_gpus=sd.pool.granted_gpus if sd.pool is not None else None,
        queue=status_queue(obj),
        reclaim=reclaim_sign(obj),
    )


def status_queue(obj: Mapping[str, Any]) -> str:
    """The queue the operator resolved for a job (status.queue); "" when it has not (yet)."""
    value = parse.mapping(obj, "status", "").get("queue")
    if value is not None and not isinstance(value, str):
        raise ValueError("status.queue must be a string")
    return value or ""


def _or_one(gpus_per_instance: int | None) -> int:
    return 1 if gpus_per_instance is None else gpus_per_instance


def parse_node(obj: Mapping[str, Any]) -> NodeRecord:
    node = k8s_node.parse(obj)
    health = node.healthy_condition
    taint = node.unhealthy_taint
    return NodeRecord(
        name=node.name,
        domain=NodeState(node.name, node.capacity_gpus, labels=node.labels).domain,
        total_gpus=node.capacity_gpus,
        labels=node.labels,
        ready=node.ready,
        unschedulable=node.unschedulable,
        healthy=node.healthy,
        health_reason=None if node.healthy else health.get("reason"),
        health_message=None if node.healthy else health.get("message"),
        taint={"value": str(taint.get("value") or ""), "effect": str(taint.get("effect") or "")} if taint else None,
        gpus_out={str(g): why for g, why in sorted(node.gpus_out.items())} or None,
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
                                  f"{names.NODE_CONDITION_HEALTHY}={'True' if new.healthy else 'False'}"
                                  + (f" ({new.health_reason}: {new.health_message})" if not new.healthy else ""),
                                  {"healthy": new.healthy, "reason": new.health_reason,
                                   "message": new.health_message}, time=now))
    return out
