"""One reconcile pass over everything the operator watches. Pure: views in, actions out."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Collection, Mapping

from flotilla.allocation import Allocator, ClusterSnapshot, JobDecision, JobState, NodeState
from flotilla.operator import devices, queues, serving, training
from flotilla.operator.actions import Action, Done
from flotilla.operator.pods import holds_gpus, pod_gpus, serving_key, worker_job_uid
from flotilla.operator.pool import arbitrate, targets_of
from flotilla.pool import PoolPolicy, with_foreign_gpus
from flotilla.resources import names
from flotilla.serving.target import Target

Body = Mapping[str, Any]


def training_snapshot(now: float, jobs: Mapping[str, Body], nodes: Mapping[str, Body],
                      pods: Mapping[str, Body], states: Mapping[str, JobState] | None = None,
                      base: ClusterSnapshot | None = None) -> ClusterSnapshot:
    """The allocator's view: GPUs held by Flotilla pods that no live job accounts for (serving
    instances, workers of a job that is gone or finished, still terminating, orphans of a deleted job
    whose name a new one took, a live job's old worker set terminating where it no longer runs) are not
    its to give. `states`: job key -> its `training.job_state`, when already made; `base`: `training.snapshot` of
    the same objects, when already made."""
    snap = base or training.snapshot(now, jobs.values(), nodes.values(), pods.values(), states=states)
    live = training.live_by_uid(jobs.values())
    placement = training.placement_reader(states)
    foreign: dict[str, int] = defaultdict(int, training.held_beyond_placement(jobs.values(), pods.values(), placement))
    for pod in pods.values():
        if holds_gpus(pod) and worker_job_uid(pod) not in live:
            foreign[pod["spec"]["nodeName"]] += pod_gpus(pod)
    if not foreign:
        return snap
    return replace(snap, nodes=with_foreign_gpus(snap.nodes, foreign))


def reconcile(now: float, allocator: Allocator, jobs: Mapping[str, Body], nodes: Mapping[str, Body],
              pods: Mapping[str, Body], servings: Mapping[str, Body],
              deployments: Mapping[str, Body], max_restarts: int = 3,
              pool: PoolPolicy | None = None, agent_port: int = names.DEFAULT_AGENT_PORT,
              queue_bodies: Mapping[str, Body] | None = None) -> list[Action]:
    """Every object's actions, one object after the other (see `plan`)."""
    return [a for _, _, actions in plan(now, allocator, jobs, nodes, pods, servings, deployments, max_restarts, pool,
                                        agent_port=agent_port, queue_bodies=queue_bodies) for a in actions]


def plan(now: float, allocator: Allocator, jobs: Mapping[str, Body], nodes: Mapping[str, Body],
         pods: Mapping[str, Body], servings: Mapping[str, Body],
         deployments: Mapping[str, Body], max_restarts: int = 3,
         pool: PoolPolicy | None = None, inference_pools: bool = False,
         agent_port: int = names.DEFAULT_AGENT_PORT,
         queue_bodies: Mapping[str, Body] | None = None) -> list[tuple[str, str, list[Action]]]:
    """A full re-plan: the first pass of a fresh `Planner`, which plans every live job and ServingDeployment.
    `queue_bodies`: the Queue objects; with any (or a job naming one), `flotilla.tenancy.decide` decides
    (flotilla.operator.queues)."""
    return Planner().plan(now, allocator, jobs, nodes, pods, servings, deployments, max_restarts, pool,
                          inference_pools, agent_port, queue_bodies=queue_bodies)


def _tenancy(queue_bodies: Mapping[str, Body] | None, jobs: Mapping[str, Body],
             servings: Mapping[str, Body]) -> queues.Tenancy | None:
    named = queues.names_a_queue(jobs.values()) or queues.names_a_queue(servings.values())
    return queues.read(queue_bodies or {}, named)


def _pods_by_job(pods: Mapping[str, Body]) -> dict[str, list[Body]]:
    """job UID -> the worker pods it controls."""
    out: dict[str, list[Body]] = defaultdict(list)
    for pod in pods.values():
        if (uid := worker_job_uid(pod)) is not None:
            out[uid].append(pod)
    return out


def _plan_servings(now: float, servings: Mapping[str, Body], deployments: Mapping[str, Body],
                   grants: Mapping[str, Any], inference_pools: bool, targets: Mapping[str, Target | ValueError]
                   ) -> list[tuple[str, str, list[Action]]]:
    out: list[tuple[str, str, list[Action]]] = []
    for key, body in servings.items():
        ns = body["metadata"]["namespace"]
        deps = {role: deployments[d] for role in serving.ROLES
                if (d := f"{ns}/{serving.deployment_name(body['metadata']['name'], role)}") in deployments}
        out.append(("servings", key, serving.plan_serving(body, deps, now, grants.get(key), inference_pools,
                                                          want=targets[key])))
    return out


