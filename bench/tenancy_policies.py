"""The policies bench/tenancy.py compares, each behind the judge's Policy interface.

* flotilla: flotilla.tenancy.decide (queues with nominal shares, borrowing, reclaim by checkpointed shrinks).
* static-partition: each team only its nominal share, on nodes of its own, decided there by Flotilla's own pool
  arbiter (the deadline-aware elastic allocator): the strongest allocator, and no sharing.
* kueue: Kueue's model: a ClusterQueue per team with `nominalQuota` in one cohort, borrowing without limit,
  `reclaimWithinCohort: Any`, BestEffortFIFO by priority then creation; workloads run at the size they ask
  for; a lender takes its quota back by evicting borrowers (newest, lowest priority first), which restart
  from their last checkpoint.
* kai: KAI-Scheduler's model: a queue per team with `quota` (deserved) and `overQuotaWeight`; each queue's fair
  share is its quota plus what is idle split by weight; the queue furthest below its fair share schedules next;
  a queue under its fair share reclaims from queues above theirs by evicting their jobs (newest first) while they
  stay at or above their fair share.
kueue-sized and kai-sized: the same, with each deadline job asking for the fewest GPUs with which it meets its
deadline at its measured curve (a user who sizes every job for its deadline), instead of its requested size.
Serving in Kueue and KAI: the deployment's instances are workloads of its team at a high priority, added as its
demand rises and removed as it falls.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tenancy_judge import Allocation, Job, JobView, Trace, View, needed_gpus, partition  # noqa: E402

from flotilla.allocation import JobState, NodeState, ScalingCurve, Verdict  # noqa: E402
from flotilla.pool import PoolSnapshot, ServingState  # noqa: E402
from flotilla.pool import decide as pool_decide  # noqa: E402
from flotilla.tenancy import RESOURCE_GPU, QueueSpec, Quota  # noqa: E402
from flotilla.tenancy import decide as tenancy_decide  # noqa: E402

FAR = 30 * 86400.0  # a best-effort job's deadline for the allocator's types (it is never admitted against it)


class _Flotilla:
    """What the operator keeps between decisions: verdicts, shares, serving hold-down clocks."""

    preempts = "checkpoint"

    def __init__(self) -> None:
        self.verdict: dict[str, Verdict] = {}
        self.share: dict[str, int] = {}
        self.below: dict[str, float | None] = {}
        self.curves: dict[str, ScalingCurve] = {}

    def state(self, jv: JobView, now: float, nodes: dict[str, int] | None = None) -> JobState:
        j = jv.job
        curve = self.curves.get(j.id) or self.curves.setdefault(j.id, ScalingCurve.of(list(j.curve)))
        verdict = self.verdict.get(j.id) or (Verdict.BEST_EFFORT if j.deadline is None else None)
        placement = {n: g for n, g in jv.placement.items() if nodes is None or n in nodes}
        return JobState(key=j.id, submit_time=j.submit, deadline=j.deadline if j.deadline is not None else FAR,
                        total_steps=j.steps, done_steps=jv.done, min_gpus=j.min_gpus, max_gpus=j.max_gpus,
                        gpus_per_worker=1, curve=curve, restore_seconds=j.restore_s,
                        best_effort=j.deadline is None or j.best_effort, placement=placement, verdict=verdict,
                        checkpoint_interval_steps=j.checkpoint_every, last_checkpoint_step=jv.last_checkpoint,
                        requested_gpus=j.requested, resumes_at=jv.resumes_at, share=self.share.get(j.id, 0),
                        queue=j.team, priority=j.priority)

    def serving_state(self, sv, now: float) -> ServingState:  # type: ignore[no-untyped-def]
        s = sv.serving
        return ServingState(s.id, demand_gpus=sv.demand, min_gpus=s.min_gpus, max_gpus=s.max_gpus,
                            gpus_per_instance=s.unit, placement=dict(sv.placement), forecast=sv.forecast,
                            below_since=self.below.get(s.id), queue=s.team)

    def record(self, jobs, serving, alloc: Allocation) -> None:  # type: ignore[no-untyped-def]
        for key, d in jobs.items():
            self.verdict[key] = d.verdict
            self.share[key] = d.share
            alloc.jobs[key] = dict(d.placement)
            if d.verdict is Verdict.REJECTED:
                alloc.rejected.add(key)
        for key, sd in serving.items():
            self.below[key] = sd.below_since
            alloc.serving[key] = dict(sd.placement)


class FlotillaTeams(_Flotilla):
    name = "flotilla"

    def __init__(self, trace: Trace) -> None:
        super().__init__()
        self.queues = [QueueSpec(t.name, {RESOURCE_GPU: Quota(t.nominal)}, t.weight) for t in trace.teams]
        self.reclaims = 0
        self.victims: set[str] = set()

    def decide(self, view: View) -> Allocation:
        nodes = tuple(NodeState(n, g) for n, g in view.nodes.items())
        snap = PoolSnapshot(view.now, nodes, tuple(self.state(jv, view.now) for jv in view.jobs),
                            tuple(self.serving_state(sv, view.now) for sv in view.serving))
        d = tenancy_decide(snap, self.queues)
        self.reclaims += len(d.reclaims)
        self.victims.update(r.job for r in d.reclaims)
        alloc = Allocation({}, {})
        self.record(d.pool.jobs, d.pool.serving, alloc)
        return alloc


class StaticPartition(_Flotilla):
    name = "static-partition"

    def __init__(self, trace: Trace) -> None:
        super().__init__()
        self.nodes = partition(trace)

    def decide(self, view: View) -> Allocation:
        alloc = Allocation({}, {})
        for team, own in self.nodes.items():
            nodes = tuple(NodeState(n, g) for n, g in own.items())
            jobs = tuple(self.state(jv, view.now, own) for jv in view.jobs if jv.job.team == team)
            serving = tuple(self.serving_state(sv, view.now) for sv in view.serving if sv.serving.team == team)
            d = pool_decide(PoolSnapshot(view.now, nodes, jobs, serving))
            self.record(d.jobs, d.serving, alloc)
        return alloc


class OnePool(_Flotilla):
    """A reference, not a baseline: every team's jobs in one pool, no queues (Flotilla without tenancy: one
    implicit queue, first come first served across teams). It has no isolation at all; its deadline ratio over
    static-partition's bounds what any sharing of the same allocator gains on a trace."""

    name = "one-pool"

    def __init__(self, trace: Trace) -> None:
        super().__init__()

    def decide(self, view: View) -> Allocation:
        nodes = tuple(NodeState(n, g) for n, g in view.nodes.items())
        snap = PoolSnapshot(view.now, nodes, tuple(self.state(jv, view.now) for jv in view.jobs),
                            tuple(self.serving_state(sv, view.now) for sv in view.serving))
        d = pool_decide(snap)
        alloc = Allocation({}, {})
        self.record(d.jobs, d.serving, alloc)
        return alloc


