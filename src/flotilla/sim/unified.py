"""Training and serving on one cluster, under three policies side by side.

* static-peak: serving owns a fixed partition sized for its peak demand, training the rest;
* static-mean: the same, sized for its mean demand;
* unified: one pool, decided every step by the arbiter (flotilla.pool).

Time advances in fixed steps (`step_s`); every step the policy decides over a fresh
snapshot. Training is the training simulator's model (sim.training): a job runs at its
curve's rate for the GPUs it holds, and any change to its placement costs its
`restoreSeconds` (a checkpoint, then a restart at the new size).

Serving is a fluid model on the PD planner's capacities: at arrival rate r on g GPUs,
the requests served within the SLO are min(r, goodput(g)) per second, where goodput(g)
is the planner's predicted goodput of the best layout within g GPUs. Serving SLO
attainment is served-within-SLO over offered requests. Serving GPUs count as utilised up
to what the planner needs for the current rate; training GPUs while they train (not
while restoring).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from flotilla.allocation.elastic import DeadlineElastic
from flotilla.allocation.placement import place
from flotilla.allocation.snapshot import ClusterSnapshot, JobDecision, NodeState, Verdict
from flotilla.pool import PoolPolicy, PoolSnapshot, ServingState, decide
from flotilla.serving.planner import InstanceCapacities, plan_from_capacities
from flotilla.sim.training import SimJob, apply_decision, make_nodes
from flotilla.sim.training_trace import TraceJob

POLICIES = ("static-peak", "static-mean", "unified")
_RATE_BUCKET = 0.5  # req/s: the planner's demand is looked up at the rate rounded up to this


class ServingLoad:
    """One serving deployment: its arrival rate over time, what the forecaster expects, its planner."""

    def __init__(self, key: str, rate: Callable[[float], float], forecast: Callable[[float], float],
                 capacities: InstanceCapacities, min_gpus: int, max_gpus: int, gpus_per_instance: int) -> None:
        self.key, self.rate, self.forecast = key, rate, forecast
        self.capacities, self.min_gpus, self.max_gpus = capacities, min_gpus, max_gpus
        self.gpus_per_instance = gpus_per_instance
        self.demand = lru_cache(maxsize=None)(self._demand)
        self.goodput = lru_cache(maxsize=None)(self._goodput)

    def demand_at(self, rate: float) -> int:
        """GPUs the planner asks for at `rate` (rounded up to the cache's rate bucket)."""
        return self.demand(math.ceil(rate / _RATE_BUCKET) * _RATE_BUCKET)

    def _demand(self, rate: float) -> int:
        return plan_from_capacities(self.capacities, rate, self.min_gpus, self.max_gpus).gpus

    def _goodput(self, gpus: int) -> float:
        """Req/s served within the SLO by the best layout within `gpus` GPUs."""
        try:
            return plan_from_capacities(self.capacities, 1e9, 0, gpus).predicted_goodput
        except ValueError:  # not even one instance of each phase fits
            return 0.0


@dataclass(frozen=True)
class Scenario:
    name: str
    gpus: int
    duration_s: float
    training: tuple[TraceJob, ...]
    serving: tuple[ServingLoad, ...]
    # The peak and mean rate of each deployment over the run, for the static partitions.
    peak_rates: tuple[float, ...]
    mean_rates: tuple[float, ...]


@dataclass(frozen=True)
class UnifiedResult:
    scenario: str
    policy: str
    deadline_ratio: float  # jobs that finished by their deadline / jobs whose deadline falls within the span
    slo_attainment: float  # requests served within the SLO / requests offered
    utilisation: float  # useful GPU-seconds / (GPUs x duration)
    checkpoint_shrinks: int  # times a running training job was shrunk (or stopped) through a checkpoint
    rejected: int
    serving_gpus_mean: float
    training_gpus_mean: float

    def summary(self) -> dict[str, object]:
        return dict(self.__dict__)


def simulate(scenario: Scenario, policy: str, pool_policy: PoolPolicy = PoolPolicy(), step_s: float = 120.0,
             forecast_step_s: float = 900.0, forecast_horizon_s: float = 86400.0) -> UnifiedResult:
    """Run `scenario` under `policy` (one of POLICIES)."""
    if policy not in POLICIES:
        raise ValueError(f"policy: unknown {policy!r}; choose from {', '.join(POLICIES)}")
    if step_s <= 0:
        raise ValueError(f"step_s: must be > 0, got {step_s}")
    nodes = make_nodes(scenario.gpus)
    jobs = [SimJob(t) for t in sorted(scenario.training, key=lambda t: (t.submit, t.job_id))]
    serving_placement: dict[str, dict[str, int]] = {}
    below_since: dict[str, float | None] = {s.key: None for s in scenario.serving}
    static_nodes = nodes
    if policy != "unified":
        rates = scenario.peak_rates if policy == "static-peak" else scenario.mean_rates
        static_nodes = _partition(nodes, scenario.serving, rates, serving_placement)
    allocator = DeadlineElastic()

    offered = served = useful = serving_held = training_held = 0.0
    shrinks = 0
    now = 0.0
    while now < scenario.duration_s - 1e-9:
        active = [j for j in jobs if j.trace.submit <= now and j.finish is None and j.verdict is not Verdict.REJECTED]
        states = tuple(j.state(now) for j in active)
        decisions: dict[str, JobDecision]
        if policy == "unified":
            pool = decide(PoolSnapshot(now, nodes, states, tuple(
                _serving_state(s, now, serving_placement.get(s.key, {}), below_since[s.key], forecast_step_s,
                               forecast_horizon_s) for s in scenario.serving)), pool_policy)
            decisions = dict(pool.jobs)
            for key, sd in pool.serving.items():
                serving_placement[key] = dict(sd.placement)
                below_since[key] = sd.below_since
        else:
            decisions = dict(allocator.decide(ClusterSnapshot(now, static_nodes, states)).jobs)
        for job in active:
            before = job.gpus
            apply_decision(job, decisions.get(job.trace.job_id), now)
            if 0 < before and job.gpus < before:
                shrinks += 1

        dt = min(step_s, scenario.duration_s - now)
        for s in scenario.serving:
            rate = s.rate(now + dt / 2)
            gpus = sum(serving_placement.get(s.key, {}).values())
            offered += rate * dt
            served += min(rate, s.goodput(gpus)) * dt
            useful += min(gpus, s.demand_at(rate)) * dt
            serving_held += gpus * dt
        for job in active:
            if not job.gpus or job.verdict is Verdict.REJECTED:
                continue
            start = min(max(now, job.idle_until), now + dt)
            training_held += job.gpus * dt
            rate = job.rate()
            left = job.trace.total_steps - job.done
            if rate * (now + dt - start) >= left - 1e-9:
                job.finish = start + left / rate
                useful += job.gpus * (job.finish - start)
                job.done = job.trace.total_steps
                job.placement = {}
            else:
                job.done += rate * (now + dt - start)
                useful += job.gpus * (now + dt - start)
        now += dt

    judged = [j for j in jobs if j.trace.deadline <= scenario.duration_s]
    met = sum(1 for j in judged if j.finish is not None and j.finish <= j.trace.deadline + 1e-6)
    span = scenario.duration_s
    return UnifiedResult(
        scenario=scenario.name, policy=policy, deadline_ratio=met / max(1, len(judged)),
        slo_attainment=served / offered if offered else 1.0, utilisation=useful / (scenario.gpus * span),
        checkpoint_shrinks=shrinks, rejected=sum(1 for j in jobs if j.verdict is Verdict.REJECTED),
        serving_gpus_mean=serving_held / span, training_gpus_mean=training_held / span,
    )


def _partition(nodes: tuple[NodeState, ...], serving: tuple[ServingLoad, ...], rates: tuple[float, ...],
               placements: dict[str, dict[str, int]]) -> tuple[NodeState, ...]:
    """Give each deployment a fixed partition sized for `rates`; the nodes as training sees them."""
    free = {n.name: n.usable_gpus for n in nodes}
    for s, rate in zip(serving, rates):
        placement: dict[str, int] = {}
        unit = s.gpus_per_instance
        for _ in range(math.ceil(s.demand_at(rate) / unit)):
            got = place(unit, unit, free, nodes)
            if got is None:
                raise ValueError(f"{s.key}: its static partition does not fit the cluster")
            for node, g in got.items():
                placement[node] = placement.get(node, 0) + g
                free[node] -= g
        placements[s.key] = placement
    taken = {n.name: n.usable_gpus - free[n.name] for n in nodes}
    return tuple(NodeState(n.name, n.total_gpus, n.foreign_gpus + taken[n.name], n.schedulable, n.labels)
                 for n in nodes)


def _serving_state(s: ServingLoad, now: float, placement: dict[str, int], below_since: float | None,
                   forecast_step_s: float, horizon_s: float) -> ServingState:
    """What the operator would hand the arbiter: demand for the rate now, and the forecast's demand
    (the higher end of each forecast step) over the horizon."""
    forecast = []
    t = now + forecast_step_s
    while t <= now + horizon_s:
        rate = max(s.forecast(t - forecast_step_s), s.forecast(t))
        forecast.append((t - forecast_step_s, s.demand_at(rate)))
        t += forecast_step_s
    return ServingState(s.key, s.demand_at(s.rate(now)), s.min_gpus, s.max_gpus, s.gpus_per_instance,
                        placement, tuple(forecast), below_since)