@dataclass
class Planner:
    """The reconcile pass: it re-plans only what changed since its last pass (`plan`: a fresh one's first pass).

    A pass is *full* (the allocator run) on the first call, whenever something global changed (a node
    added, lost, cordoned, its capacity or labels; a job's spec: deadline, curve, elasticity, its
    generation; the InferencePool API), and those plan every job. For what only time changes (the
    allocator's view of deadlines), a pass is full `full_every` seconds after the end of the last full
    pass, or longer when full passes are slow: the gap is at least (1 - full_share) / full_share times
    what the last one took, so that time-driven full passes take at most `full_share` of the planner's
    time however many jobs there are. A time-driven pass runs the allocator but plans, as any other
    pass, only the jobs below: what time alone changes in a job's own plan is its timer. Otherwise a pass
    runs the allocator (or the pool's arbiter) only when what it reads changed (a job's state or loans,
    a GPU-holding pod, a ServingDeployment), else keeps its last decisions; and it plans only the jobs
    whose object, pods, decision or loans changed, that had actions the last time (they may not have
    been sent yet) or were busy (writes on their way: not planned until they are answered), or whose
    own timer is due (`training.replan_at`: the end of a job's quiet start, workers recorded Running, a
    checkpoint acknowledgement's timeout, a placed job's deadline outlook turning).
    ServingDeployments (a handful) are planned every pass, with their Deployments. Objects are
    told changed by identity: the view replaces an object that changed and keeps one that did not
    (flotilla.operator.view)."""

    full_every: float = 10.0
    full_share: float = 0.25
    clock: Callable[[], float] = time.perf_counter  # times full passes (`now` is the objects' time)
    full_passes: int = 0
    full_reason: str | None = None  # why the last pass was full: first/time, nodes, spec, inference-pools
    passes: int = 0
    allocator_runs: int = 0
    _next_full: float = float("-inf")  # when time alone makes a pass full
    _jobs: dict[str, Body] = field(default_factory=dict)
    _pods_of: dict[str, tuple[int, ...]] = field(default_factory=dict)  # job UID -> ids of its pods
    _nodes: dict[str, Body] = field(default_factory=dict)
    _inference_pools: bool | None = None
    # key -> (body, its job_state, its loans)
    _states: dict[str, tuple[Body, JobState, dict[str, int]]] = field(default_factory=dict)
    _pod_prints: dict[str, tuple[Body, tuple]] = field(default_factory=dict)
    _node_states: dict[str, tuple[Body, NodeState]] = field(default_factory=dict)
    _inputs: tuple | None = None  # what the allocator read last
    _decided: tuple[Mapping[str, JobDecision], Mapping[str, Any], Mapping[str, Any]] = ({}, {}, {})
    _last_decisions: Mapping[str, JobDecision] = field(default_factory=dict)
    _last_lending: Mapping[str, Any] = field(default_factory=dict)
    _acted: set[str] = field(default_factory=set)  # job keys with actions in the last pass
    _timers: dict[str, float] = field(default_factory=dict)  # job key -> when time alone changes its plan
    _queues: queues.Glue = field(default_factory=queues.Glue)
    _targets: dict[str, tuple[Body, Target | ValueError]] = field(default_factory=dict)  # key -> (spec, its Target)
    _gpu_claims: devices.Claims = field(default_factory=devices.Claims)

    def plan(self, now: float, allocator: Allocator, jobs: Mapping[str, Body], nodes: Mapping[str, Body],
             pods: Mapping[str, Body], servings: Mapping[str, Body], deployments: Mapping[str, Body],
             max_restarts: int = 3, pool: PoolPolicy | None = None, inference_pools: bool = False,
             agent_port: int = names.DEFAULT_AGENT_PORT,
             busy: Collection[str] = (), done: Done | None = None,
             queue_bodies: Mapping[str, Body] | None = None) -> list[tuple[str, str, list[Action]]]:
        """The actions of the objects that may have new ones (see the class). `busy`: jobs whose
        writes are still on their way; they are not planned now (what they would do next waits for those
        writes' answers) and are planned in the first pass after. `done`: what the operator's writes already
        did that the objects do not show yet, left out of the actions returned. `queue_bodies`: as for `plan`."""
        started = self.clock()
        # A finished job has nothing to plan and holds nothing: planning and the allocator see the live ones
        # (at scale most jobs are finished).
        jobs = {k: body for k, body in jobs.items() if not training.is_final(body)}
        self.full_reason = self._why_full(now, jobs, nodes, inference_pools)
        full = self.full_reason is not None
        # Time alone changes the allocator's decisions, and a job's plan only where its own timer says so.
        plan_all = full and self.full_reason != "time"
        self.passes += 1
        states, base = self._snapshot(now, jobs, nodes, pods)
        self._pod_prints = {k: self._pod_prints[k] if k in self._pod_prints and self._pod_prints[k][0] is p
                            else (p, _pod_print(p)) for k, p in pods.items()}
        # What the allocator reads: the snapshot's nodes and jobs, the jobs' loans, the pods (what they add to
        # the snapshot's foreign GPUs derives from them and the jobs), the ServingDeployments.
        tenancy = _tenancy(queue_bodies, jobs, servings)
        inputs = (base.nodes, base.jobs, tuple(self._states[s.key][2] for s in base.jobs),
                  {k: v[1] for k, v in self._pod_prints.items()}, tuple(servings), tuple(map(id, servings.values())),
                  (tenancy.specs, tuple(sorted(tenancy.broken.items()))) if tenancy is not None else None)
        targets = self._targets_of(servings)
        if full or inputs != self._inputs:
            self._decide(now, allocator, pool, jobs, nodes, pods, servings, base, states, targets, tenancy)
            self._inputs = inputs
        decisions, lending, grants = self._decided
        pods_of = _pods_by_job(pods)
        ids = {uid: tuple(map(id, mine)) for uid, mine in pods_of.items()}
        out, acted = self._plan_jobs(now, allocator.name, jobs, pods_of, ids, plan_all, busy, max_restarts,
                                     agent_port)
        out.extend(_plan_servings(now, servings, deployments, grants, inference_pools, targets))
        out = self._queues.finish(out, tenancy, jobs, servings, busy, now, training.PLURAL, serving.PLURAL)
        if done is not None:  # after `acted`: a job whose actions are all done is planned again next pass
            out = [(kind, key, done.outstanding(kind, actions)) for kind, key, actions in out]
        out = devices.assign(out, pods, nodes, self._gpu_claims, now)
        if full:
            self.full_passes += 1
            took = self.clock() - started
            self._next_full = now + took + max(self.full_every, took * (1 - self.full_share) / self.full_share)
        self._jobs, self._pods_of, self._nodes, self._acted = dict(jobs), ids, dict(nodes), acted
        self._inference_pools = inference_pools
        self._last_decisions, self._last_lending = decisions, lending
        return out

    @property
    def reclaims_announced(self) -> tuple[Any, ...]:
        """The reclaims (`flotilla.tenancy` Reclaim: job, from_queue, to_queue, gpus) the last pass announced."""
        return self._queues.fresh

    def _snapshot(self, now: float, jobs: Mapping[str, Body], nodes: Mapping[str, Body], pods: Mapping[str, Body]
                  ) -> tuple[dict[str, JobState], ClusterSnapshot]:
        """The jobs' states (made again only for the objects that changed) and the allocator's snapshot of them."""
        self._states = {k: self._states[k] for k in jobs if k in self._states and self._states[k][0] is jobs[k]}
        self._node_states = {k: self._node_states[k] if k in self._node_states and self._node_states[k][0] is n
                             else (n, training.node_state(n)) for k, n in nodes.items()}
        states = {key: self._state_of(body) for key, body in jobs.items()}
        return states, training.snapshot(now, jobs.values(), nodes.values(), pods.values(), states=states,
                                         node_states={n["metadata"]["name"]: state
                                                      for n, state in self._node_states.values()})

    def _decide(self, now: float, allocator: Allocator, pool: PoolPolicy | None, jobs: Mapping[str, Body],
                nodes: Mapping[str, Body], pods: Mapping[str, Body], servings: Mapping[str, Body],
                base: ClusterSnapshot, states: Mapping[str, JobState], targets: Mapping[str, Target | ValueError],
                tenancy: queues.Tenancy | None) -> None:
        """Run the allocator, or the unified pool's arbiter when there are ServingDeployments to share with or
        queues to decide between (flotilla.tenancy, through the arbiter)."""
        self.allocator_runs += 1
        if (pool is not None and servings) or tenancy is not None:
            shared = arbitrate(now, pool or PoolPolicy(), jobs, nodes, pods, servings if pool is not None else {},
                               job_states=states, base=base, tenancy=tenancy, targets=targets)
            self._decided = (shared.jobs, shared.lending, shared.serving)
            self._queues.decided(shared.tenant)
        else:
            self._queues.decided(None)
            self._decided = (allocator.decide(training_snapshot(now, jobs, nodes, pods, states=states,
                                                                base=base)).jobs, {}, {})

    def _plan_jobs(self, now: float, policy: str, jobs: Mapping[str, Body], pods_of: Mapping[str, list[Body]],
                   ids: Mapping[str, tuple[int, ...]], plan_all: bool, busy: Collection[str], max_restarts: int,
                   agent_port: int) -> tuple[list[tuple[str, str, list[Action]]], set[str]]:
        """The jobs' actions (those that may have new ones, or all), their timers kept; -> (plans, keys that acted)."""
        decisions, lending, _ = self._decided
        out: list[tuple[str, str, list[Action]]] = []
        acted = set()
        timers = {k: t for k, t in self._timers.items() if k in jobs}
        for key, body in jobs.items():
            if key in busy:
                acted.add(key)
                continue
            uid = body["metadata"].get("uid")
            if not (plan_all or self._changed(key, body, ids.get(uid, ()), decisions, lending)
                    or timers.get(key, now + 1) <= now):
                continue
            mine = pods_of.get(uid, [])
            state = self._state_of(body)
            actions = training.plan_job(body, mine, decisions.get(key), now, policy, max_restarts=max_restarts,
                                        lending=lending.get(key), agent_port=agent_port, state=state)
            if actions:
                acted.add(key)
            out.append(("jobs", key, actions))
            if (when := training.replan_at(body, mine, now, state)) is not None:
                timers[key] = when
            else:
                timers.pop(key, None)
        self._timers = timers
        return out, acted

    def _targets_of(self, servings: Mapping[str, Body]) -> dict[str, Target | ValueError]:
        """Each ServingDeployment's Target (`flotilla.serving.target`: its replica counts), made once per spec:
        the pool's arbiter and its Deployments read the same one."""
        changed = {k: body for k, body in servings.items()
                   if k not in self._targets or self._targets[k][0] != body["spec"]}
        fresh = targets_of(changed) if changed else {}
        self._targets = {k: (body["spec"], fresh[k] if k in fresh else self._targets[k][1])
                         for k, body in servings.items()}
        return {k: made for k, (_, made) in self._targets.items()}

    def _why_full(self, now: float, jobs: Mapping[str, Body], nodes: Mapping[str, Body],
                  inference_pools: bool) -> str | None:
        if not self.passes:
            return "first"
        if inference_pools != self._inference_pools:
            return "inference-pools"
        if not _same_objects(nodes, self._nodes):
            return "nodes"
        # A finished job is trimmed to its name and phase (no spec): its end is not a change of spec.
        if any(_generation(body) != _generation(was) for key, body in jobs.items()
               if (was := self._jobs.get(key)) is not None and body is not was and "spec" in body and "spec" in was):
            return "spec"
        if now >= self._next_full:  # after the global reasons: those plan every job, a time-driven pass does not
            return "time"
        return None

    def _changed(self, key: str, body: Body, pod_ids: tuple[int, ...], decisions: Mapping[str, JobDecision],
                 lending: Mapping[str, Any]) -> bool:
        """The job may have new actions: it had some the last time, or what `plan_job` reads changed."""
        uid = body["metadata"].get("uid")
        return (key in self._acted or body is not self._jobs.get(key) or pod_ids != self._pods_of.get(uid, ())
                or decisions.get(key) != self._last_decisions.get(key)
                or lending.get(key) != self._last_lending.get(key))

    def _state_of(self, body: Body) -> JobState:
        key = training.key_of(body)
        cached = self._states.get(key)
        if cached is not None and cached[0] is body:
            return cached[1]
        state = training.job_state(body)
        self._states[key] = (body, state, training.lent_to(body))
        return state


def _same_objects(now: Mapping[str, Body], before: Mapping[str, Body]) -> bool:
    return now.keys() == before.keys() and all(body is before[key] for key, body in now.items())


def _generation(body: Body) -> Any:
    return body["metadata"].get("generation")


def _pod_print(pod: Body) -> tuple:
    """What the allocator and the arbiter read of a pod: where it is, its GPUs, whether it is finished or
    terminating, whose it is (not whether it is Pending or Running)."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    return (spec.get("nodeName"), tuple(sorted((spec.get("nodeSelector") or {}).items())), pod_gpus(pod),
            (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"), meta.get("deletionTimestamp"),
            tuple(sorted((meta.get("labels") or {}).items())), worker_job_uid(pod), serving_key(pod))
