"""Deadline-aware elastic allocation (ElasticFlow-style): admit, size, place.

1. Admission: admitted jobs are reserved in deadline order in a capacity
   profile over time (see admission.py); a new job is admitted only if it and
   every admitted job still get a reservation that ends some time before the
   deadline (`_headroom`), the others' re-planned if need
   be (`_Ledger.repair`), and a re-plan that would lose an admitted job's
   reservation is repaired the same way. Admission is
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
import math
from collections.abc import Callable
from dataclasses import dataclass

from flotilla.allocation.admission import CapacityProfile, Reservation, Taken, earliest_finish, first_share
from flotilla.allocation.placement import domains, free_gpus, place, shrink_in_place
from flotilla.allocation.sizes import fit_size, job_sizes, tiling_sizes
from flotilla.allocation.snapshot import ClusterSnapshot, Decision, JobDecision, JobState, Verdict


def _edf(job: JobState) -> tuple[float, float, str]:
    return (job.deadline, job.submit_time, job.key)


def _pause(job: JobState, now: float) -> float:
    """Seconds from `now` until the job trains again after a resize (0 if it trains now)."""
    return max(0.0, job.resumes_at - now)


# How many of its own restores' time an admission must leave every guaranteed job to spare (`_headroom`),
# and those words for reasons. Tuned on the --quick traces and three of bench/training.py's 256-GPU shape
# (seeds 21-23), none of them reported as held-out figures: 0.25 still broke a promise there, 0.5 and 1 none.
HEADROOM_RESTORES = 0.5
HEADROOM_WORDS = "half a restore's time"


def _headroom(job: JobState) -> float:
    """Seconds before its deadline by which admission keeps a guaranteed job able to finish.

    A plan is made on what is known now; the others' plans move a little at every re-plan (a share re-derived
    from their progress, a restore that ends later than planned), and a plan with no time to spare is lost to
    the first such move. Part of a restore's time of its own is kept for that: a newcomer that would leave an
    admitted job less, or have less itself, is not admitted. The guarantee itself still holds to the deadline
    (`_Ledger.tight`)."""
    return HEADROOM_RESTORES * job.restore_seconds


def _reserve_deadline(job: JobState) -> float:
    return job.deadline - _headroom(job)


def _tight_from(ledger: "_Ledger", newcomers: list[JobState]) -> bool:
    """Whether any job of `ledger` at or after the first of `newcomers` in deadline order is tight: one the
    newcomers may have squeezed (a tight job ahead of them all is reserved alike without them)."""
    if not ledger.tight or not newcomers:
        return False
    first = min(_edf(j) for j in newcomers)
    return any(_edf(j) >= first for j in ledger.order if j.key in ledger.tight)


def _plan_deadline(job: JobState, now: float) -> float:
    # For what a job that does not fit would need (Shortfall): its deadline less a restore under way.
    # Reservations count that restore on the GPUs the job holds (admission.CapacityProfile._plan).
    return job.deadline - _pause(job, now)


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
    # Derive layouts from ones already made where that is exact and replays less (`_Ledger.refloored`,
    # `_trial_from`); False: lay each out as before (for tests that compare the two).
    reuse_layouts = True

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
        most = _most_free(capacity, snapshot.claimed)
        for job in snapshot.jobs:
            if job.remaining_steps == 0:
                out[job.key] = JobDecision(job.key, job.verdict or Verdict.ADMITTED, {}, "finished")
            elif job.verdict is Verdict.REJECTED:
                out[job.key] = JobDecision(job.key, Verdict.REJECTED, {}, "rejected at admission")
            elif job.verdict is Verdict.ADMITTED and (why := _lost_for_good(job, now, most, held[job.key])):
                # No layout of the ledger could give it a reservation: it is not laid out in it at all.
                plans[job.key] = _Plan(job, Verdict.ADMITTED, f"admitted, but its deadline can no longer be met "
                                                              f"({why}); runs on what is left")
            elif job.verdict is Verdict.ADMITTED:
                admitted.append(job)
            elif job.verdict is Verdict.BEST_EFFORT:
                plans[job.key] = _Plan(job, Verdict.BEST_EFFORT, "best-effort: no deadline guarantee")
            else:
                candidates.append(job)

        admitted_keys = {j.key for j in admitted}
        candidates.sort(key=lambda j: (j.submit_time, j.key))
        eligible = [j for j in candidates if j.deadline > now and job_sizes(j)[0]]
        ledger = _Ledger.of(now, capacity, admitted + eligible, held, snapshot.claimed)
        whole: _Ledger | None = None  # that layout, where the newcomers are then tried one by one
        if all(k in ledger.got for k in admitted_keys | {j.key for j in eligible}) and not _tight_from(ledger, eligible):
            # Every guarantee holds with every newcomer admitted (the usual case): one layout of the ledger,
            # the one admitting them one by one would end with.
            for job in eligible:
                plans[job.key] = _Plan(job, Verdict.ADMITTED, "admitted")
            candidates = [j for j in candidates if j.key not in plans]
        elif eligible:
            whole = ledger
            ledger = ledger.without({j.key for j in eligible})
        promised = {j.key: j.share for j in admitted if j.share}
        if any(k not in ledger.got for k in admitted_keys):
            # Minimum shares re-derived in deadline order lost a guarantee that another plan keeps.
            ledger = ledger.repair(admitted_keys)
        if promised and any(k not in ledger.got for k in admitted_keys):
            # The shares the jobs were promised at (no smaller) give back the plan every later admission was
            # checked against.
            ledger = (ledger.refloored(promised) if self.reuse_layouts
                      else _Ledger.of(now, capacity, admitted, held, snapshot.claimed, promised))
            if any(k not in ledger.got for k in admitted_keys):
                ledger = ledger.repair(admitted_keys)
        must = {k for k in admitted_keys if k in ledger.got}
        for job in admitted:
            if job.key in ledger.got:
                plans[job.key] = _Plan(job, Verdict.ADMITTED, "admitted")
            else:
                why = ledger.profile.shortfall(job, _plan_deadline(job, ledger.now)).describe()
                plans[job.key] = _Plan(job, Verdict.ADMITTED,
                                       f"admitted, but its deadline can no longer be guaranteed ({why}); "
                                       f"runs on what is left")

        newcomers = {j.key for j in eligible}
        must |= newcomers & plans.keys()  # admitted above, all together
        waiting = [j for j in candidates if j.key in newcomers]  # in the order they are tried
        for job in candidates:
            replay = None
            if whole is not None and self.reuse_layouts and job.key in newcomers:
                # Every newcomer tried before this one was admitted: the ledger with this one too is the
                # layout of all the newcomers without the ones still waiting.
                later = waiting[waiting.index(job) + 1:]
                replay = (lambda ledger=ledger, whole=whole, job=job, later=later:
                          _trial_from(whole, ledger, job, later))
            outcome = _admit(ledger, job, must, replay)
            if isinstance(outcome, _Ledger):
                ledger = outcome
                must.add(job.key)
                plans[job.key] = _Plan(job, Verdict.ADMITTED, "admitted")
                continue
            if job.key in newcomers:
                whole = None
            if job.best_effort:
                plans[job.key] = _Plan(job, Verdict.BEST_EFFORT, f"best-effort, no guarantee: {outcome}")
            else:
                out[job.key] = JobDecision(job.key, Verdict.REJECTED, {}, f"rejected: {outcome}")
        for key, r in ledger.got.items():
            plans[key].reservation = r
        for p in plans.values():
            p.current = held[p.job.key]
        self._size(capacity, plans, max((n.total_gpus for n in snapshot.nodes), default=0), ledger.profile, now)
        out.update(self._place(snapshot, plans))
        return Decision(out, self.name)

    @staticmethod
    def _size(capacity: int, plans: dict[str, _Plan], node_gpus: int, profile: CapacityProfile,
              now: float) -> None:
        """Set each plan's target GPU count.

        GPUs beyond the guarantees are lent only where no reservation needs them for as long as the resize
        takes to pay back its restores (`_payback`): a job is not rescaled more often than its restore cost
        can pay back.
        """
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
        # An admitted job whose guarantee a lost node broke runs as soon as it can, by deadline, as large as
        # helps: before any leftover is lent for speed.
        for p in order:
            if p.verdict is Verdict.ADMITTED and p.reservation is None and free > 0:
                sizes = job_sizes(p.job)[0]
                size = fit_size(sizes, p.target + free)
                if size > p.target and (p.current == 0 or p.current == size or _worth_growing(p.job, p.current, size)
                                        or p.current > size):
                    free -= size - p.target
                    p.target = size

        heap: list[tuple[float, str, int]] = []

        def push(p: _Plan) -> None:
            step = _next_step(p, node_gpus)
            if step is not None:
                heapq.heappush(heap, (-step[1], p.job.key, step[0]))

        for p in order:
            push(p)
        reserved = sum(p.reservation.now_gpus for p in order if p.reservation)
        while heap and free > 0:
            _, key, size = heapq.heappop(heap)
            p = plans[key]
            if size - p.target > free:
                # The GPUs left do not tile a node for it: a job within one node takes what is left, in whole
                # workers; a larger one grows only by whole nodes (no job spread over part-used nodes).
                smaller = fit_size(job_sizes(p.job)[0], min(p.target + free, node_gpus))
                if smaller <= p.target or (0 < p.current < smaller and not _worth_growing(p.job, p.current, smaller)):
                    continue
                size = smaller
            lent = capacity - free - reserved  # GPUs lent so far beyond the guarantees
            if lent + size - p.target > profile.lendable(now + _payback(p.job, p.current, size)):
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
        domain_of = domains(snapshot.nodes)
        for p in fresh:
            sizes = job_sizes(p.job)[0]
            got, size = None, 0
            for size in [s for s in reversed(sizes) if s <= p.target]:
                got = place(size, p.job.gpus_per_worker, free, snapshot.nodes, domain_of)
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
                # A job that lost its guarantee keeps the share it was promised: that it was admitted is kept.
                share=p.reservation.size if p.reservation else (p.job.share if p.verdict is Verdict.ADMITTED else 0),
            )
        return decisions


# How many trial re-plans a repair may make, and how far back in deadline order it raises shares.
REPAIR_TRIES = 48
REPAIR_WINDOW = 10


class _Ledger:
    """Reservations in deadline order, in a capacity profile, that can take one more job cheaply.

    The profile is kept about every CHECKPOINT_EVERY jobs, so adding a job
    replays only the jobs from just before its place in deadline order, and a
    job whose reservation leaves every job after it as many GPUs as it could
    use is taken in without replaying those (`with_job`, `_take_in`). `floor` holds shares raised
    above the minimum by a repair (see `repair`) or promised before.
    """

    CHECKPOINT_EVERY = 16

    def __init__(self, now: float, capacity: int, held: dict[str, int],
                 claimed: tuple[tuple[float, int], ...] = (), floor: dict[str, int] | None = None) -> None:
        self.now, self.capacity, self.held, self.claimed = now, capacity, held, claimed
        self.floor: dict[str, int] = dict(floor or {})
        self.order: list[JobState] = []
        self.keys: list[tuple[float, float, str]] = []  # _edf of each job in order, for bisect
        self.got: dict[str, Reservation] = {}
        # Jobs reserved without their headroom: only to their deadline itself (`_reserve_how`).
        self.tight: set[str] = set()
        # How `_reserve` went for jobs laid out by `_run` (see `refloored`): the first try gave the
        # reservation (`direct`), or every try failed (`failed`).
        self.direct: set[str] = set()
        self.failed: set[str] = set()
        # checkpoints[c]: the profile before order[at[c]] (at[0] == 0; ascending).
        self.checkpoints: list[CapacityProfile] = []
        self.at: list[int] = []
        self.profile = CapacityProfile(now, capacity, claimed)

    @classmethod
    def of(cls, now: float, capacity: int, jobs: list[JobState], held: dict[str, int],
           claimed: tuple[tuple[float, int], ...] = (), floor: dict[str, int] | None = None) -> "_Ledger":
        ledger = cls(now, capacity, held, claimed, floor)
        ledger.order = sorted(jobs, key=_edf)
        ledger.keys = [_edf(j) for j in ledger.order]
        ledger._run(0)
        return ledger

    def _derived(self, floor: dict[str, int]) -> "_Ledger":
        other = _Ledger(self.now, self.capacity, self.held, self.claimed, floor)
        other.order, other.keys, other.got, other.tight = self.order, self.keys, dict(self.got), set(self.tight)
        other.direct, other.failed = set(self.direct), set(self.failed)
        other.checkpoints, other.at, other.profile = list(self.checkpoints), list(self.at), self.profile
        return other

    def with_job(self, job: JobState, replay: "Callable[[], _Ledger | None] | None" = None) -> "_Ledger":
        """A new ledger with `job` added in deadline order (this one is unchanged). `replay`: where the jobs
        after it must be replayed, a ledger equal to the one this would make, if it has one cheaper."""
        position = self.position(job)
        other = self._derived(self.floor)
        other.direct.discard(job.key)
        other.failed.discard(job.key)
        other.order = self.order[:position] + [job] + self.order[position:]
        other.keys = self.keys[:position] + [_edf(job)] + self.keys[position:]
        c = bisect.bisect_right(self.at, position) - 1
        profile = self.checkpoints[c].copy()
        for before in self.order[self.at[c]:position]:
            self._reserve(profile, before)
        r, _, tight = self._reserve_how(profile, job)
        if r is not None and position < len(self.order) and other._take_in(position, c, profile.last):
            other.got[job.key] = r
            if tight:
                other.tight.add(job.key)
            # The jobs after it keep their reservations, but how `_reserve` got them is not known again.
            after = {j.key for j in self.order[position:]}
            other.direct -= after
            other.failed -= after
            return other
        # It takes GPUs that a job after it counts on (or does not fit there): replay those.
        if replay is not None and (made := replay()) is not None:
            return made
        other.checkpoints, other.at = other.checkpoints[:c + 1], other.at[:c + 1]
        other._run(other.at[c])
        return other

    def _take_in(self, position: int, c: int, plan: Taken | None) -> bool:
        """Take the plan of a job just put at `position` out of every profile after it, if the last profile
        has its GPUs free with the largest size of any job after it to spare wherever it uses any. Then each
        of those jobs' profiles, which hold at least the last one's free GPUs, still has at every time as
        many GPUs as it could use, and every try `_reserve` makes for it gives what it gave: no reservation
        after it changes. (That the plan merely fits is not enough: a job after it could then find fewer
        GPUs past its own finish, where `_stay` looks, or where a search for a smaller share, or for a job
        that got none, runs on; with restores, fewer GPUs there may make a plan work that did not.)
        False, and nothing taken, if not."""
        if plan is None:
            return False
        largest = max((job_sizes(j)[0][-1] for j in self.order[position + 1:] if job_sizes(j)[0]), default=0)
        if not self.profile.fits(plan, spare=largest):
            return False
        self.profile = self.profile.copy()
        self.profile.take(plan)
        for d in range(c + 1, len(self.at)):
            self.checkpoints[d] = self.checkpoints[d].copy()
            self.checkpoints[d].take(plan)
            self.at[d] += 1
        return True

    def without(self, keys: set[str]) -> "_Ledger":
        """A new ledger of this one's jobs but `keys`: what `_Ledger.of` over the others gives, replayed only
        from the last profile kept before the first of them in deadline order (the jobs ahead of it are
        reserved alike in both)."""
        first = next((i for i, j in enumerate(self.order) if j.key in keys), len(self.order))
        other = self._derived(self.floor)
        other.order = [j for j in self.order if j.key not in keys]
        other.keys = [_edf(j) for j in other.order]
        other.got = {k: r for k, r in self.got.items() if k not in keys}
        other.tight = self.tight - keys
        other.direct -= keys
        other.failed -= keys
        c = bisect.bisect_right(self.at, first) - 1
        other.checkpoints, other.at = other.checkpoints[:c + 1], other.at[:c + 1]
        other._run(other.at[c])
        return other

    def refloored(self, floor: dict[str, int]) -> "_Ledger":
        """What `_Ledger.of` over this ledger's jobs with `floor` instead of this one's gives, replayed only from
        the last profile kept before the first job that the new floor may reserve differently (`_same_under`):
        the jobs ahead of it are reserved alike in both, on the same profile."""
        other = self._derived(dict(floor))
        other.order, other.keys = list(self.order), list(self.keys)
        c = bisect.bisect_right(self.at, self.refloor_start(floor)) - 1
        other.checkpoints, other.at = other.checkpoints[:c + 1], other.at[:c + 1]
        other._run(other.at[c])
        return other

    def refloor_start(self, floor: dict[str, int]) -> int:
        """The position of the first job that `floor` may reserve differently (`refloored`)."""
        return next((i for i, j in enumerate(self.order) if not self._same_under(j, floor.get(j.key, 0))),
                    len(self.order))

    def _same_under(self, job: JobState, at_least: int) -> bool:
        """Whether `_reserve` makes the same reservation of `job` (on the same profile) with the floor
        `at_least` as it did here. `_reserve` tries `CapacityProfile.reserve` up to three times, and each try
        is a function of the profile and its arguments; a share floor enters them only through where the
        search starts (`first_share`) and which tries are made. So: the same if the first try gave the
        reservation here and starts at the same place under the new floor; or if every try failed here and
        the new floor makes no try that was not made here."""
        old = self.floor.get(job.key, 0)
        if old == at_least:
            return True
        if job.key not in self.direct and job.key not in self.failed:
            return False
        first = first_share(job, self.now, _reserve_deadline(job), old)
        if job.key in self.direct:
            return first == first_share(job, self.now, _reserve_deadline(job), at_least)
        return self._tries(job, at_least) <= self._tries(job, old)

    def _tries(self, job: JobState, at_least: int) -> set[int | None]:
        """The `CapacityProfile.reserve` calls `_reserve` makes with the floor `at_least` if each fails, each as
        where its search starts: they differ only in their own floor, which enters only through that."""
        held = self.held.get(job.key, 0)
        deadline = _reserve_deadline(job)
        tries = {first_share(job, self.now, deadline, at_least)}
        if held > at_least:
            tries.add(first_share(job, self.now, deadline, held))
        if at_least:
            tries.add(first_share(job, self.now, deadline))
        return tries

    def raised(self, changes: dict[str, int], start: int) -> "_Ledger":
        """A new ledger with the shares in `changes` raised, replayed from position `start` on."""
        other = self._derived({**self.floor, **changes})
        c = bisect.bisect_right(self.at, start) - 1
        other.checkpoints, other.at = other.checkpoints[:c + 1], other.at[:c + 1]
        other._run(other.at[c])
        return other

    def position(self, job: JobState) -> int:
        return bisect.bisect_left(self.keys, _edf(job))

    def push(self, job: JobState) -> Reservation | None:
        """Reserve for `job`, whose deadline comes after every job's in the ledger, in place: no other
        reservation can change, so nothing is replayed (what `with_job` would give, at the cost of one
        reservation; the usual case when jobs arrive with deadlines a fixed time ahead). None: it does
        not fit with its headroom, and the ledger is unchanged."""
        assert self.position(job) == len(self.order), "push() takes only a job that goes last in deadline order"
        profile = self.profile.copy()
        r, _, tight = self._reserve_how(profile, job)
        if r is None or tight:
            return None
        self.order.append(job)
        self.keys.append(_edf(job))
        self.got[job.key] = r
        self.direct.discard(job.key)
        self.failed.discard(job.key)
        self.profile = profile
        self._checkpoint()
        return r

    def lost(self, must: set[str]) -> list[int]:
        """Positions of the jobs in `must` that have no reservation."""
        return [i for i, j in enumerate(self.order) if j.key in must and j.key not in self.got]

    def repair(self, must: set[str], tries: int = REPAIR_TRIES) -> "_Ledger":
        """A ledger where as many jobs of `must` as it can find keep a reservation.

        Reserving each job at its minimum share in deadline order is greedy: a
        job that takes fewer GPUs holds them longer, and a later job may then
        not fit although another plan would hold both (the plan made at the
        last re-plan, for one). For the first job of `must` that lost its
        reservation, raise the share of one earlier job (the latest first) one
        size, or of all of them together, so that they finish sooner; keep a
        change only if no job of `must` before it loses its reservation and it
        gets one. A job no change can fit stays without one.
        """
        ledger, given_up = self, set()
        while tries > 0:
            lost = [i for i in ledger.lost(must) if ledger.order[i].key not in given_up]
            if not lost:
                return ledger
            i = lost[0]
            target = ledger.order[i].key
            window = [k for k in range(i - 1, max(-1, i - 1 - REPAIR_WINDOW), -1)
                      if ledger.order[k].key in ledger.got]
            options: list[dict[str, int]] = []
            for k in window:
                bigger = _next_size(ledger.order[k], ledger.got[ledger.order[k].key].size)
                if bigger:
                    options.append({ledger.order[k].key: bigger})
            # Running jobs ahead of it kept as they are (a re-derived smaller share holds GPUs longer).
            keep = {ledger.order[k].key: ledger.held[ledger.order[k].key] for k in window
                    if ledger.held.get(ledger.order[k].key, 0) > ledger.got[ledger.order[k].key].size}
            if keep:
                options.insert(0, keep)
            together = {ledger.order[k].key: b for k in window
                        if (b := _next_size(ledger.order[k], ledger.got[ledger.order[k].key].size))}
            if len(together) > 1:
                options.append(together)
            fixed = None
            for change in options:
                tries -= 1
                start = min(k for k in window if ledger.order[k].key in change)
                trial = ledger.raised(change, start)
                kept = all(trial.order[m].key in trial.got for m in range(i + 1) if trial.order[m].key in must
                           and trial.order[m].key not in given_up)
                if kept:
                    fixed = trial
                    break
                if tries <= 0:
                    break
            if fixed is None:
                given_up.add(target)
            else:
                ledger = fixed
        return ledger

    def _reserve(self, profile: CapacityProfile, job: JobState) -> Reservation | None:
        return self._reserve_how(profile, job)[0]

    def _reserve_how(self, profile: CapacityProfile, job: JobState) -> tuple[Reservation | None, bool, bool]:
        """The job's reservation (None if none); whether the first try gave it; and whether it is tight:
        no try could keep its headroom (`_headroom`), and it is reserved to its deadline itself."""
        at_least, held = self.floor.get(job.key, 0), self.held.get(job.key, 0)
        pause = _pause(job, self.now)
        deadline = _reserve_deadline(job)
        r = profile.reserve(job, deadline, at_least=at_least, current=held, pause=pause)
        if r is not None:
            return r, True, False
        if held > at_least:
            # Each resize costs a restore, so a share that is not enough at the smallest size that works
            # without them may be enough at the size it holds now (no resize): try from there.
            r = profile.reserve(job, deadline, at_least=held, current=held, pause=pause)
        if r is None and at_least:
            # Restores make a larger share not always better (a share that follows the free GPUs up and
            # down pays more of them): a smaller one may still work.
            r = profile.reserve(job, deadline, current=held, pause=pause)
        if r is not None or job.deadline <= self.now:
            return r, False, False
        # An admitted job keeps its guarantee to its deadline itself when the others leave it no headroom (no
        # admission may cause this: `_admit`). Progress is read in whole steps: a job that has started may be
        # up to a step further along than read, so its plan may end a step's time past the deadline.
        r = profile.reserve(job, job.deadline, current=held, pause=pause, grace_steps=1 if job.done_steps else 0)
        return r, False, r is not None

    def _checkpoint(self) -> None:
        """Keep the profile as it is now, before the next job, if the last kept one is far enough back."""
        if not self.at or len(self.order) - self.at[-1] >= self.CHECKPOINT_EVERY:
            self.checkpoints.append(self.profile.copy())
            self.at.append(len(self.order))

    def _run(self, start: int) -> None:
        """Reserve order[start:] afresh from the checkpoint kept before order[start] (the last one kept)."""
        profile = self.checkpoints[-1].copy() if self.checkpoints else CapacityProfile(self.now, self.capacity,
                                                                                         self.claimed)
        if not self.checkpoints:
            self.checkpoints, self.at = [profile.copy()], [0]
        last = self.at[-1]
        assert last == start, "replays start at the last checkpoint kept"
        for i in range(start, len(self.order)):
            if i - last >= self.CHECKPOINT_EVERY:
                self.checkpoints.append(profile.copy())
                self.at.append(i)
                last = i
            job = self.order[i]
            self.tight.discard(job.key)
            self.direct.discard(job.key)
            self.failed.discard(job.key)
            r, direct, tight = self._reserve_how(profile, job)
            if direct:
                self.direct.add(job.key)
            elif r is None or tight:
                self.failed.add(job.key)  # every try with its headroom failed
            if tight:
                self.tight.add(job.key)
            if r is not None:
                self.got[job.key] = r
            else:
                self.got.pop(job.key, None)
        self.profile = profile
        self._checkpoint()  # so that a job can be added at the end cheaply


def _most_free(capacity: int, claimed: tuple[tuple[float, int], ...]) -> int:
    """The most GPUs a profile of `capacity` with `claimed` ever has free (a claim may give GPUs back)."""
    return capacity - min(0, min((g for _, g in claimed), default=0))


def _lost_for_good(job: JobState, now: float, gpus: int, held: int) -> str | None:
    """Why no layout of the ledger can give the admitted `job` a reservation (None: one might): not even
    alone on the most GPUs the cluster has free (`gpus`) from now on, with the step of grace `_Ledger._run`
    allows, could it finish by its deadline."""
    if job.deadline <= now:
        return f"deadline passed {now - job.deadline:.0f} s ago"
    grace = 1 if job.done_steps else 0
    finish = earliest_finish(job, now, gpus, held, _pause(job, now), grace)
    if finish <= job.deadline + _EDGE:
        return None
    if finish == float("inf"):
        return f"no size of it fits the cluster's {gpus} GPUs"
    late = math.ceil(finish - job.deadline)
    return f"even alone on all {gpus} GPUs it would finish {late} s after it, restores counted"


# Seconds of rounding that `_lost_for_good` allows for: it must not give up a guarantee `reserve` would keep.
_EDGE = 1e-3


def _next_size(job: JobState, size: int) -> int:
    """The job's next allowed size above `size` (0 if none)."""
    sizes = job_sizes(job)[0]
    i = bisect.bisect_right(sizes, size)
    return sizes[i] if i < len(sizes) else 0


