"""Admission control over time: minimum satisfactory shares in a capacity profile.

The cluster's future is a piecewise-constant profile of GPUs not yet promised.
Jobs are reserved in deadline order. A job's minimum satisfactory share is the
smallest size x such that running at min(x, free GPUs) in each segment of the
profile finishes its remaining steps by its deadline; the GPUs it uses are
taken out of the profile until it would finish, so a later-deadline job can
count on the GPUs that earlier jobs give back (ElasticFlow's idea).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from flotilla.allocation.sizes import job_sizes
from flotilla.allocation.snapshot import JobState


@dataclass(frozen=True)
class Reservation:
    size: int  # the share x
    now_gpus: int  # GPUs it uses in the first segment: its guarantee right now


@dataclass(frozen=True)
class Shortfall:
    """Why a job cannot be guaranteed: what it would take instead."""

    gpus_needed: int | None  # constant GPUs from now that would make it, on an empty cluster; None if none
    best_finish: float  # earliest finish with up to maxGPUs from what is not promised (inf if never)
    deadline: float  # the deadline it was judged against (its own, less one restore)

    def describe(self) -> str:
        if self.gpus_needed is None:
            need = "more than its maxGPUs"
        else:
            need = f"{self.gpus_needed} GPUs from now until its deadline"
        if self.best_finish == float("inf"):
            more = "no GPUs it can use are ever free of other guarantees"
        else:
            late = math.ceil(self.best_finish - self.deadline)
            more = f"with what is not promised to others it would finish {late} s after its deadline (restores counted)"
        return f"needs {need}; {more}"




def first_share(job: JobState, now: float, deadline: float, at_least: int = 0, grace_steps: int = 0) -> int | None:
    """The index in the job's sizes where `CapacityProfile.reserve` starts its search (None: it reserves
    nothing, whatever the profile). It depends on the profile only through `now`."""
    sizes, rates = job_sizes(job)
    if not sizes or job.remaining_steps <= 0 or deadline <= now:
        return None
    # No constant share below the one it needs on an empty cluster can work.
    need_rate = max(0, job.remaining_steps - grace_steps) / (deadline - now)
    first = bisect_left(rates, need_rate - 1e-12)  # rates rise with the size (job_sizes)
    first = max(first, bisect_left(sizes, at_least))
    return first if first < len(sizes) else None


def earliest_finish(job: JobState, now: float, gpus: int, current: int = 0, pause: float = 0.0,
                    grace_steps: int = 0) -> float:
    """A bound: no plan `CapacityProfile.reserve` makes for `job` on a profile from `now` with at most `gpus`
    GPUs free at any time finishes earlier than this, less `grace_steps` steps' time at its share's rate
    (inf: none can finish).

    The job is taken alone on all `gpus`, at the fastest size that fits, from now on. A plan pays a restore
    on any size but the `current` one it holds (a job's first start pays none), or keeps `current` and
    pays what is left of `pause`; it never trains faster than its fastest size."""
    sizes, rates = job_sizes(job)
    work = max(0, job.remaining_steps - grace_steps)
    fitting = bisect_left(sizes, gpus + 1)
    best = math.inf
    if fitting:
        restore = job.restore_seconds if current or job.done_steps else 0.0
        best = now + restore + work / rates[fitting - 1]
    if current in sizes:
        best = min(best, now + pause + work / rates[sizes.index(current)])
    return best


@dataclass(frozen=True)
class Taken:
    """A reservation's GPUs over time: `shares[i]` from `starts[i]` on, until `finish`."""

    starts: np.ndarray
    shares: np.ndarray
    finish: float


@lru_cache(maxsize=4096)
def _tables(sizes: tuple[int, ...], rates: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sizes and rates with a leading 0 (no GPUs, no progress), as arrays, and for each GPU count up to the
    largest size the index of the largest size not above it."""
    sizes0 = np.array((0,) + sizes)
    return sizes0, np.array((0.0,) + rates), np.searchsorted(sizes0, np.arange(sizes0[-1] + 1), side="right") - 1


def _stay(idx: np.ndarray, rates0: np.ndarray, starts: np.ndarray, until: float, restore: float,
          held: int) -> np.ndarray:
    """`idx` (size index per segment), with the job kept at the size it holds (index `held`) instead of a
    first step up that cannot pay back its restore before the plan's next change. Growing a few GPUs for
    a short while costs more than it gives; and a plan that did so would be made worse, not better, by a
    job ahead finishing sooner than planned (a short segment of a little more)."""
    if not held or idx[0] <= held:
        return idx
    changes = np.flatnonzero(idx[1:] != idx[0])
    stop = int(changes[0]) + 1 if len(changes) else len(idx)
    kept = (min(starts[stop], until) if stop < len(idx) else until) - starts[0]
    if rates0[idx[0]] * (kept - restore) > rates0[held] * kept:
        return idx
    idx = idx.copy()
    idx[:stop] = held
    return idx


def _carry_over(lost: np.ndarray, lens: np.ndarray, restores: np.ndarray) -> None:
    """A restore longer than its segment runs on into the next ones (until a segment with a restore of its
    own): add what is left of it to the next segment's time lost, in place. Walks only the segments where
    a restore runs over (a profile with a segment per reservation has many shorter than a restore)."""
    done = -1
    for i in np.flatnonzero(lost[:-1] > lens[:-1]).tolist():
        if i <= done:
            continue
        last = len(lost) - 1
        while i < last and lost[i] > lens[i] and not restores[i + 1]:
            lost[i + 1] += lost[i] - lens[i]
            i += 1
        done = i


class CapacityProfile:
    """Free (not yet promised) GPUs as a step function of time from `now`.

    `claimed` takes GPUs out of `capacity` from each given time on (see ClusterSnapshot.claimed).
    """

    def __init__(self, now: float, capacity: int, claimed: tuple[tuple[float, int], ...] = ()) -> None:
        steps = sorted(claimed)
        later = [(t, g) for t, g in steps if t > now]
        # Segment k covers [bounds[k], bounds[k+1]); arrays have spare room at the end.
        room = max(64, 2 * len(later) + 8)
        self._bounds = np.full(room, np.inf)
        self._free = np.zeros(room, dtype=np.int64)
        self._bounds[0] = now
        self._free[0] = capacity - next((g for t, g in reversed(steps) if t <= now), 0)
        for k, (t, g) in enumerate(later, start=1):
            self._bounds[k] = t
            self._free[k] = capacity - g
        self._free = np.maximum(self._free, 0)
        self._segments = 1 + len(later)
        self._claims = (np.array([t for t, _ in steps], dtype=float), np.array([g for _, g in steps], dtype=np.int64))
        self._lowest: np.ndarray | None = None  # the fewest free GPUs from now to each segment (made when asked)
        self.last: Taken | None = None  # what the last successful `reserve` took

    @property
    def bounds(self) -> np.ndarray:
        return self._bounds[: self._segments + 1]

    def copy(self) -> "CapacityProfile":
        other = CapacityProfile.__new__(CapacityProfile)
        other._bounds, other._free, other._segments = self._bounds.copy(), self._free.copy(), self._segments
        other._claims, other.last, other._lowest = self._claims, None, self._lowest
        return other

    def fits(self, plan: Taken, spare: int = 0) -> bool:
        """Whether `plan`'s GPUs are free here at every time it uses them, with `spare` more left wherever it
        uses any (its starts must be bounds here)."""
        k = int(np.searchsorted(self.bounds, plan.finish, side="left"))
        shares = plan.shares[np.searchsorted(plan.starts, self._bounds[:k], side="right") - 1]
        return bool(np.all(self._free[:k] >= shares + np.where(shares > 0, spare, 0)))

    def take(self, plan: Taken) -> None:
        """Take `plan`'s GPUs out of this profile (see `fits`)."""
        self._split(plan.finish)
        self._lowest = None
        k = int(np.searchsorted(self.bounds, plan.finish, side="left"))
        self._free[:k] -= plan.shares[np.searchsorted(plan.starts, self._bounds[:k], side="right") - 1]

    def lendable(self, until: float) -> int:
        """The fewest GPUs that no reservation needs at any time from now until `until`. Others' claims
        (`claimed`) are not taken out: what serving will take it borrows back (flotilla.pool)."""
        k = max(1, int(np.searchsorted(self.bounds, until, side="left")))
        free = self._free[:k]
        times, gpus = self._claims
        if len(times):
            i = times.searchsorted(self._bounds[:k], side="right") - 1
            free = free + np.where(i >= 0, gpus[np.maximum(i, 0)], 0)
        return int(free.min())

    def _plan(self, job: JobState, x: int, until: float, current: int = 0,
              pause: float = 0.0) -> tuple[np.ndarray, float] | None:
        """Shares per segment and the finish time at cap x, or None if not done by `until`.

        Every change of the job's size to a non-zero share along the plan costs it `restoreSeconds` (and
        so does the first segment, when it differs from the `current` GPUs of a job that has started; a
        job's first start costs nothing): it trains nothing for that long at the start of the segment,
        and holds its GPUs meanwhile. `pause`: seconds left of a restore under way (it counts only while
        the job keeps its `current` GPUs; a new size starts a new restore).

        The profile has a segment per reservation, and the job's finish is often far before `until`: the
        plan is first worked out over the segments up to a little past the earliest it could finish (at
        x GPUs throughout, nothing lost to restores), and over all of them only if it does not finish
        there (what comes after its finish does not change the plan).
        """
        tables = _tables(*job_sizes(job))
        sizes0, rates0, index = tables
        bounds = self._bounds[: self._segments + 1]
        k = int(bounds.searchsorted(until, side="left"))
        if not k:
            return None
        applies, flat = self._plan_flat(job, tables, x, until, k, current, pause)
        if applies:
            return flat
        end = k
        if until != float("inf") and not (current and job.restore_seconds > 0
                                          and index[min(self._free[0], x)] > index[min(current, len(index) - 1)]):
            # (A running job that may be kept at its size is planned over all of them: `_stay` looks
            # for the plan's next change.)
            earliest = bounds[0] + job.remaining_steps / rates0[index[min(x, len(index) - 1)]]
            first = int(bounds.searchsorted(earliest, side="right"))
            end = min(k, first + max(16, first // 4))
        plan = self._plan_stepped(job, tables, x, until, end, current, pause)
        if plan is None and end < k:
            plan = self._plan_stepped(job, tables, x, until, k, current, pause)
        return plan

    def _plan_flat(self, job: JobState, tables: tuple[np.ndarray, np.ndarray, np.ndarray], x: int, until: float,
                   k: int, current: int, pause: float) -> tuple[bool, tuple[np.ndarray, float] | None]:
        """The plan of a job that gets all x GPUs from the first segment where it can get any until it
        finishes (most plans at scale: it starts now, or waits for GPUs to be given back), in a few passes
        over the segments at most instead of twenty: it pays at most one restore (on starting, or the one
        under way) and finishes at its start + that restore + remaining steps / rate. (False, None) where
        that does not hold within the first k segments, or where `_stay` might keep the job at the size it
        holds: then `_plan_stepped` works it out. (True, None): it cannot finish by `until` (a plan with
        fewer GPUs somewhere or more restores cannot either)."""
        free = self._free
        sizes0, rates0, index = tables
        if free[0] >= x:
            a = 0
        elif free[0] >= sizes0[1]:
            return False, None  # a smaller share now
        else:
            usable = free[:k] >= sizes0[1]
            a = int(usable.argmax())
            if not usable[a]:
                return True, None  # no GPUs it can use before `until`
            if free[a] < x:
                return False, None
        xi = int(index[x])
        rate = float(rates0[xi])
        restore = job.restore_seconds
        if rate <= 0 or (not a and restore > 0 and current
                         and sizes0[held := int(index[min(current, len(index) - 1)])] == current and xi > held):
            return False, None
        share = int(sizes0[xi])
        if restore > 0 and (current or job.done_steps) and share != (current if not a else 0):
            lost = restore  # on entering the share (a job's first start restores nothing)
        else:
            lost = pause if not a else 0.0  # the restore under way runs on the GPUs it keeps
        bounds = self._bounds
        finish = float(bounds[a]) + lost + job.remaining_steps / rate
        if finish > until:
            return True, None
        j = int(bounds[: self._segments + 1].searchsorted(finish, side="left")) - 1  # the segment it ends in
        if j >= k:
            return False, None
        if not a:
            if self._lowest is None:
                self._lowest = np.minimum.accumulate(free[: self._segments])
            if self._lowest[j] < x:
                return False, None
        elif free[a : j + 1].min() < x:
            return False, None
        shares = np.full(j + 1, share, dtype=sizes0.dtype)
        shares[:a] = 0
        return True, (shares, finish)

    def _plan_stepped(self, job: JobState, tables: tuple[np.ndarray, np.ndarray, np.ndarray], x: int,
                      until: float, k: int, current: int, pause: float) -> tuple[np.ndarray, float] | None:
        """`_plan` over the first k segments in general: a share per segment, restores wherever it changes."""
        sizes0, rates0, index = tables
        starts = self._bounds[: k + 1]
        idx = index[np.minimum(self._free[:k], x)]
        lens = starts[1:] - starts[:-1]  # every bound before `until` is below it: only the last segment is cut
        if starts[k] > until:
            lens[-1] = until - starts[k - 1]
        if job.restore_seconds > 0 and current:
            held = int(index[min(current, len(index) - 1)])
            if sizes0[held] == current:
                idx = _stay(idx, rates0, starts, until, job.restore_seconds, held)
        r = rates0[idx]
        shares = sizes0[idx]
        lost: np.ndarray | None = None
        restores = np.zeros(k, dtype=bool)
        if job.restore_seconds > 0:
            # A restore is paid on entering a new non-zero share, at the start of that segment: a job
            # stopped trains nothing anyway while its restore runs down, and a job's first start
            # restores nothing.
            np.not_equal(shares[1:], shares[:-1], out=restores[1:])
            restores[1:] &= shares[1:] > 0
            if current or job.done_steps:
                restores[0] = shares[0] != current and shares[0] > 0
            else:
                restores[int(np.argmax(shares > 0))] = False
            lost = restores * job.restore_seconds
        if pause > 0 and shares[0] > 0 and not restores[0]:
            if lost is None:
                lost = np.zeros(k)
            lost[0] = pause  # the restore under way, on the GPUs it keeps
        if lost is not None:
            _carry_over(lost, lens, restores)
            useful = lens - lost
            np.maximum(useful, 0.0, out=useful)
        else:
            useful = lens
        if until == float("inf"):
            useful[r == 0] = 0.0  # an unused segment that never ends adds 0, not 0 * inf
        useful *= r
        work = useful.cumsum()
        remaining = job.remaining_steps
        if not len(work) or work[-1] < remaining - 1e-9:
            return None
        j = int(work.searchsorted(remaining - 1e-9))
        before = work[j - 1] if j else 0.0
        finish = float(starts[j] + (lost[j] if lost is not None else 0.0) + (remaining - before) / r[j])
        if finish > until:
            return None
        shares = sizes0[idx[: j + 1]]
        return shares, finish

    def reserve(self, job: JobState, deadline: float, at_least: int = 0, current: int = 0,
                pause: float = 0.0, grace_steps: int = 0) -> Reservation | None:
        """Reserve the job's minimum satisfactory share to finish by `deadline`; None if it cannot.

        With `at_least`, the share is no smaller than that (a re-plan that
        needs the job to finish sooner, so that a later job still fits).
        `current`: the GPUs it holds now (each resize along the plan costs a restore); `pause`: seconds
        left of a restore under way. `grace_steps`: the plan may end that many steps' time (at the share's
        rate) past `deadline` (progress is read in whole steps: a job may be up to one step further along
        than its `done_steps`).
        """
        self.last = None
        sizes, rates = job_sizes(job)
        first = first_share(job, float(self._bounds[0]), deadline, at_least, grace_steps)
        if first is None:
            return None

        def works(i: int) -> tuple[np.ndarray, float] | None:
            return self._plan(job, sizes[i], deadline + grace_steps / rates[i], current, pause)

        # A larger cap never gives a segment fewer GPUs, so feasibility is monotone in the share. The answer
        # is most often at or just above `first`: gallop up from it, then halve.
        lo, step, best, hi = first, 1, None, len(sizes) - 1
        probe = first
        while True:
            best = works(probe)
            if best is not None:
                hi = probe
                break
            if probe == len(sizes) - 1:
                return None
            lo = probe + 1
            probe = min(probe + step, len(sizes) - 1)
            step *= 2
        while lo < hi:
            mid = (lo + hi) // 2
            plan = works(mid)
            if plan is None:
                lo = mid + 1
            else:
                hi, best = mid, plan
        # Feasibility is monotone in the share except at the size the job holds now: any other share pays a
        # restore at once, so a share the search stepped over may work there when the next ones up do not.
        held = bisect_left(sizes, current) if current else len(sizes)
        if first <= held < hi and sizes[held] == current:
            plan = works(held)
            if plan is not None:
                hi, best = held, plan
        shares, finish = best
        self._take(shares, finish)
        return Reservation(sizes[hi], int(shares[0]))

    def shortfall(self, job: JobState, deadline: float) -> Shortfall:
        """What a job that cannot be reserved would need (does not change the profile)."""
        sizes, rates = job_sizes(job)
        now = float(self._bounds[0])
        gpus_needed = None
        if sizes and deadline > now:
            need_rate = job.remaining_steps / (deadline - now)
            gpus_needed = next((g for g, r in zip(sizes, rates) if r >= need_rate - 1e-12), None)
        best = float("inf")
        if sizes:
            plan = self._plan(job, sizes[-1], float("inf"))
            if plan is not None:
                best = plan[1]
        return Shortfall(gpus_needed, best, deadline)

    def _take(self, shares: np.ndarray, finish: float) -> None:
        n = len(shares)
        self.last = Taken(self._bounds[:n].copy(), shares.copy(), finish)
        self._split(finish)
        self._lowest = None
        self._free[:n] -= shares

    def _split(self, t: float) -> None:
        """Make `t` a bound: split the segment it falls inside."""
        n = int(np.searchsorted(self._bounds[: self._segments + 1], t, side="right"))  # bounds[n-1] <= t
        if n > self._segments or self._bounds[n - 1] == t:
            return
        if self._segments + 2 > len(self._bounds):
            self._bounds = np.concatenate([self._bounds, np.full(len(self._bounds), np.inf)])
            self._free = np.concatenate([self._free, np.zeros(len(self._free), dtype=np.int64)])
        end = self._segments
        self._bounds[n + 1 : end + 2] = self._bounds[n : end + 1].copy()
        self._bounds[n] = t
        self._free[n : end + 1] = self._free[n - 1 : end].copy()
        self._segments += 1
        self._lowest = None
