"""The PD planner: which instances to run, and how many, to serve a rate within the SLO on the fewest GPUs.

1. For every GPUs-per-instance the profile covers, the capacity of one prefill, one decode and one
   colocated instance at the SLO (flotilla.serving.latency), i.e. each phase's goodput per GPU.
2. For every pair (prefill GPUs, decode GPUs) the replica counts are searched independently (uneven
   counts such as 1 prefill : 3 decode come out naturally), and colocated instances are one more
   candidate. A candidate's capacity is the rate its bottleneck phase sustains.
   Configurations whose latency model failed validation (flotilla.serving.validation) are not offered.
3. The plan that meets the rate with the fewest GPUs (but at least `min_gpus` where the layout
   allows) wins; ties go to more capacity. GPUs up to `min_gpus` go to the bottleneck phase. When no candidate within `max_gpus` meets the rate, the
   plan is the one with the most capacity within the budget, flagged `slo_at_risk` with the rate it
   can meet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Literal

from flotilla.serving.latency import colocated_capacity, decode_capacity, prefill_capacity
from flotilla.serving.profile import Profile
from flotilla.serving.validation import PREDICTION_TOLERANCE, offered
from flotilla.serving.workload import SLO, Workload

Mode = Literal["disaggregated", "colocated"]


@dataclass(frozen=True)
class PlanRequest:
    workload: Workload
    slo: SLO
    profile: Profile
    min_gpus: int
    max_gpus: int
    allow_colocated: bool = True
    allow_disaggregated: bool = True
    prefill_gpus: int | None = None  # pin GPUs per prefill instance (spec.prefill.gpusPerInstance)
    decode_gpus: int | None = None  # pin GPUs per decode instance (spec.decode.gpusPerInstance)
    # plan() checks a plan by simulation before offering it (flotilla.serving.search); False: the
    # analytical model alone, per-phase budgets, as the re-planner's fast path does
    check: bool = True
    router: str = "queue"  # the router the check assumes (flotilla.serving.check.ROUTERS)

    def __post_init__(self) -> None:
        if self.min_gpus < 0:
            raise ValueError(f"minGPUs: must be >= 0, got {self.min_gpus}")
        if not (self.allow_colocated or self.allow_disaggregated):
            raise ValueError("mode: allow colocated or disaggregated plans, or both")
        if self.router not in ("queue", "queue-first", "queue+kv"):
            raise ValueError(f"router: must be queue, queue-first or queue+kv, got {self.router!r}")
        if self.max_gpus < max(self.min_gpus, 1):
            raise ValueError(f"maxGPUs: must be >= max(minGPUs, 1), got {self.max_gpus} (minGPUs {self.min_gpus})")


@dataclass(frozen=True)
class Plan:
    """Replica counts and GPUs per instance. In colocated mode every instance serves both phases and
    the prefill/decode fields are zero."""

    mode: Mode
    prefill_replicas: int
    prefill_gpus_per_instance: int
    decode_replicas: int
    decode_gpus_per_instance: int
    colocated_replicas: int
    colocated_gpus_per_instance: int
    predicted_goodput: float  # highest req/s served within the SLO attainment
    offered_rate: float  # the rate planned for
    slo_at_risk: bool
    reason: str = field(compare=False)

    @property
    def gpus(self) -> int:
        return (self.prefill_replicas * self.prefill_gpus_per_instance
                + self.decode_replicas * self.decode_gpus_per_instance
                + self.colocated_replicas * self.colocated_gpus_per_instance)

    @property
    def goodput_per_gpu(self) -> float:
        return self.predicted_goodput / self.gpus if self.gpus else 0.0

    def shape(self) -> tuple[int, int, int, int, int, int]:
        """What the operator deploys; two plans with the same shape need no change."""
        return (self.prefill_replicas, self.prefill_gpus_per_instance, self.decode_replicas,
                self.decode_gpus_per_instance, self.colocated_replicas, self.colocated_gpus_per_instance)

    def describe(self) -> str:
        if self.mode == "colocated":
            return f"{self.colocated_replicas}x{self.colocated_gpus_per_instance}-GPU colocated"
        return (f"{self.prefill_replicas}x{self.prefill_gpus_per_instance}-GPU prefill + "
                f"{self.decode_replicas}x{self.decode_gpus_per_instance}-GPU decode")


@dataclass(frozen=True)
class InstanceCapacities:
    """Req/s one instance of each kind sustains within the SLO, by GPUs per instance."""

    prefill: dict[int, float]
    decode: dict[int, float]
    colocated: dict[int, float]


def instance_capacities(workload: Workload, slo: SLO, profile: Profile, allow_colocated: bool = True,
                        prefill_gpus: int | None = None, decode_gpus: int | None = None,
                        allow_disaggregated: bool = True) -> InstanceCapacities:
    """Capacities of the configurations offered. Without disaggregated plans, prefill and decode are
    empty (and a profile offering no colocated configuration then raises). They depend on the lengths,
    not the rate, and the re-planner asks every window: the last answers are kept."""
    caps = _instance_capacities(workload.at_rate(0.0), slo, profile, profile.prediction_errors, allow_colocated,
                                prefill_gpus, decode_gpus, allow_disaggregated)
    return InstanceCapacities(dict(caps.prefill), dict(caps.decode), dict(caps.colocated))


@lru_cache(maxsize=256)
def _instance_capacities(workload: Workload, slo: SLO, profile: Profile,
                         prediction_errors: tuple[tuple[str, int, float], ...],  # not in Profile's hash
                         allow_colocated: bool, prefill_gpus: int | None, decode_gpus: int | None,
                         allow_disaggregated: bool) -> InstanceCapacities:
    miss_budget = (1.0 - slo.attainment) / 2.0
    errors = profile.errors
    prefill = {f.gpus: prefill_capacity(f, workload, slo.ttft_ms, miss_budget)
               for f in profile.prefill if prefill_gpus in (None, f.gpus) and offered(errors, "prefill", f.gpus)}
    decode = {f.gpus: decode_capacity(f, workload, slo.tpot_ms, miss_budget)
              for f in profile.decode if decode_gpus in (None, f.gpus) and offered(errors, "decode", f.gpus)}
    colocated: dict[int, float] = {}
    if allow_colocated and prefill_gpus is None and decode_gpus is None:
        decode_degrees = {f.gpus: f for f in profile.decode}
        colocated = {f.gpus: colocated_capacity(f, decode_degrees[f.gpus], workload, slo.ttft_ms, slo.tpot_ms,
                                                miss_budget)
                     for f in profile.prefill if f.gpus in decode_degrees and offered(errors, "colocated", f.gpus)}
    if not allow_disaggregated:
        if not colocated:
            raise ValueError(f"profile: {profile.name!r} offers no colocated configuration "
                             f"validated within {PREDICTION_TOLERANCE:.0%}")
        return InstanceCapacities({}, {}, colocated)
    for kind, caps, pinned in (("prefill", prefill, prefill_gpus), ("decode", decode, decode_gpus)):
        if not caps:
            fits = profile.prefill if kind == "prefill" else profile.decode
            if pinned is not None and all(f.gpus != pinned for f in fits):
                raise ValueError(f"{kind}.gpusPerInstance: profile {profile.name!r} has no entry for {pinned} GPUs")
            raise ValueError(f"{kind}.gpusPerInstance: profile {profile.name!r} offers no {kind} configuration "
                             f"{'of ' + str(pinned) + ' GPUs ' if pinned is not None else ''}whose latency model "
                             f"was validated within {PREDICTION_TOLERANCE:.0%}")
    return InstanceCapacities(prefill, decode, colocated)


@dataclass(frozen=True)
class _Candidate:
    mode: Mode
    counts: tuple[int, int, int, int, int, int]  # same order as Plan.shape()
    gpus: int
    capacity: float


def plan(request: PlanRequest) -> Plan:
    """The plan for the request's rate. Raises ValueError (naming the field) when no instance fits
    maxGPUs or no configuration meets the SLO at any rate. Pinning GPUs per instance (either phase)
    rules colocated out. With `request.check` (the default) the plan is the checked one of
    flotilla.serving.search."""
    if request.check:
        from flotilla.serving.search import checked_plan  # imports this module: load late

        return checked_plan(request)
    caps = instance_capacities(request.workload, request.slo, request.profile, request.allow_colocated,
                               request.prefill_gpus, request.decode_gpus, request.allow_disaggregated)
    return plan_from_capacities(caps, request.workload.requests_per_second, request.min_gpus, request.max_gpus)


def plan_from_capacities(caps: InstanceCapacities, rate: float, min_gpus: int, max_gpus: int) -> Plan:
    candidates = [c for c in _candidates(caps, rate, min_gpus, max_gpus) if c.capacity > 0]
    if not candidates:
        smallest = min(min(caps.prefill, default=math.inf) + min(caps.decode, default=math.inf),
                       min(caps.colocated, default=math.inf))
        if smallest > max_gpus:
            raise ValueError(f"maxGPUs: {max_gpus} GPUs cannot hold one instance of each phase "
                             f"(the smallest layout needs {smallest})")
        raise ValueError("profile: no instance configuration meets the SLO even at a vanishing rate "
                         "(the TTFT or TPOT target is below the profile's fastest prefill or decode step)")
    meeting = [c for c in candidates if c.capacity >= rate]
    if meeting:
        best = min(meeting, key=lambda c: (c.gpus < min_gpus, c.gpus, -c.capacity, c.mode != "disaggregated"))
    else:
        best = min(candidates, key=lambda c: (-c.capacity, c.gpus, c.mode != "disaggregated"))
    chosen = Plan(best.mode, *best.counts, predicted_goodput=best.capacity, offered_rate=rate,
                  slo_at_risk=best.capacity < rate, reason="")
    return replace(chosen, reason=_reason(chosen, candidates, max_gpus))


def plan_capacity(layout: Plan, caps: InstanceCapacities) -> float:
    """Req/s that a plan's instances sustain within the SLO under the load `caps` was computed for.
    A configuration that `caps` does not cover (a pinned GPU count changed) counts as 0."""
    if layout.mode == "colocated":
        return layout.colocated_replicas * caps.colocated.get(layout.colocated_gpus_per_instance, 0.0)
    return min(layout.prefill_replicas * caps.prefill.get(layout.prefill_gpus_per_instance, 0.0),
               layout.decode_replicas * caps.decode.get(layout.decode_gpus_per_instance, 0.0))


def _candidates(caps: InstanceCapacities, rate: float, min_gpus: int, max_gpus: int) -> list[_Candidate]:
    out = []
    for gp, cap_p in caps.prefill.items():
        for gd, cap_d in caps.decode.items():
            counts = _disaggregated_counts(gp, cap_p, gd, cap_d, rate, min_gpus, max_gpus)
            if counts is not None:
                n_p, n_d = counts
                out.append(_Candidate("disaggregated", (n_p, gp, n_d, gd, 0, 0), n_p * gp + n_d * gd,
                                      min(n_p * cap_p, n_d * cap_d)))
    for g, cap in caps.colocated.items():
        if g > max_gpus or cap <= 0:
            continue
        n = max(_needed(rate, cap), 1, math.ceil(min_gpus / g))
        n = min(n, max_gpus // g)
        out.append(_Candidate("colocated", (0, 0, 0, 0, n, g), n * g, n * cap))
    return out


def _disaggregated_counts(gp: int, cap_p: float, gd: int, cap_d: float, rate: float, min_gpus: int,
                          max_gpus: int) -> tuple[int, int] | None:
    if gp + gd > max_gpus or cap_p <= 0 or cap_d <= 0:
        return None
    n_p, n_d = max(_needed(rate, cap_p), 1), max(_needed(rate, cap_d), 1)
    if n_p * gp + n_d * gd <= max_gpus:
        # Meets the rate; spend GPUs up to min_gpus on the bottleneck phase.
        while n_p * gp + n_d * gd < min_gpus:
            room = max_gpus - n_p * gp - n_d * gd
            prefill_first = n_p * cap_p <= n_d * cap_d
            if (prefill_first or gd > room) and gp <= room:
                n_p += 1
            elif gd <= room:
                n_d += 1
            else:
                break
        return n_p, n_d
    # Over budget: the split within max_gpus with the most capacity (ties: fewer GPUs).
    best = None
    for n_p in range(1, (max_gpus - gd) // gp + 1):
        n_d = min((max_gpus - n_p * gp) // gd, max(_needed(n_p * cap_p, cap_d), 1))
        key = (min(n_p * cap_p, n_d * cap_d), -(n_p * gp + n_d * gd))
        if best is None or key > best[0]:
            best = (key, n_p, n_d)
    assert best is not None
    return best[1], best[2]


def _needed(rate: float, capacity: float) -> int:
    # A relative tolerance keeps float noise (rate == capacity) from asking for an extra instance.
    return math.ceil(rate / capacity - 1e-9) if capacity > 0 else 0


def _reason(chosen: Plan, candidates: list[_Candidate], max_gpus: int) -> str:
    rate, shape = chosen.offered_rate, chosen.describe()
    if chosen.slo_at_risk:
        return (f"SLO at risk: {max_gpus} GPUs meet at most {chosen.predicted_goodput:.2f} req/s of the "
                f"{rate:.2f} offered; {shape} serves the most")
    text = (f"{shape} serves {chosen.predicted_goodput:.2f} req/s within the SLO (offered {rate:.2f}) "
            f"on {chosen.gpus} GPU(s)")
    others = [c for c in candidates if c.mode != chosen.mode and c.capacity >= rate]
    if others:
        runner_up = min(c.gpus for c in others)
        text += f"; {'disaggregated' if chosen.mode == 'colocated' else 'colocated'} would need {runner_up}"
    elif chosen.mode == "disaggregated" and any(c.mode == "colocated" for c in candidates):
        text += "; colocated cannot meet the rate within the budget"
    return text
