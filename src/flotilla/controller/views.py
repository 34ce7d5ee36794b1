"""JSON shapes of the API's answers, built from database rows."""

from __future__ import annotations

from typing import Any

from flotilla.controller.db import (
    DecisionRow,
    NodeRow,
    QueueRow,
    QueueUsageRow,
    SampleRow,
    ServingDeploymentRow,
    TrainingJobRow,
)
from flotilla.controller.queues import USAGE_FIELDS, Loan
from flotilla.controller.store import OUTLOOKS, Page
from flotilla.resources.parse import iso


def page(p: Page, view: Any) -> dict[str, Any]:
    return {"items": [view(item) for item in p.items], "nextCursor": p.next_cursor}


def job(row_outlook: tuple[TrainingJobRow, str]) -> dict[str, Any]:
    row, outlook = row_outlook
    return {
        "key": row.key, "namespace": row.namespace, "name": row.name, "phase": row.phase,
        "priority": row.priority, "bestEffort": row.best_effort, "created": iso(row.created),
        "deadline": iso(row.deadline), "outlook": outlook, "deadlineMet": row.deadline_met,
        "estimatedCompletion": iso(row.estimated_completion),
        "progress": {"steps": row.steps, "totalSteps": row.total_steps, "stepsPerSecond": row.steps_per_second},
        "elasticity": {"minGPUs": row.min_gpus, "maxGPUs": row.max_gpus},
        "gpus": row.gpus, "placement": [{"node": n, "gpus": g} for n, g in sorted(row.placement.items())],
        "reshards": row.reshards, "checkpointGeneration": row.checkpoint_generation,
        "checkpointRequest": row.checkpoint_request,
        "lentTo": [{"serving": k, "gpus": g} for k, g in sorted((row.lent_to or {}).items())],
        "queue": row.queue or None,
        "updated": iso(row.updated),
    }


def serving(row: ServingDeploymentRow) -> dict[str, Any]:
    return {
        "key": row.key, "namespace": row.namespace, "name": row.name,
        "plan": {"mode": row.planner_mode, "prefillReplicas": row.prefill_replicas,
                 "decodeReplicas": row.decode_replicas, "prefillGpusPerInstance": row.prefill_gpus_per_instance,
                 "decodeGpusPerInstance": row.decode_gpus_per_instance,
                 "gpus": row.prefill_replicas * row.prefill_gpus_per_instance
                 + row.decode_replicas * row.decode_gpus_per_instance,
                 "predictedGoodput": row.predicted_goodput, "time": iso(row.last_plan_time),
                 "reason": row.last_plan_reason},
        "slo": row.slo, "observed": row.observed, "replanRequest": row.replan_request,
        "pool": None if row.granted_gpus is None else {"grantedGPUs": row.granted_gpus},
        "borrowedFrom": [{"job": k, "gpus": g} for k, g in sorted((row.borrowed_from or {}).items())],
        "queue": row.queue or None,
        "updated": iso(row.updated),
    }


def node(row_allocated: tuple[NodeRow, int]) -> dict[str, Any]:
    row, allocated = row_allocated
    out = gpus_out(row.gpus_out)
    usable = max(0, row.total_gpus - len(out)) if row.healthy and not row.unschedulable else 0
    return {
        "name": row.name, "domain": row.domain, "ready": row.ready, "unschedulable": row.unschedulable,
        "healthy": row.healthy,
        "health": None if row.healthy else {"reason": row.health_reason, "message": row.health_message},
        "taint": row.taint, "labels": row.labels,
        "gpus": {"total": row.total_gpus, "allocated": allocated, "free": max(0, usable - allocated),
                 "inService": max(0, row.total_gpus - len(out)), "outOfService": out},
        "updated": iso(row.updated),
    }


def gpus_out(raw: dict[str, str] | None) -> list[dict[str, Any]]:
    """The node's GPUs out of service on their own, by index: [{"gpu", "reason"}]."""
    return [{"gpu": int(g), "reason": why} for g, why in sorted((raw or {}).items(), key=lambda kv: int(kv[0]))]


def domain(row: tuple[str, int, int, int, int]) -> dict[str, Any]:
    name, nodes, total, schedulable, allocated = row
    return {"domain": name, "nodes": nodes, "gpus": {"total": int(total), "schedulable": int(schedulable),
                                                     "allocated": int(allocated),
                                                     "free": max(0, int(schedulable) - int(allocated))}}


def decision(row: DecisionRow) -> dict[str, Any]:
    return {"id": row.id, "time": iso(row.time), "kind": row.kind, "objectKind": row.object_kind,
            "object": row.object, "actor": row.actor, "reason": row.reason, "inputs": row.inputs}


def sample(row: SampleRow) -> dict[str, Any]:
    return {"ts": row.ts, "time": iso(row.ts), "metric": row.metric, "value": row.value, "gpu": row.gpu,
            "job": row.job, "role": row.role, "rank": row.rank}


def node_state(ready: bool, unschedulable: bool, healthy: bool) -> str:
    """One word for the GPU map: unhealthy wins over not-ready, which wins over cordoned."""
    if not healthy:
        return "unhealthy"
    if not ready:
        return "notready"
    return "cordoned" if unschedulable else "ok"


def gpu_map(nodes: list[tuple[Any, ...]], allocations: list[tuple[str, str, int]],
            serving: dict[str, dict[str, int]]) -> dict[str, Any]:
    """The console's GPU map in one compact answer: holders are listed once and nodes point at them by index,
    so 1,000 nodes stay in about 100 kB. `serving` is node -> {ServingDeployment: GPUs} from its pods."""
    training: dict[str, int] = {}
    servings: dict[str, int] = {}
    held: dict[str, list[list[Any]]] = {}
    for node, job, gpus in allocations:
        held.setdefault(node, []).append(["t", training.setdefault(job, len(training)), gpus])
    for node, by_serving in sorted(serving.items()):
        for key, gpus in sorted(by_serving.items()):
            held.setdefault(node, []).append(["s", servings.setdefault(key, len(servings)), gpus])
    out = []
    for name, domain, rack, total, ready, unschedulable, healthy, taint, out_of_service in nodes:
        out.append({"name": name, "domain": domain, "rack": rack or domain,
                    "gpus": total, "state": node_state(ready, unschedulable, healthy), "tainted": taint is not None,
                    "holders": held.get(name, []), "gpusOut": gpus_out(out_of_service)})
    return {"training": list(training), "serving": list(servings), "nodes": out}


def reservation(row: tuple[str, str, int, int, float]) -> dict[str, Any]:
    key, phase, min_gpus, gpus, deadline = row
    return {"key": key, "phase": phase, "guaranteedGPUs": min_gpus, "gpus": gpus, "deadline": iso(deadline)}


def queue(row: QueueRow, outlook: dict[str, int] | None = None) -> dict[str, Any]:
    """A Queue as its object says (spec, status), with its training jobs' deadline outlook."""
    return {"name": row.name, "spec": row.spec, "status": row.status,
            "outlook": outlook or {o: 0 for o in OUTLOOKS}, "updated": iso(row.updated)}


def queue_loans(name: str, found: list[Loan]) -> dict[str, Any]:
    return {"lentTo": [{"queue": x.borrower, "gpus": x.gpus} for x in found if x.lender == name],
            "borrowedFrom": [{"queue": x.lender, "gpus": x.gpus} for x in found if x.borrower == name]}


def queue_usage(row: QueueUsageRow) -> dict[str, Any]:
    return {"time": iso(row.time), **{f: getattr(row, f) for f in USAGE_FIELDS}}
