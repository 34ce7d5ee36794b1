"""ElasticFlow (Gu et al., ASPLOS 2023) as a baseline policy, written from the paper's algorithm.

It plugs into Flotilla's trace simulator through the snapshot/decision types only: it imports nothing of
Flotilla's allocator (no admission ledger, sizes, placement or repair).

At every re-plan (an arrival, a completion, a restore's end), as the paper's scheduler does at each event:

1. **Minimum satisfactory share.** Admitted jobs are laid out in deadline order (EDF) on a profile of free
   GPUs over time. A job's share is the smallest power-of-two GPU count q (within its elasticity, where its
   throughput table still rises) such that, filling the profile *backwards from its deadline* (as late as
   possible) with, in each period, the largest power of two not above min(q, free GPUs), it completes its
   remaining iterations; those GPUs are taken out of the profile. A job whose deadline no share meets any
   more (admitted, then squeezed) is laid out as early as possible at its largest size and runs late.
2. **Admission control.** A newcomer is admitted only if every admitted job and it still get a minimum
   satisfactory share (the whole layout is redone with it, in deadline order); otherwise it is declined
   (best-effort jobs run on leftovers instead).
3. **Leftovers by marginal return.** The GPUs no share uses *now* are handed out a level at a time
   (the next power of two) to the job whose remaining running time falls most per extra GPU
   (remaining/rate(g) - remaining/rate(next)) / (next - g); a job with no GPUs comes first (its return is
   unbounded), earliest deadline first among those. Diminishing returns make the greedy stop growing a job
   once others gain more. As in Flotilla's other elastic baselines, a running job grows only if it then
   finishes sooner, restore included, once its worker set has reported a rate (ElasticFlow's own rescale
   costs a few seconds, the simulator's up to a minute). `elasticflow-sticky` also lets a running job keep
   its size first where the GPUs no share needs now allow, as Flotilla's allocator does: it wins on the
   traces with costly restores and loses on the heavy one, so the bench runs both and compares with the
   better one per trace.
4. **Buddy placement.** Sizes are powers of two; a job of up to a node's GPUs goes on one node (the one it
   fits most tightly), a larger one on whole free nodes. A job that keeps its size keeps its GPUs; if the
   rest cannot be placed around the kept jobs, everything is placed afresh, largest first (which always
   fits powers of two on 8-GPU nodes).
5. **Rescale and restart costs** are the simulator's: every change of a job's GPUs costs its `restore_s`
   (the heavy trace sets it from ElasticFlow's own overhead model, bench/heavy_trace.py). ElasticFlow does
   not plan around that cost; this version keeps one restore's time in hand when it sizes a share
   (deadline - restore_s), so that an admitted job that is resized once still makes it.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache

from flotilla.allocation.curve import ScalingCurve
from flotilla.allocation.snapshot import ClusterSnapshot, Decision, JobDecision, JobState, NodeState, Verdict


@lru_cache(maxsize=4096)
def _levels(min_gpus: int, max_gpus: int, unit: int, cap: int, curve: ScalingCurve) -> tuple[tuple[int, ...], tuple[float, ...]]:
    sizes: list[int] = []
    rates: list[float] = []
    g = 1
    while g <= min(max_gpus, cap):
        if g >= min_gpus and g % unit == 0:
            r = curve.rate(g)
            if not rates or r > rates[-1]:
                sizes.append(g)
                rates.append(r)
        g *= 2
    return tuple(sizes), tuple(rates)


def levels(job: JobState, cap: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The job's power-of-two sizes (ascending, where the rate still rises) and the rate at each."""
    return _levels(job.min_gpus, job.max_gpus, job.gpus_per_worker, cap, job.curve)


class _Profile:
    """Free GPUs as a step function: free[i] from times[i] to times[i+1] (the last to infinity)."""

    def __init__(self, now: float, gpus: int) -> None:
        self.times = [now]
        self.free = [gpus]

    def copy(self) -> "_Profile":
        other = _Profile.__new__(_Profile)
        other.times, other.free = list(self.times), list(self.free)
        return other

    def split(self, t: float) -> int:
        """Make `t` a bound (if after the start); the index of the period that starts at `t`."""
        i = bisect_right(self.times, t) - 1
        if i < 0:
            return 0
        if self.times[i] == t:
            return i
        self.times.insert(i + 1, t)
        self.free.insert(i + 1, self.free[i])
        return i + 1

    def take(self, start: float, end: float, gpus: int) -> None:
        if end <= start or gpus <= 0:
            return
        a = self.split(start)
        b = self.split(end)
        for i in range(a, b):
            self.free[i] -= gpus


def _largest(sizes: tuple[int, ...], gpus: int) -> int:
    """Index of the largest size not above `gpus` (-1 if none)."""
    return bisect_right(sizes, gpus) - 1


