"""One reconcile pass over everything the operator watches. Pure: views in, actions out."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import Any, Mapping

from flotilla.allocation import Allocator, ClusterSnapshot
from flotilla.operator import serving, training
from flotilla.operator.actions import Action
from flotilla.resources import names

Body = Mapping[str, Any]


def _pod_gpus(pod: Body) -> int:
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        total += int(str(((c.get("resources") or {}).get("limits") or {}).get(names.GPU_RESOURCE, "0")))
    return total


def _holds_gpus(pod: Body) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return bool((pod.get("spec") or {}).get("nodeName")) and phase not in ("Succeeded", "Failed")


def training_snapshot(now: float, jobs: Mapping[str, Body], nodes: Mapping[str, Body],
                      pods: Mapping[str, Body]) -> ClusterSnapshot:
    """The allocator's view: GPUs held by Flotilla pods that are not training workers
    (serving instances) are not the training allocator's to give."""
    snap = training.snapshot(now, jobs.values(), nodes.values())
    foreign: dict[str, int] = defaultdict(int)
    for pod in pods.values():
        if pod["metadata"].get("labels", {}).get(names.LABEL_ROLE) != names.ROLE_WORKER and _holds_gpus(pod):
            foreign[pod["spec"]["nodeName"]] += _pod_gpus(pod)
    if not foreign:
        return snap
    return replace(snap, nodes=tuple(replace(n, foreign_gpus=n.foreign_gpus + foreign.get(n.name, 0))
                                     for n in snap.nodes))


def reconcile(now: float, allocator: Allocator, jobs: Mapping[str, Body], nodes: Mapping[str, Body],
              pods: Mapping[str, Body], servings: Mapping[str, Body],
              deployments: Mapping[str, Body], max_restarts: int = 3) -> list[Action]:
    decision = allocator.decide(training_snapshot(now, jobs, nodes, pods))
    pods_of: dict[str, list[Body]] = defaultdict(list)
    for pod in pods.values():
        labels = pod["metadata"].get("labels") or {}
        if labels.get(names.LABEL_ROLE) == names.ROLE_WORKER and names.LABEL_JOB in labels:
            pods_of[f"{pod['metadata']['namespace']}/{labels[names.LABEL_JOB]}"].append(pod)
    actions: list[Action] = []
    for key, body in jobs.items():
        actions.extend(training.plan_job(body, pods_of.get(key, []), decision.for_job(key), now, allocator.name,
                                         max_restarts=max_restarts))
    for key, body in servings.items():
        ns = body["metadata"]["namespace"]
        deps = {role: deployments[d] for role in serving.ROLES
                if (d := f"{ns}/{serving.deployment_name(body['metadata']['name'], role)}") in deployments}
        actions.extend(serving.plan_serving(body, deps, now))
    return actions
