"""Teams' queues in the operator (pure: watched objects in, decisions and actions out).

`flotilla.tenancy.decide` says who holds which GPUs across queues; this module is the glue around it:

* which queue each TrainingJob and ServingDeployment is in (`spec.queue`, else the queue serving its
  namespace, else none), and what becomes of one whose queue does not exist or is malformed: it gets a
  condition that says so; one that holds no GPUs is not admitted, one that runs keeps what it holds (nothing is
  taken from it, nothing more given, and nobody else is given its GPUs) until its queue exists again;
* each Queue's status (usage, the `Valid` condition naming the field at fault, `Borrowing`, `Lending`);
* an Event on each job that gives GPUs back to their owner (a reclaim), and the reclaim named in the reason of
  the shrink itself, which the resharding protocol carries out as any other (checkpoint, smaller worker set).

A cluster with no Queue objects, whose jobs name none, is not touched by any of it (`read` answers None).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

from flotilla.allocation import JobDecision, JobState, Verdict
from flotilla.operator.actions import Action, PatchStatus, PostEvent, involved
from flotilla.operator import training
from flotilla.operator.training import set_condition
from flotilla.pool import ServingState
from flotilla.resources import names, queue
from flotilla.tenancy import IMPLICIT_QUEUE, QueueProblem, QueueSpec, queue_for

Body = Mapping[str, Any]


@dataclass(frozen=True)
class Placed:
    """The queue an object is in, and what is wrong with it (None: nothing)."""

    queue: str  # IMPLICIT_QUEUE when none
    reason: str = names.Reason.QUEUE_RESOLVED
    problem: str | None = None


@dataclass(frozen=True)
class Tenancy:
    """The Queue objects as one pass reads them."""

    specs: tuple[QueueSpec, ...]  # those that parse: what the decision is given
    broken: Mapping[str, str]  # queue -> "field: message", for one that does not parse
    bodies: Mapping[str, Body]  # queue name -> its object

    def place(self, namespace: str, requested: str | None) -> Placed:
        name = queue_for(namespace, requested, self.specs)
        if name is None:
            return Placed(IMPLICIT_QUEUE)
        if name in self.broken:
            return Placed(name, names.Reason.QUEUE_INVALID,
                          f"queue {name!r} is malformed ({self.broken[name]}): not admitted until it is mended")
        if not any(s.name == name for s in self.specs):
            return Placed(name, names.Reason.QUEUE_NOT_FOUND,
                          f"spec.queue: queue {name!r} does not exist: not admitted until it does")
        return Placed(name)


def read(queue_bodies: Mapping[str, Body], named: bool) -> Tenancy | None:
    """The queues; None when there are none and no job or deployment names one (`named`): the cluster then
    behaves as it did before queues existed."""
    if not queue_bodies and not named:
        return None
    specs, broken = [], {}
    for name, body in sorted(queue_bodies.items()):
        try:
            specs.append(queue.parse(body).spec)
        except ValueError as e:
            broken[name] = str(e)
    return Tenancy(tuple(specs), broken, dict(queue_bodies))


def names_a_queue(bodies: Iterable[Body]) -> bool:
    return any((b.get("spec") or {}).get("queue") for b in bodies)


def place(tenancy: Tenancy, body: Body) -> Placed:
    meta = body["metadata"]
    requested = (body.get("spec") or {}).get("queue")
    return tenancy.place(meta.get("namespace") or "default", requested if isinstance(requested, str) else None)


@dataclass(frozen=True)
class Assigned:
    """The decision's inputs once each object is in its queue."""

    jobs: tuple[JobState, ...]
    serving: tuple[ServingState, ...]
    waiting: Mapping[str, JobDecision]  # jobs left out: not started, and their queue is missing or malformed


def assign(tenancy: Tenancy, jobs: Sequence[JobState], servings: Sequence[ServingState],
           job_bodies: Mapping[str, Body], serving_bodies: Mapping[str, Body]) -> Assigned:
    """Each job and deployment in its queue (with its priority). A job whose queue is missing or malformed and
    that has not started waits, left out of the decision: `flotilla.tenancy.decide` does the same with such a
    job, but only when some queue exists, and a job may name one before any does. One that has started is given
    to the decision as it is (tenancy.decide keeps it running in the implicit queue: its queue went under it)."""
    kept: list[JobState] = []
    waiting: dict[str, JobDecision] = {}
    for j in jobs:
        body = job_bodies.get(j.key)
        where = place(tenancy, body) if body is not None else Placed(IMPLICIT_QUEUE)
        if where.problem is not None and j.verdict is None and not j.placement:
            waiting[j.key] = JobDecision(j.key, Verdict.PENDING, {}, f"waits: {where.problem}")
        else:
            kept.append(replace(j, queue=where.queue, priority=_priority(body)))
    serving = tuple(replace(s, queue=place(tenancy, body).queue if (body := serving_bodies.get(s.key)) else "",
                            priority=_priority(serving_bodies.get(s.key))) for s in servings)
    return Assigned(tuple(kept), serving, waiting)