def _alap(profile: _Profile, sizes: tuple[int, ...], rates: tuple[float, ...], q: int, work: float,
          now: float, deadline: float) -> list[tuple[float, float, int]] | None:
    """The as-late-as-possible plan at share index q: (start, end, GPUs) pieces, or None if it cannot finish."""
    if deadline <= now:
        return None
    times, free = profile.times, profile.free
    k = bisect_right(times, deadline) - 1  # the period the deadline falls in
    pieces: list[tuple[float, float, int]] = []
    left = work
    end = deadline
    for i in range(k, -1, -1):
        start = max(times[i], now)
        if end <= start:
            end = start
            continue
        li = min(q, _largest(sizes, free[i]))
        if li >= 0:
            rate = rates[li]
            span = end - start
            if rate * span >= left:
                pieces.append((end - left / rate, end, sizes[li]))
                return pieces
            left -= rate * span
            pieces.append((start, end, sizes[li]))
        end = start
    return None


def _asap(profile: _Profile, sizes: tuple[int, ...], rates: tuple[float, ...], work: float,
          now: float) -> tuple[list[tuple[float, float, int]], float]:
    """As early as possible at the largest size that fits each period (a job that runs late)."""
    times, free = profile.times, profile.free
    pieces: list[tuple[float, float, int]] = []
    left = work
    for i in range(len(times)):
        start = max(times[i], now)
        end = times[i + 1] if i + 1 < len(times) else math.inf
        if end <= start:
            continue
        li = _largest(sizes, free[i])
        if li < 0:
            continue
        rate = rates[li]
        if end == math.inf or rate * (end - start) >= left:
            finish = start + left / rate
            pieces.append((start, finish, sizes[li]))
            return pieces, finish
        left -= rate * (end - start)
        pieces.append((start, end, sizes[li]))
    return pieces, math.inf


@dataclass
class _Share:
    q: int  # share in GPUs (0: none meets the deadline)
    now_gpus: int
    next_change: float  # the first time after now that its plan starts or changes a piece (inf: none)


def _reserve(profile: _Profile, job: JobState, now: float, cap: int) -> _Share:
    """Take the job's minimum satisfactory share out of `profile` (q = 0 when none meets its deadline; it is
    then laid out as early as possible, late)."""
    sizes, rates = levels(job, cap)
    work = job.remaining_steps
    deadline = job.deadline - job.restore_seconds
    for q in range(len(sizes)):
        if rates[q] * (deadline - now) < work:
            continue  # not even the whole time until the deadline at q suffices
        plan = _alap(profile, sizes, rates, q, work, now, deadline)
        if plan is not None:
            for a, b, g in plan:
                profile.take(a, b, g)
            return _Share(sizes[q], _at(plan, now), _next(plan, now))
    if not sizes:
        return _Share(0, 0, math.inf)
    plan, _ = _asap(profile, sizes, rates, work, now)
    for a, b, g in plan:
        profile.take(a, b, g)
    return _Share(0, _at(plan, now), _next(plan, now))


def _at(plan: list[tuple[float, float, int]], t: float) -> int:
    """GPUs the plan uses in the slot from `t` (the most it uses in it)."""
    return max((g for a, b, g in plan if a < t + SLOT and b > t), default=0)


def _next(plan: list[tuple[float, float, int]], t: float) -> float:
    """When the plan next starts a piece after the slot from `t` (the time to re-plan at)."""
    return min((a for a, _, _ in plan if a >= t + SLOT), default=math.inf)


# ElasticFlow's scheduling slot (its --scheduling_slot, 60 s): a piece of a plan that starts within the slot
# from now is given now; a later one asks for a re-plan when it starts.
SLOT = 60.0
# How often (in jobs, in deadline order) a layout keeps its profile for trials to start from.
_KEEP_EVERY = 16


def _edf(job: JobState) -> tuple[float, float, str]:
    return (job.deadline, job.submit_time, job.key)


