"""One reconcile pass over everything the operator watches. Pure: views in, actions out."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import Any, Mapping

from flotilla.allocation import Allocator, ClusterSnapshot
from flotilla.operator import serving, training
from flotilla.operator.actions import Action
from flotilla.operator.pods import holds_gpus, pod_gpus, worker_job_uid
from flotilla.operator.pool import arbitrate
from flotilla.pool import PoolPolicy
from flotilla.resources import names

Body = Mapping[str, Any]


def training_snapshot(now: float, jobs: Mapping[str, Body], nodes: Mapping[str, Body],
                      pods: Mapping[str, Body]) -> ClusterSnapshot:
    """The allocator's view: GPUs held by Flotilla pods that no live job accounts for (serving
    instances, workers of a job that is gone or finished, still terminating, orphans of a deleted job
    whose name a new one took, a live job's old worker set terminating where it no longer runs) are not
    its to give."""
    snap = training.snapshot(now, jobs.values(), nodes.values(), pods.values())
    live = training.live_by_uid(jobs.values())
    foreign: dict[str, int] = defaultdict(int, training.held_beyond_placement(jobs.values(), pods.values()))
    for pod in pods.values():
        if holds_gpus(pod) and worker_job_uid(pod) not in live:
            foreign[pod["spec"]["nodeName"]] += pod_gpus(pod)
    if not foreign:
        return snap
    return replace(snap, nodes=tuple(replace(n, foreign_gpus=n.foreign_gpus + foreign.get(n.name, 0))
                                     for n in snap.nodes))


def reconcile(now: float, allocator: Allocator, jobs: Mapping[str, Body], nodes: Mapping[str, Body],
              pods: Mapping[str, Body], servings: Mapping[str, Body],
              deployments: Mapping[str, Body], max_restarts: int = 3,
              pool: PoolPolicy | None = None, agent_port: int = names.DEFAULT_AGENT_PORT) -> list[Action]:
    """Every object's actions, one object after the other (see `plan`)."""
    return [a for _, _, actions in plan(now, allocator, jobs, nodes, pods, servings, deployments, max_restarts, pool,
                                        agent_port=agent_port) for a in actions]


def plan(now: float, allocator: Allocator, jobs: Mapping[str, Body], nodes: Mapping[str, Body],
         pods: Mapping[str, Body], servings: Mapping[str, Body],
         deployments: Mapping[str, Body], max_restarts: int = 3,
         pool: PoolPolicy | None = None, inference_pools: bool = False,
         agent_port: int = names.DEFAULT_AGENT_PORT) -> list[tuple[str, str, list[Action]]]:
    """(view kind, key, actions) for every TrainingJob ("jobs") and ServingDeployment ("servings"): an
    object's status and annotation patches come first, then its pods, Deployments and Events.

    With a `pool` policy and ServingDeployments present, the unified-pool arbiter decides for both
    (serving may borrow training's GPUs); otherwise the allocator decides for training alone and
    serving's pods are GPUs it may not use. `inference_pools`: the InferencePool CRD is installed."""
    if pool is not None and servings:
        shared = arbitrate(now, pool, jobs, nodes, pods, servings)
        job_decisions, lending, grants = shared.jobs, shared.lending, shared.serving
    else:
        job_decisions = allocator.decide(training_snapshot(now, jobs, nodes, pods)).jobs
        lending, grants = {}, {}
    pods_of: dict[str, list[Body]] = defaultdict(list)  # job UID -> the worker pods it controls
    for pod in pods.values():
        if (uid := worker_job_uid(pod)) is not None:
            pods_of[uid].append(pod)
    out: list[tuple[str, str, list[Action]]] = []
    for key, body in jobs.items():
        mine = pods_of.get(body["metadata"].get("uid"), [])
        out.append(("jobs", key, training.plan_job(body, mine, job_decisions.get(key), now,
                                                   allocator.name, max_restarts=max_restarts,
                                                   lending=lending.get(key), agent_port=agent_port)))
    for key, body in servings.items():
        ns = body["metadata"]["namespace"]
        deps = {role: deployments[d] for role in serving.ROLES
                if (d := f"{ns}/{serving.deployment_name(body['metadata']['name'], role)}") in deployments}
        out.append(("servings", key, serving.plan_serving(body, deps, now, grants.get(key), inference_pools)))
    return out
