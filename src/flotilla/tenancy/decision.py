"""Teams share one pool: `decide(snapshot, queues, policy)`, pure, composed of the allocator and the pool arbiter.

1. Guarantees out of each queue's nominal share. For every queue, the elastic allocator's admission runs over the
   queue's own jobs with everything but the queue's nominal (less its serving's forecast) claimed by others
   (ClusterSnapshot.claimed): a ledger per queue. A job is admitted, and its guaranteed share sized, only out of its
   own queue's nominal; what it borrows carries no guarantee.
2. Budgets. Each queue may hold its nominal as far as its jobs and deployments want it; idle GPUs (others' unused
   nominal, within lending limits) go to the queues that want more by weight, within borrowing limits, down the
   queue tree (shares.split_tree). Borrowed GPUs are taken back only to give a queue its nominal (shares.settle).
3. Reclaim. A queue holding more than it may now gives GPUs back: its training jobs shrink, lowest priority,
   best-effort (no guarantee) before guaranteed, and furthest above its own guarantee first, never below that
   guarantee; the shrink is an ordinary smaller JobDecision that the resharding protocol carries out
   (checkpoint, smaller worker set, or a pause at a checkpoint). Each is named in a Reclaim.
4. Within each queue the pool arbiter decides as it does for the whole cluster today (serving first, training by
   the allocator's marginal gain, borrowing for serving), on the GPUs of its budget: the others' GPUs are hidden
   from it as foreign GPUs, one queue after another, so that no GPU is given twice. The verdicts and shares of
   step 1 are fed in, so a queue never re-admits against GPUs it borrows.

With no queues it is `flotilla.pool.decide` itself. Jobs and deployments with queue "" (none) are in the implicit
queue, owed what no queue's nominal covers. A job naming a queue that does not exist (or is invalid) waits if it
has not started, and keeps running in the implicit queue if it has (its queue was deleted under it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from flotilla.allocation.elastic import DeadlineElastic
from flotilla.allocation.placement import shrink_in_place
from flotilla.allocation.sizes import fit_size, job_sizes
from flotilla.allocation.snapshot import ClusterSnapshot, JobDecision, JobState, NodeState, Verdict
from flotilla.pool import arbiter
from flotilla.pool.types import Loan, PoolDecision, PoolPolicy, PoolSnapshot, ServingDecision, ServingState
from flotilla.tenancy.model import IMPLICIT_QUEUE, RESOURCE_GPU, QueueProblem, QueueSpec, validate_queues
from flotilla.tenancy.shares import Claim, settle, split_tree
from flotilla.tenancy.types import QueueUsage, Reclaim, TenantDecision

_ALLOCATOR = DeadlineElastic()
# Problems a queue still serves with (reported only): its nominal (with the others') above the cluster's or its
# children's above its own (guarantees then shrink together, as after a node loss), a namespace another queue
# claimed first (queue_for gives it to the first). Any other problem makes the queue unusable: its jobs wait.
_REPORTED_ONLY = ("exceeds the cluster's", "exceeds the parent's", "is already served by")


@dataclass
class _Queue:
    name: str
    spec: QueueSpec | None  # None: the implicit queue
    jobs: list[JobState] = field(default_factory=list)
    serving: list[ServingState] = field(default_factory=list)
    guarantee: int = 0  # GPUs its deadlines may be promised out of
    promised: dict[str, JobDecision] = field(default_factory=dict)  # step 1's decision per job
    budget: int = 0
    holds: int = 0


def decide(snapshot: PoolSnapshot, queues: Sequence[QueueSpec], policy: PoolPolicy = PoolPolicy()) -> TenantDecision:
    capacity = sum(n.usable_gpus for n in snapshot.nodes)
    if not queues:
        pool = arbiter.decide(snapshot, policy)
        whole = _usage(capacity, list(pool.jobs.values()), list(pool.serving.values()))
        return TenantDecision(pool, {IMPLICIT_QUEUE: whole}, (), ())
    problems = validate_queues(queues, {RESOURCE_GPU: capacity})
    broken = {p.queue: p for p in problems if not any(words in p.message for words in _REPORTED_ONLY)}
    specs = {q.name: q for q in queues if q.name and q.name not in broken}
    parent = {n: (q.parent if q.parent in specs else None) for n, q in specs.items()}
    roots_nominal = sum(specs[n].quota().nominal for n, p in parent.items() if p is None)
    members: dict[str, _Queue] = {n: _Queue(n, q) for n, q in specs.items()}
    members[IMPLICIT_QUEUE] = _Queue(IMPLICIT_QUEUE, None)
    waiting: dict[str, JobDecision] = {}
    waiting_serving: dict[str, ServingDecision] = {}
    extra_problems: list[QueueProblem] = []
    schedulable = {n.name for n in snapshot.nodes if n.schedulable}
    for job in snapshot.jobs:
        home = _home(job.queue, job.verdict is not None or bool(job.placement), specs)
        if home is None:
            why = _missing(job.queue, broken)
            waiting[job.key] = JobDecision(job.key, Verdict.PENDING, {}, f"waits: {why}")
            extra_problems.append(QueueProblem(job.queue, "spec.queue", f"{job.key}: {why}"))
        else:
            members[home].jobs.append(job)
    for sd in snapshot.serving:
        home = _home(sd.queue, bool(sd.placement), specs)
        if home is None:
            why = _missing(sd.queue, broken)
            waiting_serving[sd.key] = ServingDecision(sd.key, {}, 0, f"waits: {why}", None)
            extra_problems.append(QueueProblem(sd.queue, "spec.queue", f"{sd.key}: {why}"))
        else:
            members[home].serving.append(sd)

    # 1. The guarantee each queue's deadlines are promised out of (scaled down together when nodes are lost).
    implicit_nominal = max(0, capacity - roots_nominal)
    owed = [_claim(members[n], 0, implicit_nominal) for n in members]
    guarantees = split_tree(capacity, [replace(c, demand=c.nominal) for c in owed], {**parent, IMPLICIT_QUEUE: None})
    for name, m in members.items():
        m.guarantee = guarantees.get(name, 0)
        if m.jobs:
            m.promised = _guarantees(snapshot, m, policy, schedulable)

    # 2. Budgets.
    for m in members.values():
        m.holds = sum(g for j in m.jobs for n, g in j.placement.items() if n in schedulable) + sum(
            g for s in m.serving for n, g in s.placement.items() if n in schedulable)
    claims = [_claim(m, _demand(m), implicit_nominal) for m in members.values()]
    budgets = split_tree(capacity, claims, {**parent, IMPLICIT_QUEUE: None})
    # What a queue may take back from borrowers: what its guarantees and its waiting work need now, within its
    # nominal. Growth for speed uses idle GPUs only: taking them back would cost both sides a restore.
    # A queue with deadline guarantees also takes back what its own partition would give its guaranteed work now:
    # run slower than on its nominal alone, its jobs would leave its ledger less room for its later deadlines.
    holdings = {m.name: _held(m, {}, schedulable) for m in members.values()}
    floors = split_tree(capacity, [replace(c, demand=min(max(_need(members[c.name], policy, schedulable, snapshot.now),
                                                             _as_partition(snapshot, members[c.name], c.nominal,
                                                                           holdings, policy)),
                                                         c.nominal)) for c in claims],
                        {**parent, IMPLICIT_QUEUE: None})
    budgets = settle(budgets, {n: m.holds for n, m in members.items()}, floors, capacity)
    for name, m in members.items():
        m.budget = budgets.get(name, 0)

    # 3. Reclaim.
    shrunk, reclaims = _reclaim(members, schedulable)

    # 4. Each queue on its budget, one after another.
    occupied = {m.name: _held(m, shrunk, schedulable) for m in members.values()}
    jobs: dict[str, JobDecision] = dict(waiting)
    serving: dict[str, ServingDecision] = dict(waiting_serving)
    loans: list[Loan] = []
    for name in sorted(members, key=lambda n: (members[n].budget - members[n].holds, n)):
        m = members[name]
        if not m.jobs and not m.serving:
            continue
        others: dict[str, int] = {}
        for other, held in occupied.items():
            if other != name:
                for node, g in held.items():
                    others[node] = others.get(node, 0) + g
        nodes = _budget_nodes(snapshot.nodes, others, occupied[name], m.budget)
        queue_jobs = tuple(_promised_state(shrunk.get(j.key, j), m.promised.get(j.key)) for j in m.jobs
                           if m.promised.get(j.key) is None or m.promised[j.key].verdict is not Verdict.REJECTED)
        for j in m.jobs:
            d = m.promised.get(j.key)
            if d is not None and d.verdict is Verdict.REJECTED:
                jobs[j.key] = d
        decision = arbiter.decide(PoolSnapshot(snapshot.now, nodes, queue_jobs, tuple(m.serving)), policy)
        final: dict[str, int] = {}
        for key, d in decision.jobs.items():
            jobs[key] = _annotated(d, m, reclaims)
            for node, g in d.placement.items():
                final[node] = final.get(node, 0) + g
        for key, s in decision.serving.items():
            serving[key] = s
            for node, g in s.placement.items():
                final[node] = final.get(node, 0) + g
        loans.extend(decision.loans)
        occupied[name] = final
    pool = PoolDecision(jobs, serving, tuple(loans), arbiter.transition(snapshot, jobs, serving))
    usage = {name: _usage(m.guarantee if m.spec is None else m.spec.quota().nominal,
                          [jobs[j.key] for j in m.jobs], [serving[s.key] for s in m.serving])
             for name, m in members.items() if m.spec is not None or m.jobs or m.serving or m.guarantee}
    _lend(usage, members)
    return TenantDecision(pool, usage, tuple(reclaims), tuple(problems + extra_problems))


def _home(requested: str, started: bool, specs: Mapping[str, QueueSpec]) -> str | None:
    if requested == IMPLICIT_QUEUE or requested in specs:
        return requested
    return IMPLICIT_QUEUE if started else None


def _missing(queue: str, broken: Mapping[str, QueueProblem]) -> str:
    if queue in broken:
        p = broken[queue]
        return f"queue {queue!r} is not valid ({p.field}: {p.message})"
    return f"queue {queue!r} does not exist"


def _claim(m: _Queue, demand: int, implicit_nominal: int) -> Claim:
    if m.spec is None:
        return Claim(m.name, implicit_nominal, demand)
    q = m.spec.quota()
    return Claim(m.name, q.nominal, demand, m.spec.weight, q.borrowing_limit, q.lending_limit)


def _demand(m: _Queue) -> int:
    """GPUs a queue's work could use now: its live jobs' maxGPUs, its deployments' targets (or what they hold)."""
    live = [j for j in m.jobs if j.remaining_steps > 0 and
            (m.promised.get(j.key) is None or m.promised[j.key].verdict is not Verdict.REJECTED)]
    serving = sum(max(s.gpus, min(s.max_gpus, max(s.demand_gpus, s.min_gpus))) for s in m.serving)
    return sum(j.max_gpus for j in live) + serving


