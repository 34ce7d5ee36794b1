"""One GPU pool for training and serving: the arbiter.

`decide(snapshot, policy)` is a pure function of one snapshot:

1. Serving first. Each ServingDeployment's target is its planner's demand, within
   minGPUs..maxGPUs, in whole instances. A shrink waits for the hold-down: the
   deployment keeps its GPUs until its demand has stayed below them for
   `hold_down_seconds` (`below_since` carries that clock from one decision to the next).
   GPUs on unschedulable nodes are lost and must be found again.
2. Serving growth takes idle GPUs first.
3. Training: the elastic allocator (allocation.elastic) runs on the GPUs serving does
   not hold, with serving's forecast over time as a claim in the admission profile
   (ClusterSnapshot.claimed): a job is admitted, and its minimum satisfactory share
   sized, so that it meets its deadline even when serving reaches its forecast (plus
   the policy's headroom). Leftovers go to training by marginal gain, as before.
4. Serving growth that idle GPUs cannot meet goes on GPUs a shrinking job's old workers are giving
   back (PoolSnapshot.releasing: the grant waits for them to be free), then is borrowed from training: from the
   surplus above each job's guaranteed share, cheapest shrink first (GPU-seconds the
   job loses: restore time plus the work since its last checkpoint, times its GPUs;
   ties go to the shrink that strands fewer freed GPUs outside whole serving
   instances). A guaranteed share is taken only when the policy allows it.
5. The transition: shrink first (checkpoint, smaller worker sets, serving scale-down),
   then grow, so that no GPU is ever held twice and no node goes over capacity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping

from flotilla.allocation.elastic import DeadlineElastic
from flotilla.allocation.placement import free_gpus, place, shrink_in_place
from flotilla.allocation.sizes import job_sizes
from flotilla.allocation.snapshot import ClusterSnapshot, Decision, JobDecision, JobState, NodeState, Verdict
from flotilla.pool.types import (
    Loan,
    PoolDecision,
    PoolPolicy,
    PoolSnapshot,
    ServingDecision,
    ServingState,
    Transition,
)

_ALLOCATOR = DeadlineElastic()


@dataclass
class _Serving:
    sd: ServingState
    want: int  # demand clamped to min..max, whole instances
    target: int  # what it should hold after this decision (want, or more during the hold-down)
    placement: dict[str, int]
    below_since: float | None
    notes: list[str]
    borrowed: dict[str, int] = field(default_factory=dict)

    @property
    def need(self) -> int:
        return self.target - sum(self.placement.values())

    @property
    def unit(self) -> int:
        return self.sd.gpus_per_instance


def decide(snapshot: PoolSnapshot, policy: PoolPolicy = PoolPolicy()) -> PoolDecision:
    """GPUs and placement for every TrainingJob and ServingDeployment, with a reason for each."""
    now = snapshot.now
    schedulable = {n.name for n in snapshot.nodes if n.schedulable}
    servings = [_serving_target(sd, now, policy, schedulable) for sd in sorted(snapshot.serving, key=lambda s: s.key)]

    live_training = [j.placement for j in snapshot.jobs if j.placement and set(j.placement) <= schedulable]
    idle = free_gpus(snapshot.nodes, [*live_training, *(s.placement for s in servings)])
    for s in servings:
        _grow_on(s, idle, snapshot.nodes)

    serving_on: dict[str, int] = {}
    for s in servings:
        for node, g in s.placement.items():
            serving_on[node] = serving_on.get(node, 0) + g
    training_nodes = with_foreign_gpus(snapshot.nodes, serving_on)
    claimed = _claims(servings, now, policy)
    training = ClusterSnapshot(now, training_nodes, snapshot.jobs, claimed)
    decision = _ALLOCATOR.decide(training)
    guarded = _Protected(decision, training)

    jobs = {j.key: j for j in snapshot.jobs}
    placements = {key: dict(d.placement) for key, d in decision.jobs.items()}
    free = free_gpus(snapshot.nodes, [*placements.values(), *(s.placement for s in servings)])
    loans: list[Loan] = []
    releasing = dict(snapshot.releasing)
    for s in servings:
        _grow_on(s, free, snapshot.nodes)
        # GPUs a shrink under way is giving back (its lender's old workers still terminating) are not borrowed
        # a second time: decided again once they are free, the job would be shrunk now and grown back then.
        _grow_on(s, releasing, snapshot.nodes)
        if s.need > 0:
            loans += _borrow(s, jobs, placements, guarded.shares(), free, snapshot.nodes, policy)
    protected = guarded.shares() if guarded.known else {
        key: d.guaranteed_gpus if d.verdict is Verdict.ADMITTED else 0 for key, d in decision.jobs.items()}

    job_decisions = {key: _job_decision(d, placements[key], protected[key], loans) for key, d in decision.jobs.items()}
    serving_decisions = {s.sd.key: _serving_decision(s, protected, placements) for s in servings}
    return PoolDecision(job_decisions, serving_decisions, tuple(loans), transition(snapshot, job_decisions,
                                                                                    serving_decisions))


class _Protected:
    """What borrowing may not take from each job. An admitted job keeps the larger of two shares: the one
    it needs now with serving at its target now and at its forecast later (the decision's), and the one it
    needs were serving to stay as it is. The second keeps its guarantee when serving outgrows what
    admission counted on, or when the first would let it fall behind now and count on catching up later.
    The second takes an allocator run of its own over every job, and only a ServingDeployment short of
    GPUs reads it: it is made on first use (most decisions borrow nothing, and their job decisions carry
    the decision's guaranteed share)."""

    def __init__(self, decision: Decision, training: ClusterSnapshot) -> None:
        self._decision, self._training = decision, training
        self._shares: dict[str, int] | None = None

    @property
    def known(self) -> bool:
        return self._shares is not None

    def shares(self) -> dict[str, int]:
        if self._shares is None:
            decision, training = self._decision, self._training
            plain = (decision if not any(g for _, g in training.claimed)
                     else _ALLOCATOR.decide(replace(training, claimed=())))
            self._shares = {key: max(d.guaranteed_gpus, plain.jobs[key].guaranteed_gpus)
                            if d.verdict is Verdict.ADMITTED else 0 for key, d in decision.jobs.items()}
        return self._shares


def with_foreign_gpus(nodes: tuple[NodeState, ...], extra: Mapping[str, int]) -> tuple[NodeState, ...]:
    """`nodes` with `extra` (node -> GPUs) added to their foreign GPUs; a node given none is kept as it is."""
    return tuple(replace(n, foreign_gpus=n.foreign_gpus + extra[n.name]) if extra.get(n.name) else n for n in nodes)


def _instances(gpus: int, unit: int, cap: int) -> int:
    """`gpus` rounded up to whole instances, but never above `cap` (rounded down to whole instances)."""
    return min(math.ceil(gpus / unit) * unit, cap // unit * unit)


def _serving_target(sd: ServingState, now: float, policy: PoolPolicy, schedulable: set[str]) -> _Serving:
    unit = sd.gpus_per_instance
    held = {n: g for n, g in sd.placement.items() if n in schedulable and g}
    holds = sum(held.values())
    want = _instances(max(sd.demand_gpus, sd.min_gpus), unit, sd.max_gpus)
    notes = [f"planner needs {sd.demand_gpus} GPUs"]
    if want != sd.demand_gpus:
        notes[0] += f" ({want} within minGPUs..maxGPUs in whole {unit}-GPU instances)"
    if holds < sd.gpus:
        notes.append(f"lost {sd.gpus - holds} GPUs on unschedulable nodes")
    target, below_since = want, None
    if want < holds:
        since = now if sd.below_since is None else sd.below_since
        if now - since >= policy.hold_down_seconds:
            notes.append(f"gives back {holds - want} GPUs: below its holdings for {now - since:.0f} s "
                         f"(hold-down {policy.hold_down_seconds:.0f} s)")
        else:
            target, below_since = holds, since
            # No elapsed time here: the reason goes into status, which would then change every pass.
            notes.append(f"keeps {holds} GPUs through the hold-down (gives back {holds - want} once demand has "
                         f"stayed below for {policy.hold_down_seconds:.0f} s)")
    placement = shrink_in_place(held, target, unit) if target < holds else held
    return _Serving(sd, want, target, placement, below_since, notes)


def _grow_on(s: _Serving, free: dict[str, int], nodes: tuple[NodeState, ...]) -> int:
    """Place as many of `s`'s missing instances as fit on `free` (taken from it); GPUs placed."""
    placed = 0
    while s.need >= s.unit:
        got = place(s.unit, s.unit, free, nodes)
        if got is None:
            break
        for node, g in got.items():
            s.placement[node] = s.placement.get(node, 0) + g
            free[node] -= g
            placed += g
    return placed


def _forecast_at(sd: ServingState, t: float) -> int:
    return next((g for start, g in reversed(sorted(sd.forecast)) if start <= t), sd.demand_gpus)


def _claims(servings: list[_Serving], now: float, policy: PoolPolicy) -> tuple[tuple[float, int], ...]:
    """Serving's forecast, with headroom, as claims on the GPUs training sees now."""
    holds = sum(sum(s.placement.values()) for s in servings)
    times = sorted({now} | {t for s in servings for t, _ in s.sd.forecast if t > now})

    def reserve(s: _Serving, t: float) -> int:
        forecast = math.ceil(_forecast_at(s.sd, t) * (1 + policy.forecast_headroom))
        gpus = _instances(max(forecast, s.sd.min_gpus), s.unit, s.sd.max_gpus)
        return max(gpus, s.target) if t == now else gpus

    return tuple((t, sum(reserve(s, t) for s in servings) - holds) for t in times)


@dataclass(frozen=True)
class _Shrink:
    job: str
    size: int
    placement: dict[str, int]
    freed: dict[str, int]
    cost: float  # GPU-seconds the job loses: restore plus redoing the work since its last checkpoint
    stranded: int  # freed GPUs that do not make a whole serving instance


def _borrow(s: _Serving, jobs: dict[str, JobState], placements: dict[str, dict[str, int]],
            protected: dict[str, int], free: dict[str, int], nodes: tuple[NodeState, ...],
            policy: PoolPolicy) -> list[Loan]:
    """Shrink training jobs, cheapest first, until `s` has its target or nothing more may be taken."""
    loans: list[Loan] = []
    passes = (False, True) if policy.borrow_guaranteed else (False,)
    for from_guarantee in passes:
        while s.need >= s.unit:
            options = [o for key in sorted(placements) if placements[key]
                       if (o := _shrink_option(jobs[key], placements[key], 0 if from_guarantee else protected[key],
                                               s, free)) is not None]
            if not options:
                break
            best = min(options, key=lambda o: (o.cost, o.stranded, o.job))
            placements[best.job] = best.placement
            for node, g in best.freed.items():
                free[node] = free.get(node, 0) + g
            placed = _grow_on(s, free, nodes)
            lent = min(placed, sum(best.freed.values()))
            s.borrowed[best.job] = s.borrowed.get(best.job, 0) + lent
            loans.append(Loan(best.job, s.sd.key, lent, from_guarantee and best.size < protected[best.job]))
    return loans


def _shrink_option(job: JobState, placement: dict[str, int], floor: int, s: _Serving,
                   free: dict[str, int]) -> _Shrink | None:
    """The smallest shrink of `job` (not below `floor`) that meets `s`'s need, else the largest; None if none helps."""
    current = sum(placement.values())
    sizes = [g for g in ((0,) if floor == 0 else ()) + job_sizes(job)[0] if floor <= g < current]
    if not sizes:
        return None
    enough = [g for g in sizes if g <= current - s.need]
    size = max(enough) if enough else min(sizes)
    kept = shrink_in_place(placement, size, job.gpus_per_worker)
    freed = {n: g - kept.get(n, 0) for n, g in placement.items() if g > kept.get(n, 0)}
    before = sum(f // s.unit for f in free.values())
    after = sum((free.get(n, 0) + freed.get(n, 0)) // s.unit for n in set(free) | set(freed))
    gain = min(after - before, s.need // s.unit) * s.unit
    if gain <= 0:
        return None
    lost_seconds = job.steps_since_checkpoint / job.curve.rate(current)
    return _Shrink(job.key, size, kept, freed, (job.restore_seconds + lost_seconds) * current,
                   sum(freed.values()) - gain)


def _ref(kind: str, key: str, seen_from: str) -> str:
    """"sd/chat" for a deployment in the same namespace as `seen_from`, "sd/other-ns/chat" otherwise."""
    namespace, _, name = key.rpartition("/")
    same = namespace == seen_from.rpartition("/")[0]
    return f"{kind}/{name}" if same or not namespace else f"{kind}/{key}"


def _job_decision(d: JobDecision, placement: dict[str, int], protected: int, loans: list[Loan]) -> JobDecision:
    mine = [loan for loan in loans if loan.job == d.key and loan.gpus]
    if not mine:
        return replace(d, guaranteed_gpus=protected)
    lent: dict[str, int] = {}
    for loan in mine:
        lent[loan.serving] = lent.get(loan.serving, 0) + loan.gpus
    parts = [d.reason] + [f"lent {g} GPUs to {_ref('sd', sd, d.key)}" for sd, g in lent.items()]
    gpus = sum(placement.values())
    if any(loan.from_guarantee for loan in mine):
        parts.append(f"taken below its guaranteed share of {protected} GPUs by policy borrowGuaranteed: "
                     f"its deadline is no longer guaranteed")
        protected = 0
    else:
        parts.append(f"keeps {gpus} GPUs, at or above its guaranteed share")
    return replace(d, placement=placement, reason="; ".join(parts), guaranteed_gpus=protected)


def _serving_decision(s: _Serving, protected: dict[str, int], placements: dict[str, dict[str, int]]) -> ServingDecision:
    notes = list(s.notes)
    notes += [f"borrowed {g} GPUs from {_ref('tj', job, s.sd.key)}" for job, g in s.borrowed.items() if g]
    if s.need > 0:
        guarded = [_ref("tj", key, s.sd.key) for key, g in sorted(protected.items()) if g and placements.get(key)]
        if guarded:
            notes.append(f"short {s.need} GPUs: taking them would break the guaranteed share of "
                         f"{', '.join(guarded)} (policy borrowGuaranteed is off)")
        else:
            notes.append(f"short {s.need} GPUs: none free in whole {s.unit}-GPU instances")
    gpus = sum(s.placement.values())
    notes.append(f"holds {gpus} GPUs")
    return ServingDecision(s.sd.key, dict(s.placement), s.want, "; ".join(notes), s.below_since)


def transition(snapshot: PoolSnapshot, jobs: Mapping[str, JobDecision],
               serving: Mapping[str, ServingDecision]) -> Transition:
    """Who shrinks and who grows from the snapshot's placements to the decisions', and what each holds
    in between (shrink first, then grow)."""
    before = {f"tj/{j.key}": dict(j.placement) for j in snapshot.jobs}
    before.update({f"sd/{s.key}": dict(s.placement) for s in snapshot.serving})
    after = {f"tj/{k}": dict(d.placement) for k, d in jobs.items()}
    after.update({f"sd/{k}": dict(d.placement) for k, d in serving.items()})
    shrink, grow, interim = [], [], {}
    for holder in sorted(set(before) | set(after)):
        old, new = before.get(holder, {}), after.get(holder, {})
        nodes = set(old) | set(new)
        interim[holder] = {n: min(old.get(n, 0), new.get(n, 0)) for n in nodes if min(old.get(n, 0), new.get(n, 0))}
        if any(old.get(n, 0) > new.get(n, 0) for n in nodes):
            shrink.append(holder)
        if any(new.get(n, 0) > old.get(n, 0) for n in nodes):
            grow.append(holder)
    return Transition(tuple(shrink), tuple(grow), interim)
