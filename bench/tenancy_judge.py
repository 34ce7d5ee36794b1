"""The judge of bench/tenancy.py: multi-team traces and a simulator that replays one under a policy and scores it.

Imports nothing of Flotilla (tests/tenancy/test_bench.py checks it): the traces are generated, the jobs run, the
deadlines and losses are counted here, by rules of its own, whatever policy decides.

A policy is an object with `name`, `preempts` ("checkpoint": a job that loses GPUs first writes a checkpoint and
loses no step; "evict": its pods are deleted and it goes back to its last periodic checkpoint) and
`decide(view) -> Allocation`. It is asked at every arrival, completion, end of a restore, serving change and
every TICK_S seconds.

How jobs run: at their curve's rate (linear between measured points) for the GPUs they hold; after any change to a
started job's GPUs it trains again only after `restore_s` (and, on GPUs that another job is giving back, not
before that job's checkpoint is written, `checkpoint_s`, or its pods are gone, GRACE_S). A job checkpoints every
`checkpoint_every` steps on its own; `restore_s` is the whole cost of a resize (stop, checkpoint, reshard,
restart), of which the first `checkpoint_s` write the checkpoint.

Isolation: `within_share` says which deadline jobs their team's nominal share could carry; `deprived` which of
those that failed had their team kept below its share by another team's work (from the allocations replayed here:
the team held less than its nominal, or than its work could use, while another held more than its own, or waited
for GPUs another team was still giving back).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Mapping, Protocol

TICK_S = 600.0
GRACE_S = 30.0  # a deleted pod's termination grace: evicted GPUs are free after it
SERVING_STEP_S = 900.0


@dataclass(frozen=True)
class Team:
    name: str
    nominal: int
    weight: float = 1.0


@dataclass(frozen=True)
class Job:
    id: str
    team: str
    submit: float
    steps: int
    deadline: float | None  # None: best-effort
    curve: tuple[tuple[int, float], ...]  # (GPUs, steps/s), ascending
    min_gpus: int
    max_gpus: int
    requested: int
    restore_s: float
    checkpoint_s: float
    checkpoint_every: int  # steps
    priority: int = 0
    # The user's choice (TrainingJob spec.bestEffort) for a deadline job: run it, without a guarantee, even when
    # its deadline cannot be promised. Kueue and KAI run every job anyway; the deadline is judged alike.
    best_effort: bool = False

    def rate(self, gpus: int) -> float:
        return curve_rate(self.curve, gpus)


@dataclass(frozen=True)
class Serving:
    id: str
    team: str
    demand: tuple[int, ...]  # GPUs needed in each SERVING_STEP_S slot
    forecast: tuple[int, ...]  # what its operators expect in each slot (the planner's forecast)
    min_gpus: int
    max_gpus: int
    unit: int

    def demand_at(self, t: float) -> int:
        return self.demand[min(int(t // SERVING_STEP_S), len(self.demand) - 1)]

    def forecast_at(self, t: float) -> int:
        return self.forecast[min(int(t // SERVING_STEP_S), len(self.forecast) - 1)]


@dataclass(frozen=True)
class Trace:
    name: str
    seed: int
    nodes: int
    gpus_per_node: int
    duration_s: float
    teams: tuple[Team, ...]
    jobs: tuple[Job, ...]
    serving: tuple[Serving, ...] = ()

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def curve_rate(curve: tuple[tuple[int, float], ...], gpus: int) -> float:
    if gpus <= 0:
        return 0.0
    g0, r0 = curve[0]
    if gpus <= g0:
        return r0 * gpus / g0
    for (ga, ra), (gb, rb) in zip(curve, curve[1:]):
        if gpus <= gb:
            return ra + (rb - ra) * (gpus - ga) / (gb - ga)
    return curve[-1][1]


# ---- the view a policy gets, and what it returns ----

@dataclass(frozen=True)
class JobView:
    job: Job
    done: int  # steps done
    last_checkpoint: int
    placement: Mapping[str, int]
    resumes_at: float  # when it trains again after its last change (<= now: training)


@dataclass(frozen=True)
class ServingView:
    serving: Serving
    demand: int
    forecast: tuple[tuple[float, int], ...]  # (from time, GPUs) over the next day
    placement: Mapping[str, int]


@dataclass(frozen=True)
class View:
    now: float
    nodes: Mapping[str, int]  # node -> GPUs
    teams: tuple[Team, ...]
    jobs: tuple[JobView, ...]  # submitted, unfinished, not rejected
    serving: tuple[ServingView, ...]


@dataclass
class Allocation:
    jobs: dict[str, dict[str, int]]  # job id -> placement; absent: no GPUs
    serving: dict[str, dict[str, int]]
    rejected: set[str] = field(default_factory=set)  # dropped for good (count as missed)


class Policy(Protocol):
    name: str
    preempts: str

    def decide(self, view: View) -> Allocation: ...


# ---- the simulator ----

@dataclass
class _Run:
    job: Job
    done: float = 0.0
    last_checkpoint: int = 0
    placement: dict[str, int] = field(default_factory=dict)
    resumes_at: float = 0.0
    started: bool = False
    finish: float | None = None
    rejected: bool = False
    first_train: float | None = None

    @property
    def gpus(self) -> int:
        return sum(self.placement.values())


@dataclass
class Result:
    trace: str
    seed: int
    policy: str
    met: dict[str, int]  # team -> deadline jobs met
    judged: dict[str, int]  # team -> deadline jobs judged (deadline within the trace)
    missed_ids: set[str]
    utilization: float
    lost_gpu_h: float  # work discarded plus restore time, in GPU-hours, of jobs whose GPUs went to another team
    work_lost_gpu_h: float  # of it, the work discarded (steps since the last checkpoint), in GPU-hours
    preemptions: int  # every time a running job gave GPUs back (reclaims and rescales within its team)
    reclaim_latency_s: list[float]  # decision -> training, for jobs given GPUs that another team gave back
    reclaims: int
    rescale_gpu_h: float  # the same cost over every preemption, reclaims and rescales within a team
    serving_attainment: float  # GPU-seconds serving held within its demand over its demand
    finish: dict[str, float | None] = field(default_factory=dict)
    # Deadline jobs submitted while their team asked for no more than its nominal share (see within_share), and
    # of those, the ones refused or late: isolation violations.
    within_share: set[str] = field(default_factory=set)
    violations: set[str] = field(default_factory=set)
    first_train: dict[str, float | None] = field(default_factory=dict)
    # Of `violations`, those whose team was deprived by another team's work (see `deprived`) while that job's
    # fate was being decided: the isolation violations of the issue, once the team alone also met the job.
    deprived: set[str] = field(default_factory=set)
    # Per team, the intervals (start, end, GPUs short) in which another team's work kept it below its share.
    short: dict[str, list[tuple[float, float, int]]] = field(default_factory=dict)

    @property
    def deadline_ratio(self) -> float:
        return sum(self.met.values()) / max(1, sum(self.judged.values()))

    def team_ratio(self, team: str) -> float:
        return self.met.get(team, 0) / max(1, self.judged.get(team, 0))


def simulate(trace: Trace, policy: Policy) -> Result:
    nodes = {f"n{i:02d}": trace.gpus_per_node for i in range(trace.nodes)}
    runs = {j.id: _Run(j) for j in trace.jobs}
    serving_place: dict[str, dict[str, int]] = {s.id: {} for s in trace.serving}
    arrivals = sorted({j.submit for j in trace.jobs})
    now, useful, lost, work_lost, rescale, preemptions, reclaims = 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0
    serving_in, serving_need = 0.0, 0.0
    latencies: list[float] = []
    short: dict[str, list[tuple[float, float, int]]] = {}
    pending_waits: list[tuple[_Run, set[str]]] = []
    next_tick = 0.0
    while now < trace.duration_s - 1e-9:
        live = [r for r in runs.values() if r.job.submit <= now and r.finish is None and not r.rejected]
        view = View(now, nodes, trace.teams,
                    tuple(JobView(r.job, int(r.done), r.last_checkpoint, dict(r.placement), r.resumes_at)
                          for r in live),
                    tuple(ServingView(s, s.demand_at(now), _forecast(s, now), dict(serving_place[s.id]))
                          for s in trace.serving))
        alloc = policy.decide(view)
        _check_fits(nodes, alloc, policy.name, now)
        new_of: dict[str, dict[str, int]] = {}
        for r in live:
            new_of[r.job.id] = {n: g for n, g in alloc.jobs.get(r.job.id, {}).items() if g}
            if r.job.id in alloc.rejected:
                r.rejected = True
                new_of[r.job.id] = {}
        new_serving = {s.id: {n: g for n, g in alloc.serving.get(s.id, {}).items() if g} for s in trace.serving}
        # Which teams get more GPUs on each node in this decision: a holder that gives GPUs back on a node where
        # another team grows is reclaimed (else it is rescaled within its own team).
        growing: dict[str, set[str]] = {}
        for r in live:
            for n, g in new_of[r.job.id].items():
                if g > r.placement.get(n, 0):
                    growing.setdefault(n, set()).add(r.job.team)
        for sv in trace.serving:
            for n, g in new_serving[sv.id].items():
                if g > serving_place[sv.id].get(n, 0):
                    growing.setdefault(n, set()).add(sv.team)
        # GPUs given back in this decision: free after a checkpoint is written, or after the grace period.
        free_at: dict[str, list[tuple[float, str]]] = {}
        for r in live:
            new = new_of[r.job.id]
            if new == r.placement:
                continue
            old_gpus, new_gpus = r.gpus, sum(new.values())
            shrunk_on = [n for n, g in r.placement.items() if new.get(n, 0) < g]
            if r.started and shrunk_on:
                preemptions += 1
                reclaimed = any(growing.get(n, set()) - {r.job.team} for n in shrunk_on)
                when = now + (r.job.checkpoint_s if policy.preempts == "checkpoint" else GRACE_S)
                for n in shrunk_on:
                    free_at.setdefault(n, []).append((when, r.job.team))
                cost = r.job.restore_s * (new_gpus if policy.preempts == "checkpoint" else old_gpus) / 3600
                discarded = 0.0
                if policy.preempts == "evict":
                    gone = r.done - r.last_checkpoint
                    discarded = gone / max(r.job.rate(old_gpus), 1e-9) * old_gpus / 3600
                    cost += discarded
                    r.done = float(r.last_checkpoint)
                else:
                    r.last_checkpoint = int(r.done)
                rescale += cost
                if reclaimed:
                    reclaims += 1
                    lost += cost
                    work_lost += discarded
            if new_gpus:
                # restore_s is the whole stop / checkpoint / reshard / restart (its first checkpoint_s writes the
                # checkpoint, after which the GPUs it gives back are free).
                r.resumes_at = now + (r.job.restore_s if r.started else 0.0)
                r.started = True
            grown = {n for n, g in new.items() if g > r.placement.get(n, 0)}
            r.placement = new
            if grown:
                pending_waits.append((r, grown))
        for r, grown in pending_waits:  # a job on GPUs another team gives back waits until they are free
            waits = [t for n in grown for t, team in free_at.get(n, ()) if team != r.job.team]
            if waits:
                latencies.append(max(max(waits), r.resumes_at) - now)
                r.resumes_at = max(r.resumes_at, max(waits))
                # Until then the team is short of those GPUs because of another team's work.
                short.setdefault(r.job.team, []).append((now, max(waits), len(grown)))
        pending_waits.clear()
        for s in trace.serving:
            serving_place[s.id] = new_serving[s.id]
        held_now, want_now = _team_holdings(trace, now, live, new_of, new_serving)
        decided_short = {t.name: min(t.nominal, want_now[t.name]) - held_now[t.name] for t in trace.teams}
        for r in live:
            if r.gpus and r.first_train is None:
                r.first_train = max(now, r.resumes_at)

        # Advance to the next event.
        candidates = [trace.duration_s, next_tick if next_tick > now else now + TICK_S,
                      (math.floor(now / SERVING_STEP_S) + 1) * SERVING_STEP_S if trace.serving else math.inf]
        candidates += [a for a in arrivals if a > now][:1]
        for r in live:
            if r.gpus and not r.rejected:
                start = max(now, r.resumes_at)
                if start > now:
                    candidates.append(start)
                candidates.append(start + (r.job.steps - r.done) / r.job.rate(r.gpus))
        end = min(candidates)
        if end >= next_tick:
            next_tick = end + TICK_S
        for r in live:
            if not r.gpus or r.rejected:
                continue
            start = min(max(now, r.resumes_at), end)
            rate = r.job.rate(r.gpus)
            left = r.job.steps - r.done
            if rate * (end - start) >= left - 1e-6:
                r.finish = start + left / rate
                useful += r.gpus * (r.finish - start)
                r.done = r.job.steps
                r.placement = {}
            else:
                r.done += rate * (end - start)
                useful += r.gpus * (end - start)
                if r.job.checkpoint_every:
                    r.last_checkpoint = max(r.last_checkpoint,
                                            int(r.done // r.job.checkpoint_every) * r.job.checkpoint_every)
        for s in trace.serving:
            held = sum(serving_place[s.id].values())
            need = s.demand_at(now)
            useful += min(held, need) * (end - now)
            serving_in += min(held, need) * (end - now)
            serving_need += need * (end - now)
        for t in trace.teams:
            lenders_used = any(held_now[o.name] > o.nominal for o in trace.teams if o.name != t.name)
            if decided_short[t.name] > 0 and lenders_used and end > now:
                short.setdefault(t.name, []).append((now, end, decided_short[t.name]))
        now = end

    met: dict[str, int] = {}
    judged: dict[str, int] = {}
    missed: set[str] = set()
    owed = within_share(trace, {k: r.finish if r.finish is not None else (r.job.submit if r.rejected else None)
                                for k, r in runs.items()})
    for r in runs.values():
        if r.job.deadline is None or r.job.deadline > trace.duration_s:
            continue
        judged[r.job.team] = judged.get(r.job.team, 0) + 1
        if r.finish is not None and r.finish <= r.job.deadline + 1e-6:
            met[r.job.team] = met.get(r.job.team, 0) + 1
        else:
            missed.add(r.job.id)
    ended = {k: r.finish if r.finish is not None else (r.job.submit if r.rejected else None) for k, r in runs.items()}
    return Result(trace.name, trace.seed, policy.name, met, judged, missed, useful / (trace.gpus * trace.duration_s),
                  lost, work_lost, preemptions, latencies, reclaims, rescale, serving_in / serving_need if serving_need else 1.0,
                  {k: r.finish for k, r in runs.items()}, owed, owed & missed,
                  {k: r.first_train for k, r in runs.items()},
                  deprived(trace, owed & missed, ended, {k for k, r in runs.items() if r.rejected}, short), short)


def _team_holdings(trace: Trace, now: float, live: list[_Run], placement: Mapping[str, Mapping[str, int]],
                   serving: Mapping[str, Mapping[str, int]]) -> tuple[dict[str, int], dict[str, int]]:
    """Per team, the GPUs it holds after a decision and the most its live work could use (its unfinished,
    unrefused jobs' maxGPUs and its serving demand)."""
    held = {t.name: 0 for t in trace.teams}
    want = {t.name: 0 for t in trace.teams}
    for r in live:
        if r.rejected:
            continue
        held[r.job.team] += sum(placement.get(r.job.id, {}).values())
        want[r.job.team] += r.job.max_gpus
    for s in trace.serving:
        held[s.team] += sum(serving.get(s.id, {}).values())
        want[s.team] += s.demand_at(now)
    return held, want


def deprived(trace: Trace, failed: set[str], ended: Mapping[str, float | None], refused: set[str],
             short: Mapping[str, list[tuple[float, float, int]]]) -> set[str]:
    """Of the `failed` jobs (within their team's share, refused or late), those whose team another team's work
    kept below its share while the job's fate was being decided: at some moment from the submission of the
    earliest of its team's deadline jobs still unfinished when it was submitted (their progress is what its
    admission was judged against) to its refusal, or to its deadline, the team held fewer GPUs than its nominal
    share (or than its work could use, if less) while another team held more than its own, or its job waited
    for GPUs another team was still giving back."""
    out: set[str] = set()
    by_id = {j.id: j for j in trace.jobs}
    for key in failed:
        job = by_id[key]
        start = min([job.submit] + [o.submit for o in trace.jobs if o.team == job.team and o.deadline is not None
                                    and o.submit <= job.submit and o.id not in refused
                                    and (ended.get(o.id) or math.inf) > job.submit])
        end = job.submit if key in refused else max(job.submit, job.deadline or job.submit)
        if any(a < end and b > start and gpus > 0 for a, b, gpus in short.get(job.team, ())):
            out.add(key)
    return out


def needed_gpus(job: Job) -> int | None:
    """The fewest GPUs with which `job` finishes by its deadline from its submission (None: none can)."""
    assert job.deadline is not None
    for g in range(job.min_gpus, job.max_gpus + 1):
        if job.steps / job.rate(g) <= job.deadline - job.submit:
            return g
    return None


def _claim(job: Job) -> int:
    need = needed_gpus(job) if job.deadline is not None else None
    return max(need or job.requested, job.requested if job.deadline is None else 0)


def within_share(trace: Trace, finish: Mapping[str, float | None]) -> set[str]:
    """Deadline jobs (judged within the trace) that their team's nominal share could carry: at submission, the
    job's needed GPUs plus what the team's other unfinished jobs ask for (as this run finished them; a refused job
    is gone at once: a deadline job its needed GPUs, or its requested ones if none are enough; a best-effort job
    its requested ones) and
    the team's serving demand fit within the team's nominal. Refused or late, such a job is an isolation
    violation: its team asked for no more than its share."""
    out: set[str] = set()
    nominal = {t.name: t.nominal for t in trace.teams}
    for job in trace.jobs:
        if job.deadline is None or job.deadline > trace.duration_s:
            continue
        need = needed_gpus(job)
        if need is None:
            continue
        others = sum(_claim(o) for o in trace.jobs if o.team == job.team and o.id != job.id
                     and o.submit <= job.submit and (finish.get(o.id) or math.inf) > job.submit)
        serving = sum(s.demand_at(job.submit) for s in trace.serving if s.team == job.team)
        if need + others + serving <= nominal[job.team]:
            out.add(job.id)
    return out


def _forecast(s: Serving, now: float) -> tuple[tuple[float, int], ...]:
    first = math.floor(now / SERVING_STEP_S)
    return tuple((max(now, k * SERVING_STEP_S), s.forecast[min(k, len(s.forecast) - 1)])
                 for k in range(first, first + int(86400 // SERVING_STEP_S)) if k < len(s.forecast))


def _check_fits(nodes: Mapping[str, int], alloc: Allocation, policy: str, now: float) -> None:
    used: dict[str, int] = {}
    for placement in [*alloc.jobs.values(), *alloc.serving.values()]:
        for n, g in placement.items():
            if n not in nodes or g < 0:
                raise AssertionError(f"{policy} at {now:.0f}: bad placement on {n!r}")
            used[n] = used.get(n, 0) + g
    for n, g in used.items():
        if g > nodes[n]:
            raise AssertionError(f"{policy} at {now:.0f}: node {n} given {g} of {nodes[n]} GPUs")


# ---- traces ----

CURVES = (
    ((1, 1.0), (2, 1.9), (4, 3.6), (8, 6.6), (16, 11.0)),
    ((1, 1.0), (2, 1.8), (4, 3.2), (8, 5.2), (16, 7.0)),
    ((1, 1.0), (2, 1.95), (4, 3.8), (8, 7.4), (16, 14.0)),
)
KINDS = ("steady", "bursty", "deadline-heavy", "serving")


# The share of deadline jobs whose users set bestEffort (run without a guarantee if it cannot be given, rather
# than not at all), chosen before any run, not tuned: half of them. 0 gives the traces of before this field.
DEADLINE_BEST_EFFORT = 0.5


def make_trace(kind: str, seed: int, duration_s: float = 8 * 3600.0, nodes: int = 8, gpus_per_node: int = 8,
               load: float = 1.1, deadline_best_effort: float = DEADLINE_BEST_EFFORT) -> Trace:
    """A seeded multi-team trace on `nodes` x `gpus_per_node` GPUs, four teams of equal nominal share.

    steady: every team submits Poisson arrivals at `load` x its share. bursty: each team is busy for a stretch
    (2x its share) and quiet the rest of the time, at different times. deadline-heavy: steady, with tight
    deadlines (0.6-1.5x the duration at the requested size) and few best-effort jobs. serving: team "web" runs a
    serving deployment with a daily swing and an unannounced burst, the others train (bursty).

    `deadline_best_effort`: the chance that a deadline job's user sets bestEffort (run without a guarantee when
    none can be given). It is drawn from a random stream of its own, so the trace is otherwise the same."""
    if kind not in KINDS:
        raise ValueError(f"kind: unknown {kind!r}; choose from {', '.join(KINDS)}")
    rng = random.Random(f"{kind}-{seed}")
    choice_rng = random.Random(f"{kind}-{seed}-bestEffort")
    gpus = nodes * gpus_per_node
    names = ("web", "nlp", "vision", "research")
    teams = tuple(Team(n, gpus // 4, weight=2.0 if n == "research" else 1.0) for n in names)
    serving: list[Serving] = []
    slots = int(math.ceil(duration_s / SERVING_STEP_S)) + 1
    if kind == "serving":
        base = [max(2, round(6 + 5 * math.sin(2 * math.pi * k * SERVING_STEP_S / duration_s))) for k in range(slots)]
        burst_at = rng.randrange(slots // 4, slots // 2)
        demand = [min(16, d * 2) if burst_at <= k < burst_at + 4 else d for k, d in enumerate(base)]
        serving.append(Serving("web/chat", "web", tuple(2 * math.ceil(d / 2) for d in demand),
                               tuple(2 * math.ceil(d / 2) for d in base), 2, 16, 2))
    jobs: list[Job] = []
    factor = (0.6, 1.5) if kind == "deadline-heavy" else (0.9, 2.0)
    best_effort = 0.05 if kind == "deadline-heavy" else 0.25
    for t_index, team in enumerate(teams):
        if kind == "serving" and team.name == "web":
            continue
        if kind in ("bursty", "serving"):
            span = duration_s / len(teams)
            busy = (t_index * span * 0.8 + rng.uniform(0, span * 0.4), 0.0)
            busy = (busy[0], busy[0] + span * 1.2)
        else:
            busy = (0.0, duration_s)

        def intensity(t: float) -> float:
            if kind in ("bursty", "serving"):
                return 3.0 * load if busy[0] <= t < busy[1] else 0.15 * load
            return load

        t = 0.0
        i = 0
        mean_gpu_s = 4 * 1800.0  # about what one job offers (requested GPUs x duration), for the arrival rate
        peak = max(intensity(x) for x in (0.0, busy[0], duration_s - 1))
        while True:
            t += rng.expovariate(peak * team.nominal / mean_gpu_s)
            if t >= duration_s * 0.85:
                break
            if rng.random() > intensity(t) / peak:
                continue
            curve = rng.choice(CURVES)
            requested = rng.choice((1, 2, 2, 4, 4, 8))
            duration = min(6 * 3600.0, rng.lognormvariate(math.log(1500), 0.7))
            steps = max(10, round(duration * curve_rate(curve, requested)))
            deadline = None if rng.random() < best_effort else t + rng.uniform(*factor) * duration
            restore = rng.choice((30.0, 60.0, 90.0))
            jobs.append(Job(f"{team.name}/j{i}", team.name, round(t, 1), steps, deadline, curve,
                            min_gpus=max(1, requested // 2), max_gpus=min(16, requested * 4), requested=requested,
                            restore_s=restore, checkpoint_s=restore / 3,
                            checkpoint_every=max(1, round(900 * curve_rate(curve, requested))),
                            priority=rng.choice((0, 0, 0, 10)),
                            best_effort=deadline is not None and choice_rng.random() < deadline_best_effort))
            i += 1
    ordered = tuple(sorted(jobs, key=lambda j: (j.submit, j.id)))
    return Trace(kind, seed, nodes, gpus_per_node, duration_s, teams, ordered, tuple(serving))


def partition(trace: Trace) -> dict[str, dict[str, int]]:
    """Each team's own nodes for a static partition: its nominal share in whole nodes where it can, in order."""
    out: dict[str, dict[str, int]] = {}
    free = [(f"n{i:02d}", trace.gpus_per_node) for i in range(trace.nodes)]
    for team in trace.teams:
        want = team.nominal
        mine: dict[str, int] = {}
        while want > 0 and free:
            name, g = free.pop(0)
            take = min(g, want)
            mine[name] = take
            want -= take
            if g > take:
                free.insert(0, (name, g - take))
        out[team.name] = mine
    return out