def _priority(body: Body | None) -> int:
    value = ((body or {}).get("spec") or {}).get("priority", 0)
    return value if type(value) is int else 0


def onto_free_gpus(decisions: Mapping[str, JobDecision], jobs: Sequence[JobState],
                   free: Mapping[str, int]) -> dict[str, JobDecision]:
    """The decisions, except that a job grows (or starts) only onto GPUs free now: GPUs a reclaimed borrower
    gives back are promised to their owner's job once its old workers have left them, not while they still run
    there (the next pass places it). Until then the job keeps what it holds (a new one, admitted, waits)."""
    left = dict(free)
    have = {j.key: j.placement for j in jobs}
    out = dict(decisions)
    for key, d in sorted(decisions.items()):
        held = have.get(key, {})
        extra = {n: g - held.get(n, 0) for n, g in d.placement.items() if g > held.get(n, 0)}
        if not extra:
            continue
        if all(left.get(n, 0) >= g for n, g in extra.items()):
            for n, g in extra.items():
                left[n] -= g
        else:
            out[key] = replace(d, placement=dict(held),
                               reason=f"waits for GPUs being given back to be free: {d.reason}")
    return out


def reclaim_reason(reclaim: Any) -> str:
    """How the job's shrink and its Events name a reclaim."""
    return (f"reclaim: gives {reclaim.gpus} GPUs back to queue {reclaim.to_queue!r} through a checkpoint "
            f"({reclaim.reason})")


def with_reclaims(decisions: Mapping[str, JobDecision], reclaims: Sequence[Any]) -> dict[str, JobDecision]:
    """The decisions with each reclaimed job's reason naming the reclaim (its checkpoint request, its
    Resharding Event and its status message then say why it shrinks)."""
    out = dict(decisions)
    for r in reclaims:
        d = out.get(r.job)
        if d is not None and "reclaim" not in d.reason:
            out[r.job] = replace(d, reason=f"{reclaim_reason(r)}; {d.reason}")
    return out


def reclaim_events(reclaims: Sequence[Any], jobs: Mapping[str, Body], servings: Mapping[str, Body],
                   stopped: Iterable[str]) -> dict[str, PostEvent]:
    """One Event per reclaim, on the job (or deployment) that gives GPUs back; keyed by the object's key.
    `stopped`: the jobs the reclaim leaves with no GPUs; one with no checkpoint configured (no
    spec.checkpoint.intervalSteps) is stopped, and loses what it did: its Event says so."""
    stopped = set(stopped)
    out: dict[str, PostEvent] = {}
    for r in reclaims:
        body = jobs.get(r.job) or servings.get(r.job)
        if body is None:
            continue
        if r.job in stopped and not _checkpoints(jobs.get(r.job)):
            out[r.job] = PostEvent(involved(body), "Warning", names.Reason.RECLAIM_STOPS,
                                   f"stopped to give {r.gpus} GPUs back to queue {r.to_queue!r} ({r.reason}): it "
                                   "has no checkpoint (spec.checkpoint), so it loses its progress")
        else:
            out[r.job] = PostEvent(involved(body), "Normal", names.Reason.RECLAIMED, reclaim_reason(r))
    return out


def _checkpoints(body: Body | None) -> bool:
    interval = (((body or {}).get("spec") or {}).get("checkpoint") or {}).get("intervalSteps")
    return type(interval) is int and interval > 0


def reclaim_key(reclaim: Any) -> tuple[str, str, str, int]:
    return (reclaim.job, reclaim.from_queue, reclaim.to_queue, reclaim.gpus)


# Object status: what the pass writes of the queue onto each job and deployment.