def _trial_from(whole: _Ledger, ledger: _Ledger, job: JobState, later: list[JobState]) -> _Ledger | None:
    """`ledger.with_job(job)` made from `whole`, a layout of `ledger`'s jobs, `job` and `later` (that a
    ledger with another floor: `ledger`'s, as repairs and promised shares left it), or None where that would
    replay more jobs than `with_job` does. Both equal `_Ledger.of` over those jobs with `ledger`'s floor:
    `without` and `refloored` replay only what differs."""
    first_later = min((whole.position(j) for j in later), default=len(whole.order))
    start = min(first_later, whole.refloor_start(ledger.floor))
    if len(whole.order) - start >= len(ledger.order) - ledger.position(job):
        return None
    derived = whole.without({j.key for j in later}) if later else whole
    return derived.refloored(ledger.floor)


def _admit(ledger: _Ledger, job: JobState, must: set[str],
           replay: Callable[[], _Ledger | None] | None = None) -> _Ledger | str:
    """The ledger with `job` admitted (`ledger` itself, extended, when the job goes last in deadline
    order and fits as it is), or the reason it cannot be. `must`: the jobs whose guarantees hold now.
    `replay`: see `_Ledger.with_job`."""
    if job.deadline <= ledger.now:
        return f"deadline passed {ledger.now - job.deadline:.0f} s ago"
    if not job_sizes(job)[0]:
        return (f"no GPU count fits elasticity minGPUs={job.min_gpus}, maxGPUs={job.max_gpus}, "
                f"gpusPerWorker={job.gpus_per_worker}")
    position = ledger.position(job)
    if position == len(ledger.order) and ledger.push(job):
        return ledger
    trial = ledger.with_job(job, replay)
    judged = must | {job.key}  # tight in a trial where they were not: squeezed by it, or itself short
    if job.key in trial.got and all(k in trial.got for k in must) and trial.tight & judged <= ledger.tight:
        return trial
    # It does not fit as the others are reserved: re-plan their reservations (keep running jobs as they
    # are, raise earlier jobs' shares so that they finish sooner) and admit it if every guarantee and its
    # own then hold.
    packed = trial.repair(must | {job.key})
    if all(k in packed.got for k in judged) and packed.tight & judged <= ledger.tight:
        return packed
    if job.key in trial.got:
        lost = sorted(k for k in must if k not in trial.got)
        if lost:
            return f"admitting it would break the guarantee of {', '.join(lost)}"
        squeezed = sorted(k for k in must if k in trial.tight - ledger.tight)
        if squeezed:
            return (f"admitting it would put the guarantee of {', '.join(squeezed)} at risk: less than "
                    f"{HEADROOM_WORDS} to spare before the deadline")
        return (f"it could finish only within {_headroom(job):.0f} s of its deadline ({HEADROOM_WORDS}), "
                f"which admission keeps in hand for every guaranteed job")
    # Judge the job against what the others leave, without it.
    return ledger.profile.shortfall(job, _plan_deadline(job, ledger.now)).describe()


