"""Deadline-aware elastic allocation (ElasticFlow-style): admit, size, place.

1. Admission: admitted jobs are reserved in deadline order in a capacity
   profile over time (see admission.py); a new job is admitted only if it and
   every admitted job still get their minimum satisfactory share. Admission is
   decided once: an admitted job stays admitted, and if a lost node makes its
   deadline unreachable the reason says so and it runs on what is left.
2. Allocation: each guaranteed job gets at least its share for right now.
   A running job keeps its current size where GPUs allow (a change costs
   `restoreSeconds`). The remaining GPUs go, one block at a time, to the job
   with the highest marginal gain: extra steps/s per GPU, relative to its
   remaining steps (so a GPU shortens the job it helps most, in proportion).
   A running job grows only if the finish time at the new size, after paying
   `restoreSeconds` and redoing the steps since its last checkpoint, is earlier
   than staying as it is.
3. Placement: jobs that keep their size keep their nodes; a shrinking job
   gives back GPUs where it holds the fewest; the others are placed compactly
   (placement.place), largest first. Unschedulable nodes get nothing.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass

from flotilla.allocation.admission import CapacityProfile, Reservation
from flotilla.allocation.placement import free_gpus, place, shrink_in_place
from flotilla.allocation.sizes import fit_size, job_sizes
from flotilla.allocation.snapshot import ClusterSnapshot, Decision, JobDecision, JobState, Verdict


def _edf(job: JobState) -> tuple[float, float, str]:
    return (job.deadline, job.submit_time, job.key)


def _latest_start_deadline(job: JobState) -> float:
    # Keep one restore in hand: the job may be resized (or started) once more.
    return job.deadline - job.restore_seconds


@dataclass
class _Plan:
    job: JobState
    verdict: Verdict
    why: str
    reservation: Reservation | None = None
    current: int = 0  # GPUs it holds on nodes that are still schedulable (0 if it lost one)
    target: int = 0


class DeadlineElastic:
    """Admission by minimum satisfactory share over time; leftovers by marginal gain."""

    name = "elastic-deadline"

    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        now = snapshot.now
        capacity = snapshot.usable_gpus
        schedulable = {n.name for n in snapshot.nodes if n.schedulable}
        # GPUs each job holds on nodes that are still schedulable (0 if it lost one).
        held = {j.key: j.gpus if j.placement and set(j.placement) <= schedulable else 0 for j in snapshot.jobs}
        out: dict[str, JobDecision] = {}
        plans: dict[str, _Plan] = {}
        admitted: list[JobState] = []
        candidates: list[JobState] = []
        for job in snapshot.jobs:
            if job.remaining_steps == 0:
                out[job.key] = JobDecision(job.key, job.verdict or Verdict.ADMITTED, {}, "finished")
            elif job.verdict is Verdict.REJECTED:
                out[job.key] = JobDecision(job.key, Verdict.REJECTED, {}, "rejected at admission")
            elif job.verdict is Verdict.ADMITTED:
                admitted.append(job)
            elif job.verdict is Verdict.BEST_EFFORT:
                plans[job.key] = _Plan(job, Verdict.BEST_EFFORT, "best-effort: no deadline guarantee")
            else:
                candidates.append(job)

        ledger = _Ledger.of(now, capacity, admitted, held, snapshot.claimed)
        for job in admitted:
            if job.key in ledger.got:
                plans[job.key] = _Plan(job, Verdict.ADMITTED, "admitted")
            else:
                why = ("deadline passed" if job.deadline <= now
                       else ledger.profile.shortfall(job, _latest_start_deadline(job)).describe())
                plans[job.key] = _Plan(job, Verdict.ADMITTED,
                                       f"admitted, but its deadline can no longer be guaranteed ({why}); "
                                       f"runs on what is left")

        for job in sorted(candidates, key=lambda j: (j.submit_time, j.key)):
            outcome = _admit(ledger, job)
            if isinstance(outcome, _Ledger):
                ledger = outcome
                plans[job.key] = _Plan(job, Verdict.ADMITTED, "admitted")
            elif job.best_effort:
                plans[job.key] = _Plan(job, Verdict.BEST_EFFORT, f"best-effort, no guarantee: {outcome}")
            else:
                out[job.key] = JobDecision(job.key, Verdict.REJECTED, {}, f"rejected: {outcome}")
        for key, r in ledger.got.items():
            plans[key].reservation = r
        for p in plans.values():
            p.current = held[p.job.key]
        self._size(capacity, plans)
        out.update(self._place(snapshot, plans))
        return Decision(out, self.name)

    @staticmethod
    def _size(capacity: int, plans: dict[str, _Plan]) -> None:
        """Set each plan's target GPU count."""
        order = sorted(plans.values(), key=lambda p: _edf(p.job))
        for p in order:
            p.target = p.reservation.now_gpus if p.reservation else 0
        free = capacity - sum(p.target for p in order)
        for p in order:  # stay as it is where GPUs allow: a change costs restoreSeconds
            if p.current > p.target:
                keep = fit_size(job_sizes(p.job)[0], min(p.current, p.target + free))
                if keep > p.target:
                    free -= keep - p.target
                    p.target = keep

        heap: list[tuple[float, str, int]] = []

        def push(p: _Plan) -> None:
            step = _next_step(p)
            if step is not None:
                heapq.heappush(heap, (-step[1], p.job.key, step[0]))

        for p in order:
            push(p)
        while heap and free > 0:
            _, key, size = heapq.heappop(heap)
            p = plans[key]
            if size - p.target > free:
                continue
            free -= size - p.target
            p.target = size
            push(p)

    @staticmethod
    def _place(snapshot: ClusterSnapshot, plans: dict[str, _Plan]) -> dict[str, JobDecision]:
        kept: dict[str, dict[str, int]] = {}
        for p in plans.values():
            if p.current and p.target == p.current:
                kept[p.job.key] = dict(p.job.placement)
            elif p.current and 0 < p.target < p.current:
                kept[p.job.key] = shrink_in_place(p.job.placement, p.target, p.job.gpus_per_worker)
        free = free_gpus(snapshot.nodes, kept.values())
        placements = dict(kept)
        unplaced: dict[str, str] = {}
        fresh = sorted((p for p in plans.values() if p.target and p.job.key not in kept),
                       key=lambda p: (-p.target, _edf(p.job)))
        for p in fresh:
            sizes = job_sizes(p.job)[0]
            got, size = None, 0
            for size in [s for s in reversed(sizes) if s <= p.target]:
                got = place(size, p.job.gpus_per_worker, free, snapshot.nodes)
                if got is not None:
                    break
            if got is None:
                unplaced[p.job.key] = f"{p.target} GPUs are free but not in whole {p.job.gpus_per_worker}-GPU workers on nodes"
                continue
            if size < p.target:
                unplaced[p.job.key] = f"only {size} of {p.target} GPUs could be placed in whole workers"
            for node, g in got.items():
                free[node] -= g
            placements[p.job.key] = got

        decisions: dict[str, JobDecision] = {}
        for key, p in plans.items():
            placement = placements.get(key, {})
            decisions[key] = JobDecision(
                key, p.verdict, placement,
                _reason(p, sum(placement.values()), unplaced.get(key)),
                guaranteed_gpus=p.reservation.now_gpus if p.reservation else 0,
            )
        return decisions