def object_status(body: Body, where: Placed, now: float) -> dict[str, Any]:
    """status.queue and the QueueResolved condition, as far as they differ from what the object has."""
    status = body.get("status") or {}
    patch: dict[str, Any] = {}
    if where.queue and status.get("queue") != where.queue:
        patch["queue"] = where.queue
    elif not where.queue and status.get("queue"):
        patch["queue"] = None
    if where.problem is not None:
        want = {"type": names.COND_QUEUE, "status": "False", "reason": where.reason, "message": where.problem}
    elif where.queue:
        want = {"type": names.COND_QUEUE, "status": "True", "reason": where.reason,
                "message": f"counts against queue {where.queue!r}"}
    else:
        had = any(c.get("type") == names.COND_QUEUE for c in status.get("conditions") or [])
        if not had:
            return patch
        want = {"type": names.COND_QUEUE, "status": "True", "reason": where.reason,
                "message": "no queue serves its namespace: it counts against the cluster as a whole"}
    have = next((c for c in status.get("conditions") or [] if c.get("type") == names.COND_QUEUE), None)
    if have is None or any(have.get(k) != v for k, v in want.items()):
        patch["conditions"] = set_condition(status, want, now)
    return patch


def merge_status(actions: list[Action], plural: str, body: Body, patch: Mapping[str, Any], now: float) -> list[Action]:
    """`actions` with `patch` folded into the object's status patch (or a new one first): one write, and the
    conditions the plan already changes kept."""
    if not patch:
        return actions
    meta = body["metadata"]
    for i, a in enumerate(actions):
        if isinstance(a, PatchStatus) and a.plural == plural and a.name == meta["name"]:
            merged = {**a.status, **{k: v for k, v in patch.items() if k != "conditions"}}
            if "conditions" in patch:
                base = {"conditions": a.status.get("conditions", (body.get("status") or {}).get("conditions"))}
                mine = next(c for c in patch["conditions"] if c.get("type") == names.COND_QUEUE)
                merged["conditions"] = set_condition(base, {k: v for k, v in mine.items()
                                                            if k != "lastTransitionTime"}, now)
            return [*actions[:i], PatchStatus(a.plural, a.namespace, a.name, merged), *actions[i + 1:]]
    return [PatchStatus(plural, meta.get("namespace") or "", meta["name"], dict(patch)), *actions]


# Queue status.

USAGE_FIELDS = ("nominal", "used", "borrowed", "lent", "admitted", "pending", "guaranteed")


@dataclass
class _QueueView:
    fields: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def queue_status(tenancy: Tenancy, usage: Mapping[str, Any], problems: Sequence[QueueProblem],
                 now: float) -> list[tuple[str, str, list[Action]]]:
    """("queues", name, [its status patch]) for every Queue whose status differs from what the decision says."""
    views: dict[str, _QueueView] = {name: _QueueView() for name in tenancy.bodies}
    for name, message in tenancy.broken.items():
        views[name].problems.append(message)
    for p in problems:
        if p.queue in views:
            views[p.queue].problems.append(f"{queue.crd_field(p.field)}: {p.message}")
    out: list[tuple[str, str, list[Action]]] = []
    for name, body in sorted(tenancy.bodies.items()):
        status = body.get("status") or {}
        u = usage.get(name)
        want: dict[str, Any] = {f: int(getattr(u, f)) for f in USAGE_FIELDS} if u is not None else {}
        if u is None and name not in tenancy.broken:
            spec = next((s for s in tenancy.specs if s.name == name), None)
            if spec is not None:
                want["nominal"] = spec.quota().nominal
        generation = body["metadata"].get("generation")
        if generation is not None:
            want["observedGeneration"] = generation
        patch = {k: v for k, v in want.items() if status.get(k) != v}
        conditions = _changed_conditions(status, _queue_conditions(views[name].problems, want), now)
        if conditions is not None:
            patch["conditions"] = conditions
        if patch:
            out.append(("queues", name, [PatchStatus(queue.PLURAL, "", name, patch)]))
    return out


def _changed_conditions(status: Mapping[str, Any], conditions: Sequence[dict[str, Any]], now: float
                        ) -> list[dict[str, Any]] | None:
    """status.conditions with `conditions` set in it; None when it already says all of them."""
    base: Mapping[str, Any] = status
    changed = False
    for c in conditions:
        have = next((x for x in base.get("conditions") or [] if x.get("type") == c["type"]), None)
        if have is None or any(have.get(k) != v for k, v in c.items()):
            base = {**base, "conditions": set_condition(base, c, now)}
            changed = True
    return list(base["conditions"]) if changed else None