def _next_step(p: _Plan, node_gpus: int) -> tuple[int, float] | None:
    """The next size worth growing to (one that tiles nodes) and its gain per GPU, or None."""
    job = p.job
    base_rate = job.curve.rate(p.target)
    remaining = job.remaining_steps
    for size in tiling_sizes(job, node_gpus):
        if size <= p.target:
            continue
        if 0 < p.current < size and not _worth_growing(job, p.current, size):
            continue
        return size, (job.curve.rate(size) - base_rate) / (size - p.target) / remaining
    return None


def _payback(job: JobState, current: int, size: int) -> float:
    """How long a job moved from `current` GPUs to `size` must keep them for the move to pay back its restore
    and the one it pays when it gives them back: 2 restores' worth of steps at the gain in rate (a first
    start restores nothing going up)."""
    restores = 2 if current or job.done_steps else 1
    if not current:
        return restores * job.restore_seconds
    gain = job.curve.rate(size) - job.curve.rate(current)
    return restores * job.restore_seconds * job.curve.rate(size) / gain if gain > 0 else float("inf")


def _worth_growing(job: JobState, current: int, size: int) -> bool:
    """Whether leaving `current` GPUs for `size` finishes the job sooner, cost included.

    The cost counts twice: leftover GPUs are lent, and giving them back when a
    guaranteed job needs them costs another restore. A job whose worker set has not reported a rate is not
    moved: the rate the move is judged on may be the declared curve's, far from what the job does.
    """
    if job.rate_unknown:
        return False
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
    elif gpus > p.current and p.current < p.job.min_gpus:
        parts.append(f"grows {p.current}->{gpus} GPUs: spec.elasticity.minGPUs is now {p.job.min_gpus}")
    elif gpus > p.current:
        parts.append(f"grows {p.current}->{gpus} GPUs: marginal gain outweighs {p.job.restore_seconds:.0f} s restore")
    elif p.current > p.job.max_gpus:
        parts.append(f"shrinks {p.current}->{gpus} GPUs: spec.elasticity.maxGPUs is now {p.job.max_gpus}")
    else:
        parts.append(f"shrinks {p.current}->{gpus} GPUs to make room for guaranteed shares")
    if unplaced:
        parts.append(unplaced)
    return "; ".join(parts)