def _need(m: _Queue, policy: PoolPolicy, schedulable: set[str], now: float) -> int:
    """GPUs a queue needs now: what its running jobs hold (at least their guaranteed shares), the smallest size of
    each job waiting for GPUs, and its serving's target now. A waiting job is owed GPUs on top of what the
    queue's running jobs hold: the queue's own jobs are not shrunk to make room for it while others borrow its
    nominal (alone on its nominal it would start on the free GPUs)."""
    total = 0
    for j in m.jobs:
        d = m.promised.get(j.key)
        if j.remaining_steps == 0 or (d is not None and d.verdict is Verdict.REJECTED):
            continue
        guaranteed = d.guaranteed_gpus if d is not None else 0
        held = sum(g for n, g in j.placement.items() if n in schedulable)
        sizes = job_sizes(j)[0]
        total += max(guaranteed, held if held else (sizes[0] if sizes else 0))
    serving = _serving_reserve(m, now, policy, schedulable)
    return total + (serving[0][1] if serving else 0)


def _as_partition(snapshot: PoolSnapshot, m: _Queue, nominal: int, holdings: Mapping[str, Mapping[str, int]],
                  policy: PoolPolicy) -> int:
    """GPUs the pool arbiter would give a lending queue's guaranteed work (its admitted deadline jobs and its
    serving) on the queue's nominal alone, as on a static partition, at the moment a guaranteed job of the queue
    starts (the borrowers shrink for it then anyway: taking back the rest in the same checkpoint costs them no
    second restore); 0 otherwise, or when the queue holds its nominal already (nothing of its own is lent).
    Taking back for speed at any other time costs both sides a restore each time (measured worse)."""
    mine = holdings[m.name]
    held = sum(mine.values())
    guaranteed = {k for k, d in m.promised.items() if d.verdict is Verdict.ADMITTED and d.guaranteed_gpus > 0}
    starting = [j for j in m.jobs if j.key in guaranteed and not j.placement and j.remaining_steps > 0]
    if held >= nominal or not starting:
        return 0
    others: dict[str, int] = {}
    for name, placement in holdings.items():
        if name != m.name:
            for node, g in placement.items():
                others[node] = others.get(node, 0) + g
    seen = arbiter.with_foreign_gpus(snapshot.nodes, others)
    short = nominal - held - sum(max(0, n.usable_gpus - mine.get(n.name, 0)) for n in seen)
    # The GPUs it lent, as if back: from the nodes where the others hold the most, so whole nodes come back.
    for node in sorted(others, key=lambda n: (-others[n], n)):
        if short <= 0:
            break
        back = min(others[node], short)
        others[node] -= back
        short -= back
    nodes = _budget_nodes(snapshot.nodes, others, mine, nominal)
    jobs = tuple(_promised_state(j, m.promised.get(j.key)) for j in m.jobs
                 if m.promised.get(j.key) is None or m.promised[j.key].verdict is not Verdict.REJECTED)
    decision = arbiter.decide(PoolSnapshot(snapshot.now, nodes, jobs, tuple(m.serving)), policy)
    return sum(d.gpus for k, d in decision.jobs.items() if k in guaranteed) + sum(
        s.gpus for s in decision.serving.values())