class _Ledger:
    """Reservations in deadline order, in a capacity profile, that can take one more job cheaply.

    The profile is kept every CHECKPOINT_EVERY jobs, so adding a job replays
    only the jobs from just before its place in deadline order.
    """

    CHECKPOINT_EVERY = 16

    def __init__(self, now: float, capacity: int, held: dict[str, int],
                 claimed: tuple[tuple[float, int], ...] = ()) -> None:
        self.now, self.capacity, self.held, self.claimed = now, capacity, held, claimed
        self.order: list[JobState] = []
        self.keys: list[tuple[float, float, str]] = []  # _edf of each job in order, for bisect
        self.got: dict[str, Reservation] = {}
        self.checkpoints: list[CapacityProfile] = []  # [k]: the profile before order[k * CHECKPOINT_EVERY]
        self.profile = CapacityProfile(now, capacity, claimed)

    @classmethod
    def of(cls, now: float, capacity: int, jobs: list[JobState], held: dict[str, int],
           claimed: tuple[tuple[float, int], ...] = ()) -> "_Ledger":
        ledger = cls(now, capacity, held, claimed)
        ledger.order = sorted(jobs, key=_edf)
        ledger.keys = [_edf(j) for j in ledger.order]
        ledger._run(0, CapacityProfile(now, capacity, claimed))
        return ledger

    def with_job(self, job: JobState) -> "_Ledger":
        """A new ledger with `job` added in deadline order (this one is unchanged)."""
        key, position = _edf(job), self.position(job)
        k = position // self.CHECKPOINT_EVERY
        other = _Ledger(self.now, self.capacity, self.held, self.claimed)
        other.order = self.order[:position] + [job] + self.order[position:]
        other.keys = self.keys[:position] + [key] + self.keys[position:]
        other.checkpoints = self.checkpoints[:k]
        # The jobs before `start` keep their reservations; _run redoes (or drops) the rest. Copying the
        # whole dict and overwriting is C-speed, where picking the prefix out was the cost of a big queue.
        other.got = dict(self.got)
        other._run(k * self.CHECKPOINT_EVERY, self.checkpoints[k].copy())
        return other

    def position(self, job: JobState) -> int:
        return bisect.bisect_left(self.keys, _edf(job))

    def push(self, job: JobState) -> Reservation | None:
        """Reserve for `job`, whose deadline comes after every job's in the ledger, in place: no other
        reservation can change, so nothing is replayed (what `with_job` would give, at the cost of one
        reservation; the usual case when jobs arrive with deadlines a fixed time ahead). None: it does
        not fit, and the ledger is unchanged."""
        assert self.position(job) == len(self.order), "push() takes only a job that goes last in deadline order"
        profile = self.profile.copy()
        r = self._reserve(profile, job)
        if r is None:
            return None
        self.order.append(job)
        self.keys.append(_edf(job))
        self.got[job.key] = r
        self.profile = profile
        if len(self.order) % self.CHECKPOINT_EVERY == 0:
            self.checkpoints.append(profile.copy())
        return r

    def fits(self, job: JobState) -> bool:
        """Whether `job` gets a reservation at its place in deadline order (what `with_job` would give
        it), without replaying the jobs after it: a cheap test before the full one."""
        position = self.position(job)
        k = position // self.CHECKPOINT_EVERY
        profile = self.checkpoints[k].copy()
        for other in self.order[k * self.CHECKPOINT_EVERY:position]:
            self._reserve(profile, other)
        return self._reserve(profile, job) is not None

    def _reserve(self, profile: CapacityProfile, job: JobState) -> Reservation | None:
        r = profile.reserve(job, _latest_start_deadline(job))
        if r is None and self.held.get(job.key):
            # Too close to its deadline to afford a restore: it can still make it
            # if it keeps at least what it holds now.
            r = profile.reserve(job, job.deadline, keep_now=self.held[job.key])
        return r

    def _run(self, start: int, profile: CapacityProfile) -> None:
        for i in range(start, len(self.order)):
            if i % self.CHECKPOINT_EVERY == 0:
                self.checkpoints.append(profile.copy())
            job = self.order[i]
            r = self._reserve(profile, job)
            if r is not None:
                self.got[job.key] = r
            else:
                self.got.pop(job.key, None)
        if len(self.order) % self.CHECKPOINT_EVERY == 0:  # so that a job can be added at the end
            self.checkpoints.append(profile.copy())
        self.profile = profile