class ElasticFlow:
    """Not a pure function of the snapshot, as ElasticFlow's scheduler is not: it re-plans once per slot
    (`SLOT`) unless a job arrived or finished (its events within a slot are one scheduling round)."""

    name = "elasticflow"
    keep_size = False

    def __init__(self) -> None:
        self._last: tuple[float, frozenset[str]] | None = None

    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        now = snapshot.now
        keys = frozenset(j.key for j in snapshot.jobs if j.remaining_steps > 0)
        if self._last is not None and now < self._last[0] + SLOT and keys == self._last[1]:
            # A restore's end or a plan's piece within the slot: keep every job as it is until the slot ends.
            kept = {j.key: JobDecision(j.key, j.verdict or Verdict.PENDING, dict(j.placement),
                                       "kept until the scheduling slot ends (elasticflow)", share=j.share)
                    for j in snapshot.jobs}
            return Decision(kept, self.name, replan_at=self._last[0] + SLOT)
        self._last = (now, keys)
        capacity = snapshot.usable_gpus
        node_gpus = max((n.total_gpus for n in snapshot.nodes), default=0)
        out: dict[str, JobDecision] = {}
        admitted: list[JobState] = []
        best_effort: list[JobState] = []
        newcomers: list[JobState] = []
        for job in snapshot.jobs:
            if job.remaining_steps == 0:
                out[job.key] = JobDecision(job.key, job.verdict or Verdict.ADMITTED, {}, "finished")
            elif job.verdict is Verdict.REJECTED:
                out[job.key] = JobDecision(job.key, Verdict.REJECTED, {}, "declined")
            elif job.verdict is Verdict.ADMITTED:
                admitted.append(job)
            elif job.verdict is Verdict.BEST_EFFORT:
                best_effort.append(job)
            else:
                newcomers.append(job)
        verdicts = {j.key: Verdict.ADMITTED for j in admitted}
        verdicts.update({j.key: Verdict.BEST_EFFORT for j in best_effort})
        admitted.sort(key=_edf)
        shares, profiles = self._layout(admitted, now, capacity)
        for job in sorted(newcomers, key=lambda j: (j.submit_time, j.key)):
            trial = self._try(admitted, shares, profiles, job, now, capacity)
            if trial is not None:
                admitted, shares, profiles = trial
                verdicts[job.key] = Verdict.ADMITTED
            elif job.best_effort:
                verdicts[job.key] = Verdict.BEST_EFFORT
                best_effort.append(job)
            else:
                out[job.key] = JobDecision(job.key, Verdict.REJECTED, {},
                                           "declined: its minimum satisfactory share does not fit beside the "
                                           "admitted jobs'")
        running = admitted + sorted(best_effort, key=_edf)
        target: dict[str, int] = {}
        left = capacity
        for job in running:  # in deadline order: a slot's shares may add up to more than an instant's
            want = shares[job.key].now_gpus if job.key in shares else 0
            sizes = levels(job, capacity)[0]
            target[job.key] = sizes[i] if want and (i := _largest(sizes, min(want, left))) >= 0 else 0
            left -= target[job.key]
        free = capacity - sum(target.values())
        for job in running if self.keep_size else []:  # a running job keeps its size where GPUs allow
            held = job.gpus
            if held > target[job.key] and held in levels(job, capacity)[0] and held - target[job.key] <= free:
                free -= held - target[job.key]
                target[job.key] = held
        self._leftovers(running, target, free, capacity)
        placements = _buddy(snapshot.nodes, node_gpus, running, target)
        for job in running:
            share = shares.get(job.key)
            gpus = sum(placements.get(job.key, {}).values())
            why = (f"minimum satisfactory share {share.q} GPUs" if share and share.q else
                   "no share meets its deadline: runs as early as it can" if share else "best-effort")
            out[job.key] = JobDecision(job.key, verdicts[job.key], placements.get(job.key, {}),
                                       f"{why}; {gpus} GPUs now (elasticflow)",
                                       guaranteed_gpus=share.now_gpus if share and share.q else 0,
                                       share=share.q if share else 0)
        wake = min((s.next_change for k, s in shares.items() if k in verdicts), default=math.inf)
        return Decision(out, self.name, replan_at=wake if wake < math.inf else None)

    @staticmethod
    def _layout(jobs: list[JobState], now: float, capacity: int) -> tuple[dict[str, _Share], dict[int, _Profile]]:
        """Reserve `jobs` (in deadline order). The profile before jobs[i] is kept for every i that is a multiple
        of `_KEEP_EVERY` (up to len(jobs) included), so that a trial replays only from the last one before it."""
        profile = _Profile(now, capacity)
        profiles: dict[int, _Profile] = {}
        shares: dict[str, _Share] = {}
        for i, job in enumerate(jobs):
            if i % _KEEP_EVERY == 0:
                profiles[i] = profile.copy()
            shares[job.key] = _reserve(profile, job, now, capacity)
        if len(jobs) % _KEEP_EVERY == 0:
            profiles[len(jobs)] = profile
        return shares, profiles

    @staticmethod
    def _try(admitted: list[JobState], shares: dict[str, _Share], profiles: dict[int, _Profile], job: JobState,
             now: float, capacity: int) -> tuple[list[JobState], dict[str, _Share], dict[int, _Profile]] | None:
        """The layout with `job` admitted, or None if it gets no share, or an admitted job that had one loses
        it. Jobs due before it keep their shares: only it and the ones after are laid out again."""
        if job.deadline <= now or not levels(job, capacity)[0]:
            return None
        order = sorted(admitted + [job], key=_edf)
        at = order.index(job)
        start = at - at % _KEEP_EVERY
        profile = profiles[start].copy()
        for before in order[start:at]:  # the same reservations as in the layout it came from
            _reserve(profile, before, now, capacity)
        new_shares = {j.key: shares[j.key] for j in order[:at]}
        new_profiles = {i: p for i, p in profiles.items() if i <= start}
        for i in range(at, len(order)):
            if i % _KEEP_EVERY == 0:
                new_profiles[i] = profile.copy()
            other = order[i]
            s = _reserve(profile, other, now, capacity)
            if not s.q and (other is job or shares[other.key].q):
                return None
            new_shares[other.key] = s
        if len(order) % _KEEP_EVERY == 0:
            new_profiles[len(order)] = profile
        return order, new_shares, new_profiles

    @staticmethod
    def _leftovers(running: list[JobState], target: dict[str, int], free: int, capacity: int) -> None:
        """Hand out `free` GPUs a power-of-two level at a time by marginal return (in place)."""
        while free > 0:
            best, best_key = None, None
            for rank, job in enumerate(running):
                sizes, rates = levels(job, capacity)
                g = target[job.key]
                i = bisect_right(sizes, g)
                if i >= len(sizes) or sizes[i] - g > free:
                    continue
                nxt = sizes[i]
                if 0 < job.gpus < nxt and not _worth_growing(job, nxt):
                    continue
                if g == 0:
                    value = (math.inf, -rank)
                else:
                    rate = rates[_largest(sizes, g)]
                    value = ((job.remaining_steps / rate - job.remaining_steps / rates[i]) / (nxt - g), -rank)
                if best is None or value > best:
                    best, best_key = value, (job.key, nxt)
            if best_key is None:
                return
            key, nxt = best_key
            free -= nxt - target[key]
            target[key] = nxt