def _serving_reserve(m: _Queue, now: float, policy: PoolPolicy,
                     schedulable: set[str]) -> tuple[tuple[float, int], ...]:
    """The queue's serving forecast with headroom over time, as the pool arbiter plans it (whole instances; now,
    at least what it holds through its hold-down)."""
    times = sorted({now} | {t for s in m.serving for t, _ in s.forecast if t > now})

    def instances(s: ServingState, gpus: int) -> int:
        unit = s.gpus_per_instance
        return min(math.ceil(gpus / unit) * unit, s.max_gpus // unit * unit)

    def at(s: ServingState, t: float) -> int:
        demand = next((g for start, g in sorted(s.forecast, reverse=True) if start <= t), s.demand_gpus)
        gpus = instances(s, max(math.ceil(demand * (1 + policy.forecast_headroom)), s.min_gpus))
        if t > now:
            return gpus
        want = instances(s, max(s.demand_gpus, s.min_gpus))
        holds = sum(g for n, g in s.placement.items() if n in schedulable)
        since = now if s.below_since is None else s.below_since
        target = holds if want < holds and now - since < policy.hold_down_seconds else want
        return max(gpus, target)

    return tuple((t, sum(at(s, t) for s in m.serving)) for t in times)


def _guarantees(snapshot: PoolSnapshot, m: _Queue, policy: PoolPolicy,
                schedulable: set[str]) -> dict[str, JobDecision]:
    """Step 1 for one queue: its jobs admitted and their shares sized out of its own guarantee."""
    nodes = arbiter.with_foreign_gpus(snapshot.nodes, _serving_holdings(m.serving))
    visible = sum(n.usable_gpus for n in nodes)
    # Everything but the queue's guarantee is claimed by others; its serving's forecast is claimed within it.
    reserve = _serving_reserve(m, snapshot.now, policy, schedulable)
    claimed = tuple((t, visible - (m.guarantee - gpus)) for t, gpus in reserve)
    decision = _ALLOCATOR.decide(ClusterSnapshot(snapshot.now, nodes, tuple(m.jobs), claimed))
    return dict(decision.jobs)


def _serving_holdings(serving: Sequence[ServingState]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in serving:
        for node, g in s.placement.items():
            out[node] = out.get(node, 0) + g
    return out


def _promised_state(job: JobState, promised: JobDecision | None) -> JobState:
    """The job as step 4 sees it: the verdict and share its own queue's guarantee gave it."""
    if promised is None or job.verdict is Verdict.REJECTED:
        return job
    if promised.verdict is Verdict.ADMITTED:
        return replace(job, verdict=Verdict.ADMITTED, share=max(job.share, promised.share))
    if promised.verdict is Verdict.BEST_EFFORT:
        return replace(job, verdict=Verdict.BEST_EFFORT)
    return job


def _reclaim(members: Mapping[str, _Queue],
             schedulable: set[str]) -> tuple[dict[str, JobState], list[Reclaim]]:
    """Shrink borrowers of queues above their budget: lowest priority, best-effort, furthest above its guarantee
    first."""
    deficit = {n: m.budget - m.holds for n, m in members.items() if m.budget > m.holds}
    shrunk: dict[str, JobState] = {}
    reclaims: list[Reclaim] = []
    for name in sorted(members):
        m = members[name]
        excess = m.holds - m.budget
        if excess <= 0:
            continue
        running = [j for j in m.jobs if j.placement and set(j.placement) <= schedulable and j.remaining_steps > 0]

        def floor(j: JobState) -> int:
            d = m.promised.get(j.key)
            return d.guaranteed_gpus if d is not None else 0

        def guaranteed(j: JobState) -> bool:
            d = m.promised.get(j.key)
            return d is not None and d.verdict is Verdict.ADMITTED

        # Within a priority, work that runs without a guarantee (best-effort) gives back first, whole.
        for job in sorted(running, key=lambda j: (j.priority, guaranteed(j), -(j.gpus - floor(j)), j.key)):
            if excess <= 0:
                break
            keep = max(floor(job), job.gpus - excess)
            size = fit_size(job_sizes(job)[0], keep) if keep > 0 else 0
            if size < floor(job):  # no allowed size between the guarantee and what it holds: keep the guarantee
                size = next((s for s in job_sizes(job)[0] if s >= floor(job)), job.gpus)
            if size >= job.gpus:
                continue
            gave = job.gpus - size
            excess -= gave
            # Named after the queue still owed the most (several may be owed at once).
            to = max(deficit, key=lambda n: (deficit[n], n)) if deficit else IMPLICIT_QUEUE
            if to in deficit:
                deficit[to] -= gave
            placement = shrink_in_place(job.placement, size, job.gpus_per_worker) if size else {}
            shrunk[job.key] = replace(job, placement=placement)
            how = ("pauses at a checkpoint" if size == 0 else f"shrinks to {size} GPUs through a checkpoint")
            if job.checkpoint_interval_steps <= 0 and size == 0:
                how = "is stopped: it has no checkpoint configured, so it loses its progress"
            target = f"queue {to!r}" if to else "the implicit queue"
            reasons = (f"queue {name!r} holds {m.holds} GPUs but may now hold {m.budget}: {target} needs its "
                       f"nominal share back; {job.key} (priority {job.priority}) {how}")
            reclaims.append(Reclaim(job.key, name, to, gave, reasons))
    return shrunk, reclaims


def _held(m: _Queue, shrunk: Mapping[str, JobState], schedulable: set[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for placement in [shrunk.get(j.key, j).placement for j in m.jobs] + [s.placement for s in m.serving]:
        for node, g in placement.items():
            if node in schedulable:
                out[node] = out.get(node, 0) + g
    return out


def _budget_nodes(nodes: tuple[NodeState, ...], others: Mapping[str, int], mine: Mapping[str, int],
                  budget: int) -> tuple[NodeState, ...]:
    """The nodes as one queue sees them: the others' GPUs foreign, and free GPUs beyond its budget hidden too
    (from the nodes with the fewest free first, so that whole nodes stay whole)."""
    seen = arbiter.with_foreign_gpus(nodes, others)
    free = {n.name: n.usable_gpus - mine.get(n.name, 0) for n in seen if n.usable_gpus - mine.get(n.name, 0) > 0}
    hide = sum(mine.values()) + sum(free.values()) - max(budget, sum(mine.values()))
    hidden: dict[str, int] = {}
    for node in sorted(free, key=lambda n: (free[n], n)):
        if hide <= 0:
            break
        h = min(free[node], hide)
        hidden[node] = h
        hide -= h
    return arbiter.with_foreign_gpus(seen, hidden)


def _annotated(d: JobDecision, m: _Queue, reclaims: Sequence[Reclaim]) -> JobDecision:
    promised = m.promised.get(d.key)
    guaranteed = min(d.guaranteed_gpus, promised.guaranteed_gpus) if promised is not None else 0
    # The share fed back is the one planned out of the queue's own guarantee: a share planned on borrowed GPUs
    # would make the next decision hold more of the queue's nominal for this job than it needs.
    share = promised.share if promised is not None else d.share
    notes = [d.reason]
    for r in reclaims:
        if r.job == d.key:
            notes.append(f"gives {r.gpus} GPUs back to queue {r.to_queue!r}")
    if d.gpus > guaranteed and m.budget > m.guarantee:
        notes.append(f"its queue {m.name!r} borrows beyond its nominal: GPUs above {guaranteed} may be reclaimed "
                     f"through a checkpoint")
    return replace(d, reason="; ".join(notes), guaranteed_gpus=guaranteed, share=share)


def _usage(nominal: int, jobs: Sequence[JobDecision], serving: Sequence[ServingDecision]) -> QueueUsage:
    used = sum(d.gpus for d in jobs) + sum(s.gpus for s in serving)
    live = [d for d in jobs if d.reason != "finished" and d.verdict is not Verdict.REJECTED]
    admitted = sum(1 for d in live if d.gpus or d.verdict is Verdict.ADMITTED) + sum(1 for s in serving if s.gpus)
    pending = sum(1 for d in live if not d.gpus and d.verdict is not Verdict.ADMITTED) + sum(
        1 for s in serving if not s.gpus)
    guaranteed = sum(d.guaranteed_gpus for d in jobs) + sum(min(s.gpus, s.demanded) for s in serving)
    return QueueUsage(nominal, used, max(0, used - nominal), 0, admitted, pending, min(guaranteed, max(nominal, 0)))


def _lend(usage: dict[str, QueueUsage], members: Mapping[str, _Queue]) -> None:
    """Attribute what borrowers hold above their nominal to the lenders' unused nominal (within lending limits)."""
    borrowed = sum(u.borrowed for u in usage.values())
    for name in sorted(usage, key=lambda n: (-(usage[n].nominal - usage[n].used), n)):
        u = usage[name]
        spec = members[name].spec
        unused = max(0, u.nominal - u.used)
        if spec is not None and spec.quota().lending_limit is not None:
            unused = min(unused, spec.quota().lending_limit or 0)
        lent = min(unused, borrowed)
        borrowed -= lent
        usage[name] = replace(u, lent=lent)