def _queue_conditions(problems: Sequence[str], usage: Mapping[str, Any]) -> list[dict[str, Any]]:
    valid = ({"type": names.COND_VALID, "status": "False", "reason": names.Reason.INVALID_SPEC,
              "message": "; ".join(problems)[:4096]} if problems else
             {"type": names.COND_VALID, "status": "True", "reason": names.Reason.QUEUE_VALID, "message": ""})
    out = [valid]
    if "borrowed" in usage:
        borrowed, lent, nominal = usage["borrowed"], usage["lent"], usage["nominal"]
        out.append({"type": names.COND_BORROWING, "status": "True" if borrowed else "False",
                    "reason": names.Reason.BORROWED_GPUS if borrowed else names.Reason.WITHIN_SHARE,
                    "message": f"uses {usage['used']} GPUs, {borrowed} beyond its nominal {nominal}: they go back "
                               "through checkpoints when their owners need them" if borrowed else ""})
        out.append({"type": names.COND_LENDING, "status": "True" if lent else "False",
                    "reason": names.Reason.LENT_GPUS if lent else names.Reason.WITHIN_SHARE,
                    "message": f"other queues use {lent} of its {nominal} nominal GPUs" if lent else ""})
    return out


# One pass.

@dataclass
class Glue:
    """What a reconcile pass adds for queues, and the little it remembers between passes: the last tenancy
    decision (Queue status is written from it every pass it differs) and the reclaims already announced (an
    Event each, once; after a restart, once more: Events count repeats)."""

    usage: Mapping[str, Any] = field(default_factory=dict)
    problems: tuple[QueueProblem, ...] = ()
    reclaims: tuple[Any, ...] = ()
    emptied: frozenset[str] = frozenset()  # reclaimed jobs the decision leaves with no GPUs
    announced: set[tuple[str, str, str, int]] = field(default_factory=set)
    fresh: tuple[Any, ...] = ()  # the reclaims the last `finish` announced (their Events are in its actions)

    def decided(self, tenant: Any | None) -> None:
        """A new decision (a `flotilla.tenancy.TenantDecision`, or None when the queues took no part)."""
        self.usage = dict(tenant.queues) if tenant is not None else {}
        self.problems = tuple(tenant.problems) if tenant is not None else ()
        self.reclaims = tuple(tenant.reclaims) if tenant is not None else ()
        self.emptied = frozenset(r.job for r in self.reclaims if tenant is not None
                                 and (d := tenant.pool.jobs.get(r.job)) is not None and not d.placement)

    def finish(self, out: list[tuple[str, str, list[Action]]], tenancy: Tenancy | None, jobs: Mapping[str, Body],
               servings: Mapping[str, Body], busy: Iterable[str], now: float,
               job_plural: str, serving_plural: str) -> list[tuple[str, str, list[Action]]]:
        """`out` (the pass's actions per object) with each object's queue in its status, reclaim Events, and the
        Queues' status."""
        if tenancy is None:
            self.announced.clear()
            self.fresh = ()
            return out
        busy = set(busy)
        index = {(kind, key): i for i, (kind, key, _) in enumerate(out)}

        def add(kind: str, key: str, change: Any) -> None:
            i = index.get((kind, key))
            if i is None:
                index[(kind, key)] = len(out)
                out.append((kind, key, change([])))
            else:
                out[i] = (kind, key, change(out[i][2]))

        for kind, plural, bodies in (("jobs", job_plural, jobs), ("servings", serving_plural, servings)):
            for key, body in bodies.items():
                if kind == "jobs" and (key in busy or training.is_final(body)):
                    continue
                patch = object_status(body, place(tenancy, body), now)
                if patch:
                    add(kind, key, lambda acts, b=body, p=plural, pt=patch: merge_status(acts, p, b, pt, now))
        current = {reclaim_key(r) for r in self.reclaims}
        self.announced &= current
        new = [r for r in self.reclaims if reclaim_key(r) not in self.announced and r.job not in busy]
        events = reclaim_events(new, jobs, servings, self.emptied)
        self.fresh = tuple(r for r in new if r.job in events)
        for r in self.reclaims:
            if r.job in events:
                self.announced.add(reclaim_key(r))
        for key, event in events.items():
            add("jobs" if key in jobs else "servings", key, lambda acts, e=event: [*acts, e])
        return out + queue_status(tenancy, self.usage, self.problems, now)