def _worth_growing(job: JobState, size: int) -> bool:
    """The other elastic baselines' rule against churn: a running job grows only once its worker set has
    reported a rate, and only if it then finishes sooner, restore included."""
    if job.rate_unknown:
        return False
    stay = job.remaining_steps / job.curve.rate(job.gpus)
    move = job.restore_seconds + (job.remaining_steps + job.steps_since_checkpoint) / job.curve.rate(size)
    return move < stay


def _buddy(nodes: tuple[NodeState, ...], node_gpus: int, jobs: list[JobState],
           target: dict[str, int]) -> dict[str, dict[str, int]]:
    """Place each job's power-of-two target: kept where its size is unchanged, the rest best-fit, largest first;
    if that fails, everything afresh largest first (smaller jobs that still do not fit get nothing)."""
    usable = {n.name: n.usable_gpus for n in nodes if n.usable_gpus > 0}
    kept: dict[str, dict[str, int]] = {}
    for job in jobs:
        if target[job.key] and job.gpus == target[job.key] and set(job.placement) <= usable.keys():
            kept[job.key] = dict(job.placement)
    got = _place_all(usable, node_gpus, jobs, target, kept)
    if got is None:
        got = _place_all(usable, node_gpus, jobs, target, {}, partial=True)
    return got or {}


def _place_all(usable: dict[str, int], node_gpus: int, jobs: list[JobState], target: dict[str, int],
               kept: dict[str, dict[str, int]], partial: bool = False) -> dict[str, dict[str, int]] | None:
    free = dict(usable)
    for placement in kept.values():
        for n, g in placement.items():
            free[n] -= g
    out = dict(kept)
    for job in sorted((j for j in jobs if target[j.key] and j.key not in kept), key=lambda j: (-target[j.key], j.key)):
        size = target[job.key]
        if size <= node_gpus:
            fits = [n for n, f in free.items() if f >= size]
            if not fits:
                if partial:
                    continue
                return None
            n = min(fits, key=lambda n: (free[n], n))
            free[n] -= size
            out[job.key] = {n: size}
        else:
            whole = [n for n, f in free.items() if f == usable[n] == node_gpus]
            need = size // node_gpus
            if len(whole) < need:
                if partial:
                    continue
                return None
            chosen = sorted(whole)[:need]
            for n in chosen:
                free[n] = 0
            out[job.key] = {n: node_gpus for n in chosen}
    return out


class ElasticFlowSticky(ElasticFlow):
    """ElasticFlow where a running job first keeps its size where the GPUs no share needs now allow (a change
    costs a restore), as Flotilla's allocator and its other elastic baselines do; the rest as above."""

    name = "elasticflow-sticky"
    keep_size = True


BASELINES = (ElasticFlow, ElasticFlowSticky)