# ---- eviction baselines ----

SERVING_PRIORITY = 1000


@dataclass
class _Workload:
    id: str  # a job id, or "<serving id>#<k>" for a serving instance
    team: str
    size: int
    priority: int
    created: float
    placement: dict[str, int]


def _place(size: int, free: dict[str, int]) -> dict[str, int] | None:
    """A gang of `size` GPUs: the single node that fits it most tightly, else the fullest-free nodes in turn."""
    fits = [n for n, g in free.items() if g >= size]
    if fits:
        n = min(fits, key=lambda n: (free[n], n))
        return {n: size}
    if sum(free.values()) < size:
        return None
    out: dict[str, int] = {}
    left = size
    for n in sorted(free, key=lambda n: (-free[n], n)):
        if left == 0:
            break
        take = min(free[n], left)
        if take:
            out[n] = take
            left -= take
    return out if left == 0 else None


def _start(w: "_Workload", got: dict[str, int], free: dict[str, int], usage: dict[str, int],
           running: list["_Workload"]) -> None:
    """A workload placed: its GPUs taken from the free ones and counted to its team."""
    w.placement = got
    for n, g in got.items():
        free[n] -= g
    usage[w.team] += w.size
    running.append(w)


class _Evicting:
    preempts = "evict"

    sized = False

    def __init__(self, trace: Trace) -> None:
        self.nominal = {t.name: t.nominal for t in trace.teams}
        self.weight = {t.name: t.weight for t in trace.teams}
        self.capacity = trace.gpus
        self.evictions = 0

    def size(self, job: Job) -> int:
        """What the user asks for: the requested size, or (`sized`) the fewest GPUs with which the job meets
        its deadline at its measured curve, within its maxGPUs (a user who sizes each job for its deadline)."""
        if not self.sized or job.deadline is None:
            return job.requested
        need = needed_gpus(job)
        return job.max_gpus if need is None else max(need, job.min_gpus)

    def workloads(self, view: View) -> tuple[list[_Workload], list[_Workload]]:
        running, pending = [], []
        for jv in view.jobs:
            w = _Workload(jv.job.id, jv.job.team, self.size(jv.job), jv.job.priority, jv.job.submit,
                          dict(jv.placement))
            (running if jv.placement else pending).append(w)
        for sv in view.serving:
            s = sv.serving
            want = max(s.min_gpus, min(s.max_gpus, sv.demand)) // s.unit
            held = [(n, g) for n, g in sorted(sv.placement.items()) for _ in range(g // s.unit)]
            for k in range(max(want, 0)):
                placement = {held[k][0]: s.unit} if k < len(held) else {}
                w = _Workload(f"{s.id}#{k}", s.team, s.unit, SERVING_PRIORITY, 0.0, placement)
                (running if placement else pending).append(w)
        return running, pending

    def allocation(self, view: View, running: list[_Workload]) -> Allocation:
        alloc = Allocation({}, {})
        for w in running:
            if "#" in w.id:
                sid = w.id.split("#")[0]
                place = alloc.serving.setdefault(sid, {})
                for n, g in w.placement.items():
                    place[n] = place.get(n, 0) + g
            else:
                alloc.jobs[w.id] = dict(w.placement)
        return alloc

    def decide(self, view: View) -> Allocation:
        running, pending = self.workloads(view)
        free = dict(view.nodes)
        for w in running:
            for n, g in w.placement.items():
                free[n] -= g
        usage = {t: 0 for t in self.nominal}
        for w in running:
            usage[w.team] += w.size
        pending.sort(key=lambda w: (-w.priority, w.created, w.id))
        self.schedule(pending, running, free, usage)
        return self.allocation(view, running)

    def schedule(self, pending: list[_Workload], running: list[_Workload], free: dict[str, int],
                 usage: dict[str, int]) -> None:
        raise NotImplementedError

    def evict(self, victims: list[_Workload], running: list[_Workload], free: dict[str, int],
              usage: dict[str, int], size: int, may_take) -> bool:  # type: ignore[no-untyped-def]
        """Evict from `victims` in order (each only if `may_take(victim)`) until `size` GPUs fit; False if not."""
        chosen: list[_Workload] = []
        trial = dict(free)
        taken = {t: 0 for t in usage}
        for v in victims:
            if _place(size, trial) is not None:
                break
            if not may_take(v, taken):
                continue
            chosen.append(v)
            taken[v.team] += v.size
            for n, g in v.placement.items():
                trial[n] += g
        if _place(size, trial) is None:
            return False
        for v in chosen:
            running.remove(v)
            usage[v.team] -= v.size
            for n, g in v.placement.items():
                free[n] += g
            v.placement = {}
            self.evictions += 1
        return True


class KueueLike(_Evicting):
    name = "kueue"

    def schedule(self, pending, running, free, usage) -> None:  # type: ignore[no-untyped-def]
        for w in pending:  # BestEffortFIFO: a head that does not fit does not block the ones behind it
            within = usage[w.team] + w.size <= self.nominal[w.team]
            got = _place(w.size, free)
            if got is None and within:
                # reclaimWithinCohort: Any -- evict workloads of queues that borrow, newest, lowest priority first.
                victims = sorted((v for v in running if v.team != w.team
                                  and usage[v.team] > self.nominal[v.team]),
                                 key=lambda v: (v.priority, -v.created, v.id))
                borrowing = {t: usage[t] - self.nominal[t] for t in usage}

                def may_take(v: _Workload, taken: dict[str, int], borrowing=borrowing) -> bool:
                    return borrowing[v.team] - taken[v.team] > 0

                if self.evict(victims, running, free, usage, w.size, may_take):
                    got = _place(w.size, free)
            if got is not None:
                _start(w, got, free, usage, running)


class KaiLike(_Evicting):
    name = "kai"

    def fair_shares(self, demand: dict[str, int]) -> dict[str, float]:
        fair = {t: float(min(self.nominal[t], demand[t])) for t in self.nominal}
        idle = self.capacity - sum(fair.values())
        hungry = {t for t in fair if demand[t] > fair[t]}
        while idle > 1e-9 and hungry:
            total_w = sum(self.weight[t] for t in hungry)
            step = {t: idle * self.weight[t] / total_w for t in hungry}
            idle = 0.0
            for t in list(hungry):
                give = min(step[t], demand[t] - fair[t])
                fair[t] += give
                idle += step[t] - give
                if demand[t] - fair[t] <= 1e-9:
                    hungry.discard(t)
        return fair

    def schedule(self, pending, running, free, usage) -> None:  # type: ignore[no-untyped-def]
        demand = dict(usage)
        for w in pending:
            demand[w.team] += w.size
        fair = self.fair_shares(demand)
        queues: dict[str, list[_Workload]] = {t: [w for w in pending if w.team == t] for t in self.nominal}
        while any(queues.values()):
            team = min((t for t in queues if queues[t]), key=lambda t: (usage[t] / max(fair[t], 1e-9), t))
            w = queues[team].pop(0)
            got = _place(w.size, free)
            if got is None and usage[team] + w.size <= fair[team] + 1e-9:
                victims = sorted((v for v in running if v.team != team and usage[v.team] > fair[v.team]),
                                 key=lambda v: (-(usage[v.team] - fair[v.team]), v.priority, -v.created, v.id))

                def may_take(v: _Workload, taken: dict[str, int]) -> bool:
                    return usage[v.team] - taken[v.team] - v.size >= fair[v.team] - 1e-9

                if self.evict(victims, running, free, usage, w.size, may_take):
                    got = _place(w.size, free)
            if got is not None:
                _start(w, got, free, usage, running)


class KueueSized(KueueLike):
    name = "kueue-sized"
    sized = True


class KaiSized(KaiLike):
    name = "kai-sized"
    sized = True


POLICIES = {"flotilla": FlotillaTeams, "static-partition": StaticPartition, "kueue": KueueLike, "kai": KaiLike,
            "kueue-sized": KueueSized, "kai-sized": KaiSized}
REFERENCES = {"one-pool": OnePool}  # run with --one-pool; never counted as a baseline
