"""The unified GPU pool in the operator (pure): watched objects -> the pool arbiter -> what each object may do now.

The arbiter (`flotilla.pool.decide`) says who should hold which GPUs. Carrying that out
safely is this module's part:

* training jobs shrink through the resharding protocol (`training.plan_job`), and
  serving grows only into GPUs that are free *now*: not held by any pod (old worker
  sets included until they are gone), not pinned by a pending worker pod, not recorded
  for a worker set that is still being created; and only once no GPU recorded for a worker
  set is still unbound (kube-scheduler, which does not know the records, could give it to
  a serving pod and leave the worker Pending);
* while a ServingDeployment gives GPUs back (its pods are going away; the ReplicaSet,
  not the arbiter, chooses which), no training job grows: the next pass places growth on
  what is really free.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from flotilla import tenancy as tenancy_
from flotilla.allocation import ClusterSnapshot, JobDecision, JobState, NodeState
from flotilla.operator import queues, training
from flotilla.operator.pods import holds_gpus, pod_gpus, serving_key, worker_job_uid
from flotilla.operator.serving import ServingGrant
from flotilla.pool import PoolDecision, PoolPolicy, PoolSnapshot, ServingState, decide, with_foreign_gpus
from flotilla.resources import serving_deployment
from flotilla.serving.target import Target, target

Body = Mapping[str, Any]


@dataclass(frozen=True)
class PoolPlan:
    jobs: Mapping[str, JobDecision]
    lending: Mapping[str, Mapping[str, int]]  # job key -> serving key -> GPUs lent in this decision
    serving: Mapping[str, ServingGrant]
    tenant: tenancy_.TenantDecision | None = None  # with queues: the tenancy decision this plan carries out


def _serving_state(body: Body, placement: Mapping[str, int], now: float, policy: PoolPolicy,
                   want: Target | ValueError) -> tuple[ServingState, tuple[int, float]] | None:
    """The arbiter's view of a ServingDeployment, and its recent peak demand (GPUs, since when);
    None when it has no valid plan (plan_serving refuses it).

    The forecast is the highest demand within the policy's forecast window: a peak seen in the last
    window is planned for again (a daily peak, with a window of a day), and admission counts it."""
    sd = serving_deployment.parse(body)
    if sd.max_gpus is None:
        raise ValueError(f"ServingDeployment {sd.key} has no spec.maxGPUs")
    if isinstance(want, ValueError):
        return None
    unit = max(want.gpus_per_instance.values())
    max_gpus, min_gpus = sd.max_gpus, sd.min_gpus
    if unit > max_gpus or min_gpus > max_gpus:
        return None
    demand = min(want.gpus, max_gpus)
    peak = sd.pool.peak_gpus if sd.pool else 0
    since = sd.pool.peak_at if sd.pool and sd.pool.peak_at is not None else now
    if demand > peak or now - since >= policy.forecast_window_seconds:
        peak, since = demand, now
    state = ServingState(sd.key, demand_gpus=demand, min_gpus=min_gpus, max_gpus=max_gpus,
                         gpus_per_instance=unit, placement=dict(placement),
                         forecast=((now, peak),) if peak > demand else (),
                         below_since=sd.pool.below_since if sd.pool else None)
    return state, (peak, since)


def targets_of(servings: Mapping[str, Body]) -> dict[str, Target | ValueError]:
    """Each ServingDeployment's Target (`flotilla.serving.target`), or why it has none."""
    out: dict[str, Target | ValueError] = {}
    for key, body in servings.items():
        try:
            out[key] = target(body["spec"])
        except ValueError as e:
            out[key] = e
    return out


@dataclass
class _PodUsage:
    """Where the pods put GPUs, as the arbiter must count them."""

    # sd -> node -> GPUs of its live pods
    serving_live: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    # sd -> GPUs on schedulable nodes, terminating pods included
    serving_bound: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    serving_pending: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # sd -> GPUs of unbound pods
    foreign: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # node -> GPUs nobody may be given
    # job key -> node -> GPUs of its pods (any generation, bound or pinned)
    worker_use: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    bound: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # node -> GPUs of every pod bound there