def _admit(ledger: _Ledger, job: JobState) -> _Ledger | str:
    """The ledger with `job` admitted (`ledger` itself, extended, when the job goes last in deadline
    order), or the reason it cannot be."""
    if job.deadline <= ledger.now:
        return f"deadline passed {ledger.now - job.deadline:.0f} s ago"
    if not job_sizes(job)[0]:
        return (f"no GPU count fits elasticity minGPUs={job.min_gpus}, maxGPUs={job.max_gpus}, "
                f"gpusPerWorker={job.gpus_per_worker}")
    position = ledger.position(job)
    if position == len(ledger.order):
        if ledger.push(job):
            return ledger
        return ledger.profile.shortfall(job, _latest_start_deadline(job)).describe()
    if not ledger.fits(job):  # most of a backlog on a busy cluster: no replay of every later job
        return ledger.profile.shortfall(job, _latest_start_deadline(job)).describe()
    trial = ledger.with_job(job)
    # Only the jobs after it in deadline order can lose their reservations.
    lost = sorted(j.key for j in trial.order[position + 1:] if j.key in ledger.got and j.key not in trial.got)
    if job.key in trial.got and not lost:
        return trial
    if job.key in trial.got:
        return f"admitting it would break the guarantee of {', '.join(lost)}"
    # Judge the job against what the others leave, without it.
    return ledger.profile.shortfall(job, _latest_start_deadline(job)).describe()


def _next_step(p: _Plan) -> tuple[int, float] | None:
    """The next size worth growing to and its gain per GPU, or None."""
    job = p.job
    sizes, rates = job_sizes(job)
    base_rate = job.curve.rate(p.target)
    remaining = job.remaining_steps
    for size, rate in zip(sizes, rates):
        if size <= p.target:
            continue
        if 0 < p.current < size and not _worth_growing(job, p.current, size):
            continue
        return size, (rate - base_rate) / (size - p.target) / remaining
    return None


def _worth_growing(job: JobState, current: int, size: int) -> bool:
    """Whether leaving `current` GPUs for `size` finishes the job sooner, cost included.

    The cost counts twice: leftover GPUs are lent, and giving them back when a
    guaranteed job needs them costs another restore.
    """
    remaining = job.remaining_steps
    stay = remaining / job.curve.rate(current)
    move = 2 * job.restore_seconds + (remaining + job.steps_since_checkpoint) / job.curve.rate(size)
    return move < stay


def _reason(p: _Plan, gpus: int, unplaced: str | None) -> str:
    parts = [p.why]
    r = p.reservation
    if r is not None:
        parts.append(f"guaranteed {r.now_gpus} GPUs now (share {r.size}) to finish by its deadline")
    if gpus == p.current:
        parts.append(f"keeps {gpus} GPUs" if gpus else "no GPUs now")
    elif p.current == 0 and p.job.gpus:
        parts.append(f"restarts on {gpus} GPUs: it lost a node")
    elif p.current == 0:
        parts.append(f"starts on {gpus} GPUs")
    elif gpus > p.current:
        parts.append(f"grows {p.current}->{gpus} GPUs: marginal gain outweighs {p.job.restore_seconds:.0f} s restore")
    else:
        parts.append(f"shrinks {p.current}->{gpus} GPUs to make room for guaranteed shares")
    if unplaced:
        parts.append(unplaced)
    return "; ".join(parts)