def arbitrate(now: float, policy: PoolPolicy, jobs: Mapping[str, Body], nodes: Mapping[str, Body],
              pods: Mapping[str, Body], servings: Mapping[str, Body],
              job_states: Mapping[str, JobState] | None = None, base: ClusterSnapshot | None = None,
              tenancy: queues.Tenancy | None = None, targets: Mapping[str, Target | ValueError] | None = None
              ) -> PoolPlan:
    """`job_states`: job key -> its `training.job_state`, when already made; `base`: `training.snapshot` of the same objects,
    when already made; `tenancy`: the queues (`flotilla.tenancy.decide` decides, in place of
    `flotilla.pool.decide`); `targets`: each ServingDeployment's `flotilla.serving.target.target` (or the
    ValueError it raised), as the pass made them, else made here."""
    base = base or training.snapshot(now, jobs.values(), nodes.values(), pods.values(), states=job_states)
    placement = training.placement_reader(job_states)
    usage = _pod_usage(pods, servings, training.live_by_uid(jobs.values()),
                       {n.name for n in base.nodes if n.schedulable})
    states, peaks = _serving_states(servings, usage, now, policy,
                                    targets if targets is not None else targets_of(servings))
    node_states = with_foreign_gpus(base.nodes, usage.foreign)
    # A live job's old worker set terminating on a node it has left holds GPUs nobody may be given yet
    # (`_free_now` counts them through the job's pods).
    surplus = training.held_beyond_placement(jobs.values(), pods.values(), placement)
    tenant, held = None, {}
    if tenancy is None:
        decision = decide(PoolSnapshot(now, with_foreign_gpus(node_states, surplus), base.jobs,
                                       tuple(states.values()), releasing=surplus), policy)
    else:
        assigned = queues.assign(tenancy, base.jobs, tuple(states.values()), jobs, servings)
        # GPUs an old worker set is still releasing count as the cluster's (else a reclaim under way looks like a
        # node loss and shrinks every queue's guarantee); nothing is placed on them until they are free
        # (`queues.onto_free_gpus`).
        snapshot = PoolSnapshot(now, node_states, assigned.jobs, assigned.serving, releasing=surplus)
        tenant = tenancy_.decide(snapshot, tenancy.specs, policy)
        decision = replace(tenant.pool, jobs=queues.with_reclaims(tenant.pool.jobs, tenant.reclaims))
        held = dict(assigned.waiting)
    job_decisions = {**_no_growth_while_serving_gives_back(decision, usage.serving_bound, base.jobs), **held}
    free = _free_now(node_states, jobs, usage.worker_use, usage.serving_live, placement)
    if tenancy is not None:
        job_decisions = queues.onto_free_gpus(job_decisions, base.jobs, free)
    unbound = any(n.total_gpus - usage.bound.get(n.name, 0) > free.get(n.name, 0) for n in base.nodes if n.schedulable)
    grants = _grants(decision, states, peaks, free, usage, _borrowed(jobs), grow=not unbound)
    return PoolPlan(job_decisions, _lending(decision), grants, tenant)


def _pod_usage(pods: Mapping[str, Body], servings: Mapping[str, Body], live: Mapping[str, str],
               schedulable: set[str]) -> _PodUsage:
    """Sort the pods' GPUs: a live job's workers (`live`: job UID -> key), a ServingDeployment's pods (bound,
    pending, terminating), and the rest (a gone or finished job's pods, orphans too) foreign."""
    usage = _PodUsage()
    for pod in pods.values():
        meta, spec = pod["metadata"], pod.get("spec") or {}
        gpus, sd = pod_gpus(pod), serving_key(pod)
        finished = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        if not gpus or finished:
            continue
        if holds_gpus(pod):
            usage.bound[spec["nodeName"]] += gpus
        if (uid := worker_job_uid(pod)) is not None and (job := live.get(uid)) is not None:
            node = spec.get("nodeName") or (spec.get("nodeSelector") or {}).get("kubernetes.io/hostname")
            if node:
                usage.worker_use[job][node] += gpus
        elif sd is not None and sd in servings:
            if not spec.get("nodeName"):
                usage.serving_pending[sd] += gpus
                continue
            if spec["nodeName"] in schedulable:  # on a cordoned node they are lost to the arbiter, not given back
                usage.serving_bound[sd] += gpus
            if meta.get("deletionTimestamp"):
                usage.foreign[spec["nodeName"]] += gpus
            else:
                usage.serving_live[sd][spec["nodeName"]] += gpus
        elif holds_gpus(pod):
            usage.foreign[spec["nodeName"]] += gpus
    return usage


def _serving_states(servings: Mapping[str, Body], usage: _PodUsage, now: float, policy: PoolPolicy,
                    targets: Mapping[str, Target | ValueError]
                    ) -> tuple[dict[str, ServingState], dict[str, tuple[int, float]]]:
    """The arbiter's view of each ServingDeployment with a valid plan, and its recent peak. What one
    without a plan holds is not the arbiter's to give: it is counted foreign."""
    states, peaks = {}, {}
    for key, body in sorted(servings.items()):
        seen = _serving_state(body, usage.serving_live.get(key, {}), now, policy, targets[key])
        if seen is None:
            for node, g in usage.serving_live.get(key, {}).items():
                usage.foreign[node] += g
        else:
            states[key], peaks[key] = seen
    return states, peaks


def _no_growth_while_serving_gives_back(decision: PoolDecision, serving_bound: Mapping[str, int],
                                        jobs: tuple[JobState, ...]) -> dict[str, JobDecision]:
    """The arbiter's job decisions, except that no job grows while a ServingDeployment still holds more
    than its grant: the next pass places growth on what is really free."""
    giving_back = [key for key, d in decision.serving.items() if serving_bound.get(key, 0) > d.gpus]
    job_decisions = dict(decision.jobs)
    if giving_back:
        why = f"waiting for {', '.join('sd/' + k.rpartition('/')[2] for k in giving_back)} to give back GPUs"
        current = {j.key: j.placement for j in jobs}
        for key, d in job_decisions.items():
            if d.gpus > sum(current.get(key, {}).values()):
                job_decisions[key] = replace(d, placement=dict(current.get(key, {})), reason=why)
    return job_decisions


def _lending(decision: PoolDecision) -> dict[str, dict[str, int]]:
    """job key -> serving key -> GPUs the job lends in this decision."""
    lending: dict[str, dict[str, int]] = defaultdict(dict)
    for loan in decision.loans:
        if loan.gpus:
            lending[loan.job][loan.serving] = lending[loan.job].get(loan.serving, 0) + loan.gpus
    return lending


def _borrowed(jobs: Mapping[str, Body]) -> dict[str, dict[str, int]]:
    """serving key -> job key -> GPUs live jobs record as lent to it (status.lentTo) and not got back."""
    borrowed: dict[str, dict[str, int]] = defaultdict(dict)
    for key, body in jobs.items():
        if not training.is_final(body):
            for sd, g in training.lent_to(body).items():
                borrowed[sd][key] = g
    return borrowed


def _grants(decision: PoolDecision, states: Mapping[str, ServingState], peaks: Mapping[str, tuple[int, float]],
            free: Mapping[str, int], usage: _PodUsage, borrowed: Mapping[str, Mapping[str, int]],
            grow: bool = True) -> dict[str, ServingGrant]:
    """Each ServingDeployment's grant, and the budget it may hold now: what it holds plus what is free now
    (in whole instances), never more than the grant; pending serving pods have a claim on the free GPUs first.
    Without `grow` (a worker set's GPUs are not all bound yet), the budget is what it holds."""
    allowance = sum(f for f in free.values()) - sum(usage.serving_pending.values()) if grow else 0
    grants = {}
    for key, d in sorted(decision.serving.items()):
        unit = states[key].gpus_per_instance
        held = usage.serving_bound.get(key, 0) + usage.serving_pending.get(key, 0)
        room = sum(f // unit * unit for f in free.values())
        budget = min(d.gpus, held + max(0, min(room, allowance)))
        allowance -= max(0, budget - held)
        grants[key] = ServingGrant(d.gpus, budget, d.demanded, d.reason, d.below_since, peaks[key],
                                   borrowed.get(key, {}))
    return grants


def _free_now(nodes: tuple[NodeState, ...], jobs: Mapping[str, Body], worker_use: Mapping[str, Mapping[str, int]],
              serving_live: Mapping[str, Mapping[str, int]],
              placement: Callable[[Body], Mapping[str, int]] = training.placement_of) -> dict[str, int]:
    """GPUs free on each schedulable node right now: not foreign, not held by a serving pod, and per job
    not the larger of what its recorded placement and its pods (any generation, bound or pinned) take."""
    used: dict[str, int] = defaultdict(int)
    for held in serving_live.values():
        for node, g in held.items():
            used[node] += g
    for key, body in jobs.items():
        recorded = placement(body) if not training.is_final(body) else {}
        pods = worker_use.get(key, {})
        for node in set(recorded) | set(pods):
            used[node] += max(recorded.get(node, 0), pods.get(node, 0))
    return {n.name: max(0, n.usable_gpus - used.get(n.name, 0)) for n in nodes if n.schedulable}
