"""The resharding protocol: one TrainingJob's next transition, from its view, its worker pods, the allocator's
decision and the time. Pure: it returns the writes to make and the events to record; the operator renders the
pods and applies them (flotilla.operator.training).

A running job changes placement only at a checkpoint, in rounds of writes, each idempotent and each read back
from the object the next pass sees (so that a restart at any point resumes):

1. REQUEST: the checkpoint-request annotation and status.checkpoint.requestedGeneration (phase Resharding);
2. AWAIT: rank 0 writes the checkpoint and the ack annotation; the acknowledgement is recorded in
   status.checkpoint (generation, step). A request marked `restart`, or no acknowledgement within the ack
   timeout, moves on without one (the workers resume from the last checkpoint written);
3. SWITCH: status.placement and status.workerGeneration take the new worker set (status first), the old set's
   pods are deleted;
4. the new set's pods are created on each node once no pod of an old set holds GPUs there (RUN completes them).

A worker set that never ran is replaced at once (MOVE: nothing to checkpoint). A failed worker restarts the set
from the last checkpoint (RESTART, counted in status.restarts, not status.reshards) until `max_restarts`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Iterable, Mapping, Sequence

from flotilla.allocation import JobDecision, JobState, Verdict
from flotilla.reshard.encoding import next_request_generation, request_annotation, rfc3339
from flotilla.reshard.view import JobView, WorkerPod
from flotilla.resources import names, phases
from flotilla.resources.parse import parse_time

ACK_TIMEOUT_SECONDS = 120.0  # rank 0's time to acknowledge a checkpoint request before the workers are replaced
# Status is for people and costs the API server a write each time: what changes often is written only when
# it is worth one. Rank 0's progress: at a new checkpoint, else at most once a minute (planning reads the
# annotation). A job's first moments: a job placed within QUIET_SECONDS of its creation is written once,
# admitted and placed, without a Pending before; workers that started less than QUIET_SECONDS ago are
# recorded Running with the next write or once that time has passed (a job that ends first goes from
# Admitted to Succeeded in one write, its startedAt taken from its pods).
PROGRESS_EVERY_SECONDS = 60.0
QUIET_SECONDS = 10.0


class Step(str, Enum):
    """What a pass does to the job: the protocol's explicit phases."""

    IDLE = "idle"  # finished, or created a moment ago (a quiet start): nothing to write
    REJECT = "reject"
    WAIT_FOR_GPUS = "wait-for-gpus"  # admitted or not, no placement yet (phase Pending)
    PLACE = "place"  # the first worker set
    MOVE = "move"  # a worker set that never ran goes elsewhere at once
    REQUEST = "request-checkpoint"
    AWAIT = "await-checkpoint"
    SWITCH = "switch"  # checkpoint written (or timed out, or a restart request): the new worker set
    REPLACE = "replace-in-place"  # checkpoint written, the decision no longer moves the job: a new set where it is
    RESTART = "restart"  # a worker failed: a new set from the last checkpoint
    FAIL = "fail"
    SUCCEED = "succeed"
    RUN = "run"  # keep the worker set whole, record its phase and progress


class Cause(str, Enum):
    """Why a worker set is replaced: what status counts and Events say."""

    PLACE = "place"
    RESHARD = "reshard"
    RESTART = "restart"


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str  # names.Reason
    message: str


@dataclass(frozen=True)
class CreateWorker:
    """Create rank `rank` of worker set `worker_set` laid out on `placement` (node -> GPUs)."""

    worker_set: int
    rank: int
    placement: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class DeleteWorker:
    name: str
    uid: str | None  # a precondition: only the pod that was seen


@dataclass(frozen=True)
class ApplyRendezvous:
    """The job's headless Service, applied with the creation of a worker set of more than one worker."""


Effect = Event | CreateWorker | DeleteWorker | ApplyRendezvous


@dataclass(frozen=True)
class Settings:
    policy: str  # the allocator's name, recorded in status.policy
    ack_timeout: float = ACK_TIMEOUT_SECONDS
    max_restarts: int = 3
    lending: Mapping[str, int] = field(default_factory=dict)  # serving key -> GPUs this job's shrink lends it


@dataclass
class Transition:
    """One pass's writes: the status merge-patch (`lazy`: only with another change), the annotations, then the
    effects in order."""

    step: Step
    status: dict[str, Any] = field(default_factory=dict)
    lazy: dict[str, Any] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    effects: list[Effect] = field(default_factory=list)

    @property
    def events(self) -> list[Event]:
        return [e for e in self.effects if isinstance(e, Event)]


def set_condition(status: Mapping[str, Any], new: dict[str, Any], now: float) -> list[dict[str, Any]]:
    """Conditions with `new` merged in; lastTransitionTime moves only when status changes."""
    out, found = [], False
    for c in status.get("conditions") or []:
        if c.get("type") == new["type"]:
            found = True
            merged = {**c, **new}
            merged["lastTransitionTime"] = (c.get("lastTransitionTime") if c.get("status") == new["status"]
                                            else rfc3339(now))
            out.append(merged)
        else:
            out.append(c)
    if not found:
        out.append({**new, "lastTransitionTime": rfc3339(now)})
    return out


def ref(kind: str, key: str, namespace: str) -> str:
    """"sd/name" for an object in `namespace`, "sd/other-ns/name" otherwise."""
    ns, _, name = key.rpartition("/")
    return f"{kind}/{name}" if ns == namespace else f"{kind}/{key}"


def describe(placement: Mapping[str, int]) -> str:
    return ", ".join(f"{n}:{g}" for n, g in sorted(placement.items())) or "none"


def _unix(value: str) -> float:
    return parse_time(value, "time") or 0.0


class _Pass:
    """Accumulates one job's transition."""

    def __init__(self, job: JobView, state: JobState, now: float, settings: Settings):
        self.job, self.state, self.now, self.settings = job, state, now, settings
        self.status = job.status
        self.out = Transition(Step.RUN)

    @property
    def patch(self) -> dict[str, Any]:
        return self.out.status

    def event(self, type_: str, reason: str, message: str) -> None:
        self.out.effects.append(Event(type_, reason, message))

    def condition(self, type_: str, status: str, reason: str, message: str) -> None:
        base = {**self.status, "conditions": self.patch.get("conditions", self.status.get("conditions"))}
        self.patch["conditions"] = set_condition(base, {"type": type_, "status": status, "reason": reason,
                                                        "message": message}, self.now)

    def checkpoint(self, **fields: Any) -> None:
        self.patch["checkpoint"] = {**self.recorded_checkpoint(), **fields}

    def recorded_checkpoint(self) -> dict[str, Any]:
        """status.checkpoint as this pass's patch leaves it."""
        return {**(self.status.get("checkpoint") or {}), **self.patch.get("checkpoint", {})}

    def done(self, step: Step, *, keep_creates: bool = True) -> Transition:
        self.out.step = step
        if not keep_creates:
            self.out.effects = [e for e in self.out.effects if not isinstance(e, (CreateWorker, ApplyRendezvous))]
        return self.out


def transition(job: JobView, state: JobState, pods: Iterable[WorkerPod], decision: JobDecision | None, now: float,
               settings: Settings) -> Transition:
    """The writes that bring one TrainingJob's worker set and status in line with `decision` (see the module).
    `state`: the allocator's view of the job (flotilla.operator.training.job_state)."""
    if job.phase in phases.TRAINING_FINAL:
        return Transition(Step.IDLE)
    p = _Pass(job, state, now, settings)
    _bookkeeping(p)
    by_set: dict[int, list[WorkerPod]] = {}
    for pod in pods:
        by_set.setdefault(pod.worker_set, []).append(pod)
    _note_external_request(p)
    _consume_acknowledgement(p)
    _record_share(p, decision)
    want = dict(decision.placement) if decision else {}
    reason = decision.reason if decision else "waiting for the allocator"
    if not job.placement:
        return _unplaced(p, by_set, decision.verdict if decision else Verdict.PENDING, want, reason)
    if want and want != job.placement:
        return _move(p, by_set, want, reason)
    if _acknowledged_now(p):
        # Rank 0 wrote the checkpoint it was asked for, and its worker set stopped to be replaced, but the
        # decision no longer moves the job (it changed since the request): replace the set where it is.
        _switch(p, by_set, job.placement, job.worker_set + 1,
                f"checkpoint written; staying on {describe(job.placement)}", Cause.RESHARD)
        return p.done(Step.REPLACE)
    return _keep_running(p, by_set, job.placement, job.worker_set)


def _bookkeeping(p: _Pass) -> None:
    status, job = p.status, p.job
    if status.get("observedGeneration") != job.spec_generation:
        p.patch["observedGeneration"] = job.spec_generation
    if not status.get("deadline"):
        p.patch["deadline"] = rfc3339(p.state.deadline)
    if status.get("policy") != p.settings.policy:
        p.patch["policy"] = p.settings.policy


def _record_share(p: _Pass, decision: JobDecision | None) -> None:
    if decision and decision.verdict is Verdict.ADMITTED and decision.share != p.state.share:
        # The allocator's input next pass (JobState.share). A larger share is written at once; a smaller one
        # (a job ahead of its plan) with the next write: until then the re-plan falls back on the larger.
        (p.patch if decision.share > p.state.share else p.out.lazy)["guaranteedShare"] = decision.share


def _unplaced(p: _Pass, by_set: Mapping[int, list[WorkerPod]], verdict: Verdict, want: Mapping[str, int],
              reason: str) -> Transition:
    status = p.status
    if verdict is Verdict.REJECTED:
        if status.get("phase") != phases.REJECTED:
            p.patch.update(phase=phases.REJECTED, message=reason, gpus=0)
            p.condition(names.COND_ADMITTED, "False", names.Reason.REJECTED, reason)
            p.event("Warning", names.Reason.REJECTED, reason)
        return p.done(Step.REJECT)
    if want:
        p.patch["phase"] = phases.ADMITTED
        admitted = names.Reason.BEST_EFFORT if verdict is Verdict.BEST_EFFORT else names.Reason.ADMITTED
        p.condition(names.COND_ADMITTED, "True", admitted, reason)
        _switch(p, by_set, want, p.job.worker_set, reason, Cause.PLACE)
        return p.done(Step.PLACE)
    if not status.get("phase") and p.now - p.job.created < QUIET_SECONDS:
        return Transition(Step.IDLE)  # it may be placed in a moment: one write then, admitted and placed
    if verdict is Verdict.BEST_EFFORT and _admitted_reason(status) != names.Reason.BEST_EFFORT:
        # Admission is decided once: a best-effort job waiting for idle GPUs says so, and stays best-effort.
        p.condition(names.COND_ADMITTED, "True", names.Reason.BEST_EFFORT, reason)
    if status.get("phase") != phases.PENDING or status.get("message") != reason:
        p.patch.update(phase=phases.PENDING, message=reason, gpus=0)
    return p.done(Step.WAIT_FOR_GPUS)


def _admitted_reason(status: Mapping[str, Any]) -> str | None:
    return next((c.get("reason") for c in status.get("conditions") or () if c.get("type") == names.COND_ADMITTED),
                None)


def _move(p: _Pass, by_set: Mapping[int, list[WorkerPod]], want: Mapping[str, int], reason: str) -> Transition:
    job = p.job
    workers = by_set.get(job.worker_set, [])
    # Workers need every rank: until all have run together there is no progress to checkpoint.
    ran = not has_not_run(p.status) or (bool(workers) and all(w.phase == "Running" for w in workers))
    if not ran:
        _switch(p, by_set, want, job.worker_set + 1, reason, Cause.RESHARD)
        return p.done(Step.MOVE)
    step = _drive_checkpoint(p, reason)
    if step is Step.SWITCH:
        _switch(p, by_set, want, job.worker_set + 1, reason, Cause.RESHARD)
        return p.done(Step.SWITCH)
    out = _keep_running(p, by_set, job.placement, job.worker_set, resharding=True)
    if out.step is Step.RUN:
        out.step = step
    return out


def has_not_run(status: Mapping[str, Any]) -> bool:
    """The current worker set has not had all its workers running: admitted and not yet Running, or
    switched to a new worker set (not waiting for rank 0's checkpoint on the old one)."""
    ckpt = status.get("checkpoint") or {}
    waiting = int(ckpt.get("requestedGeneration", 0)) > int(ckpt.get("generation", 0))
    return status.get("phase") == phases.ADMITTED or (status.get("phase") == phases.RESHARDING and not waiting)


def _acknowledged_now(p: _Pass) -> bool:
    """This pass records rank 0's acknowledgement of the last checkpoint request (the workers stopped)."""
    ckpt = p.recorded_checkpoint()
    return ("generation" in p.patch.get("checkpoint", {})
            and int(ckpt.get("generation", 0)) == int(ckpt.get("requestedGeneration", 0)) > 0)


def _note_external_request(p: _Pass) -> None:
    """A checkpoint request the operator did not make (controller, admin) becomes the outstanding one."""
    request, ckpt = p.job.request, p.job.checkpoint
    if request and request.generation > max(ckpt.requested, ckpt.written):
        p.checkpoint(requestedGeneration=request.generation, requestedAt=request.time or rfc3339(p.now),
                     reason=request.reason)
        p.event("Normal", names.Reason.CHECKPOINT_REQUESTED,
                f"checkpoint generation {request.generation} requested by {request.requested_by}: {request.reason}")


def _consume_acknowledgement(p: _Pass) -> None:
    """Record a checkpoint that rank 0 has acknowledged (once)."""
    ack, ckpt = p.job.ack, p.job.checkpoint
    if ack and ckpt.written < ack.generation <= ckpt.requested:
        p.checkpoint(generation=ack.generation, step=ack.step, time=ack.time or rfc3339(p.now))
        p.event("Normal", names.Reason.CHECKPOINT_WRITTEN,
                f"rank 0 wrote checkpoint generation {ack.generation} at step {ack.step}")


def _drive_checkpoint(p: _Pass, reason: str) -> Step:
    """Drive the checkpoint request for a placement change: SWITCH once the workers may be replaced, else
    REQUEST (asked now) or AWAIT."""
    ckpt = p.recorded_checkpoint()
    written, requested = int(ckpt.get("generation", 0)), int(ckpt.get("requestedGeneration", 0))
    request = p.job.request
    if requested > written:
        if request and request.restart:
            return Step.SWITCH
        asked_at = _unix(ckpt.get("requestedAt") or rfc3339(p.now))
        if request is None or request.generation < requested:
            # Recorded in status, but the operator stopped before the annotation rank 0 reads was written.
            p.out.annotations.update(request_annotation(requested, ckpt.get("reason") or reason, asked_at))
        timeout = p.settings.ack_timeout
        if p.now - asked_at > timeout:
            p.event("Warning", names.Reason.RESTART_FROM_CHECKPOINT,
                    f"rank 0 did not acknowledge checkpoint generation {requested} within {timeout:.0f}s")
            return Step.SWITCH
        message = f"waiting for rank 0 to write checkpoint generation {requested}: {ckpt.get('reason') or reason}"
        if p.status.get("message") != message:
            p.patch.update(phase=phases.RESHARDING, message=message)
        return Step.AWAIT
    if requested == written and written and ckpt.get("step") is not None and p.patch.get("checkpoint"):
        return Step.SWITCH  # acknowledged in this very pass
    generation = next_request_generation(written, requested, request.generation if request else 0)
    p.out.annotations.update(request_annotation(generation, reason, p.now))
    p.checkpoint(requestedGeneration=generation, requestedAt=rfc3339(p.now), reason=reason)
    p.patch.update(phase=phases.RESHARDING, message=f"checkpoint requested to change size: {reason}")
    p.event("Normal", names.Reason.CHECKPOINT_REQUESTED, f"checkpoint generation {generation}: {reason}")
    return Step.REQUEST


def _switch(p: _Pass, by_set: Mapping[int, list[WorkerPod]], want: Mapping[str, int], worker_set: int,
            reason: str, cause: Cause) -> None:
    """Record the new placement (status first), then replace the worker set."""
    old = p.job.placement
    if old:
        ckpt = p.recorded_checkpoint()
        resume = int(ckpt.get("step", 0))
        if int(ckpt.get("requestedGeneration", 0)) > int(ckpt.get("generation", 0)):
            p.checkpoint(generation=int(ckpt["requestedGeneration"]))  # consumed, acknowledged or not
        lost = max(0, int((p.job.progress or {}).get("steps", resume)) - resume)
        # The old worker set's rate says nothing of the new size: 0 until rank 0 reports again.
        p.patch["progress"] = {"steps": resume, "stepsPerSecond": 0.0, "updatedAt": rfc3339(p.now)}
        p.patch.update(workerGeneration=worker_set, phase=phases.RESHARDING)
        if cause is Cause.RESHARD:
            p.patch["reshards"] = p.job.reshards + 1
        what = "restarting" if cause is Cause.RESTART else "resharding"
        p.event("Normal", names.Reason.RESTART_FROM_CHECKPOINT if cause is Cause.RESTART else names.Reason.RESHARDING,
                f"{what} from {sum(old.values())} to {sum(want.values())} GPUs ({describe(want)}), resuming at step "
                f"{resume}" + (f", {lost} steps lost" if lost else "") + f": {reason}")
        _settle_loans(p, sum(old.values()), sum(want.values()))
    gpus = sum(want.values())
    p.patch.update(placement=[{"node": n, "gpus": g} for n, g in sorted(want.items())], gpus=gpus,
                   workers=gpus // p.state.gpus_per_worker, message=reason)
    p.patch.update(outlook(p.job, p.state, gpus, p.now))
    _retire_old(p, by_set, worker_set)
    _create_when_free(p, by_set, worker_set, want, ranks=None)


def _retire_old(p: _Pass, by_set: Mapping[int, list[WorkerPod]], worker_set: int) -> None:
    """Delete the job's pods of other worker sets, each with its own grace period (the API server keeps a
    terminating pod, and the scheduler its GPUs, until its containers are gone), and only the pod seen (UID)."""
    p.out.effects.extend(DeleteWorker(w.name, w.uid) for s, ws in by_set.items() if s != worker_set
                         for w in ws if not w.terminating)


def rank_nodes(placement: Mapping[str, int], gpus_per_worker: int) -> list[str]:
    """The node of each rank: one worker per `gpus_per_worker` GPUs, ranks in node order."""
    return [node for node in sorted(placement) for _ in range(placement[node] // gpus_per_worker)]


def _create_when_free(p: _Pass, by_set: Mapping[int, list[WorkerPod]], worker_set: int,
                      placement: Mapping[str, int], ranks: Sequence[int] | None) -> list[str]:
    """Create the workers of `worker_set` (`ranks`, or all of them), each once no pod of another worker set of
    this job holds GPUs on its node: the new worker must not start on GPUs whose old containers are still
    terminating. Returns the nodes it waits for (a later pass creates the rest when the old pods are gone)."""
    busy = {w.node for s, ws in by_set.items() if s != worker_set for w in ws if w.holds_gpus}
    nodes = rank_nodes(placement, p.state.gpus_per_worker)
    frozen = tuple(sorted(placement.items()))
    waiting, creating = set(), False
    for rank in (range(len(nodes)) if ranks is None else ranks):
        if nodes[rank] in busy:
            waiting.add(nodes[rank])
        else:
            p.out.effects.append(CreateWorker(worker_set, rank, frozen))
            creating = True
    # Applied with every pod creation of a set that needs it: idempotent, and there before rank 0 is looked up.
    if creating and len(nodes) > 1:
        p.out.effects.append(ApplyRendezvous())
    return sorted(waiting)


def _settle_loans(p: _Pass, before: int, after: int) -> None:
    """status.lentTo: a shrink made for serving adds what it lends; growing back pays loans off, oldest key first."""
    ledger = dict(p.job.lent_to)
    ns = p.job.namespace
    lending = p.settings.lending
    if after < before and lending:
        left = before - after
        for sd, g in sorted(lending.items()):
            g = min(g, left)
            if g:
                left -= g
                ledger[sd] = ledger.get(sd, 0) + g
                p.event("Normal", names.Reason.LENT_GPUS, f"lent {g} GPUs to {ref('sd', sd, ns)} ({ledger[sd]} in all)")
    elif after > before and ledger:
        back = after - before
        for sd in sorted(ledger):
            g = min(ledger[sd], back)
            if g:
                back -= g
                ledger[sd] -= g
                p.event("Normal", names.Reason.GOT_GPUS_BACK, f"got {g} GPUs back from {ref('sd', sd, ns)}")
    else:
        return
    p.patch["lentTo"] = [{"serving": sd, "gpus": g} for sd, g in sorted(ledger.items()) if g]


def _keep_running(p: _Pass, by_set: Mapping[int, list[WorkerPod]], current: Mapping[str, int], worker_set: int,
                  resharding: bool = False) -> Transition:
    """On the recorded placement: keep the worker set whole and derive the phase from it. `resharding`: the
    workers wait for rank 0's checkpoint to move (phase Resharding, not Running again)."""
    _retire_old(p, by_set, worker_set)
    mine = {w.rank: w for w in by_set.get(worker_set, [])}
    world = len(rank_nodes(current, p.state.gpus_per_worker))
    missing = [r for r in range(world) if r not in mine]
    held_up = _create_when_free(p, by_set, worker_set, current, missing) if missing else []
    failed = sorted((w for w in mine.values() if w.phase == "Failed"), key=lambda w: w.name)
    if failed:
        return _worker_failed(p, by_set, current, worker_set, failed[0].name, list(mine.values()))
    if (rank0 := mine.get(0)) is not None and rank0.phase == "Succeeded":
        return _succeeded(p, list(mine.values()))
    all_running = len(mine) == world and all(w.phase == "Running" for w in mine.values())
    waiting = resharding or p.patch.get("phase") == phases.RESHARDING
    if held_up and not waiting:
        msg = f"waiting for the previous worker set's pods to terminate on {', '.join(held_up)}"
        if p.status.get("message") != msg:
            p.patch["message"] = msg
    _mirror_progress(p)
    if all_running and not waiting:
        _record_running(p, list(mine.values()), current)
    _refresh_outlook(p, sum(current.values()))
    return p.done(Step.RUN)


def _worker_failed(p: _Pass, by_set: Mapping[int, list[WorkerPod]], current: Mapping[str, int], worker_set: int,
                   failed: str, mine: list[WorkerPod]) -> Transition:
    restarts, limit = p.job.restarts, p.settings.max_restarts
    if restarts < limit:
        why = f"worker pod {failed} failed; restart {restarts + 1} of {limit} from the last checkpoint"
        p.patch["restarts"] = restarts + 1
        p.event("Warning", names.Reason.WORKER_FAILED, why)
        _switch(p, by_set, current, worker_set + 1, why, Cause.RESTART)
        return p.done(Step.RESTART)
    why = f"worker pod {failed} failed after {restarts} restarts"
    p.patch.update(phase=phases.FAILED, message=why)
    p.condition(names.COND_READY, "False", names.Reason.WORKER_FAILED, why)
    p.event("Warning", names.Reason.WORKER_FAILED, why)
    p.out.effects.extend(DeleteWorker(w.name, w.uid) for w in mine if w.phase not in ("Failed", "Succeeded"))
    return p.done(Step.FAIL, keep_creates=False)


def _succeeded(p: _Pass, mine: list[WorkerPod]) -> Transition:
    met = p.now <= p.state.deadline
    p.patch.update(phase=phases.SUCCEEDED, message="rank 0 exited successfully", gpus=0,
                   estimatedCompletion=rfc3339(p.now), deadlineMet=met)
    if not p.status.get("startedAt") and (started := workers_started(mine)) is not None:
        p.patch["startedAt"] = rfc3339(started)
    if p.job.progress:
        p.patch["progress"] = dict(p.job.progress)
    p.condition(names.COND_READY, "False", names.Reason.SUCCEEDED, f"finished; deadline {'met' if met else 'missed'}")
    return p.done(Step.SUCCEED, keep_creates=False)


def _record_running(p: _Pass, mine: list[WorkerPod], current: Mapping[str, int]) -> None:
    started = workers_started(mine)
    if p.status.get("phase") != phases.RUNNING and (
            p.patch or started is None or p.now - started >= QUIET_SECONDS):
        msg = f"{len(mine)} workers running on {describe(current)}"
        p.patch.update(phase=phases.RUNNING, message=msg)
        if not p.status.get("startedAt"):
            p.patch["startedAt"] = rfc3339(min(started or p.now, p.now))
        p.condition(names.COND_READY, "True", names.Reason.WORKERS_RUNNING, msg)


def _refresh_outlook(p: _Pass, gpus: int) -> None:
    view = outlook(p.job, p.state, gpus, p.now)
    # The outlook moves with every progress report: refresh it with a patch made anyway, or when it flips.
    if p.patch or view.get("deadlineMet") != p.status.get("deadlineMet"):
        p.patch.update({k: v for k, v in view.items() if p.status.get(k) != v})


def workers_started(pods: Iterable[WorkerPod]) -> float | None:
    """When the last of a worker set's pods started; None if one has not said."""
    times = [w.started for w in pods]
    return max(t for t in times if t is not None) if times and all(t is not None for t in times) else None


def _mirror_progress(p: _Pass) -> None:
    """Copy rank 0's report into status: a new checkpoint at once (restarts resume from it), plain
    progress every PROGRESS_EVERY_SECONDS from the start (planning reads the annotation, status is for people;
    a job shorter than that gets its progress recorded when it finishes), or with a write made anyway."""
    progress = dict(p.job.progress or {})
    mirrored = p.job.recorded_progress
    measured = progress.pop("restoreSeconds", None)
    if measured is not None and measured != (p.status.get("checkpoint") or {}).get("restoreSeconds"):
        p.checkpoint(restoreSeconds=measured)  # the allocator's cost of moving this job follows reality
    if not progress or progress == mirrored or "progress" in p.patch:
        return
    checkpointed = progress.get("checkpointStep") is not None and progress["checkpointStep"] > int(
        (p.status.get("checkpoint") or {}).get("step", 0))
    since = mirrored.get("updatedAt") or p.status.get("startedAt")
    age = _unix(progress["updatedAt"]) - (_unix(since) if since else 0.0)
    if not checkpointed and age < PROGRESS_EVERY_SECONDS and not p.patch:
        return
    p.patch["progress"] = progress
    if checkpointed:
        p.checkpoint(step=int(progress["checkpointStep"]), time=progress.get("updatedAt"))


def outlook(job: JobView, state: JobState, gpus: int, now: float) -> dict[str, Any]:
    """Predicted completion: at rank 0's measured rate when it has reported one on this worker set, else at the
    rate the scaling curve gives for `gpus`."""
    progress = job.progress or {}
    rate = float(progress.get("stepsPerSecond") or 0.0) or state.curve.rate(gpus)
    if rate <= 0:
        return {}
    if progress.get("updatedAt"):
        eta = _unix(progress["updatedAt"]) + state.remaining_steps / rate
    elif job.status.get("startedAt"):
        eta = _unix(job.status["startedAt"]) + state.total_steps / rate
    else:
        eta = now + state.remaining_steps / rate
    return {"estimatedCompletion": rfc3339(eta), "deadlineMet": eta <= state.deadline}


# When time alone next changes what `transition` does (the objects and the decision unchanged): the places where
# it reads the clock, each None once what it times was seen at `now`.
Timer = Callable[[JobView, Sequence[WorkerPod], float, JobState], "float | None"]


def _quiet_start_ends(job: JobView, pods: Sequence[WorkerPod], now: float, state: JobState) -> float | None:
    """A job's first status (Pending) is written QUIET_SECONDS after its creation."""
    if job.phase:
        return None
    ends = job.created + QUIET_SECONDS
    return ends if ends > now else None


def _ack_times_out(job: JobView, pods: Sequence[WorkerPod], now: float, state: JobState) -> float | None:
    """The workers are replaced once the ack timeout has passed since an unacknowledged checkpoint request."""
    ckpt = job.checkpoint
    if ckpt.pending and ckpt.requested_at:
        out = _unix(ckpt.requested_at) + ACK_TIMEOUT_SECONDS
        return out if out >= now else None  # `_drive_checkpoint`: strictly more than the timeout
    return None


def _running_recorded_at(job: JobView, pods: Sequence[WorkerPod], now: float, state: JobState) -> float | None:
    """Workers all running are recorded Running QUIET_SECONDS after the last of them started (a job still
    not Running after that waits for something else: a checkpoint, a patch)."""
    if job.phase in (None, phases.RUNNING):
        return None
    mine = [w for w in pods if w.worker_set == job.worker_set]
    if mine and all(w.phase == "Running" for w in mine):
        if (started := workers_started(mine)) is not None and started + QUIET_SECONDS > now:
            return started + QUIET_SECONDS
    return None


def _outlook_turns_at(job: JobView, pods: Sequence[WorkerPod], now: float, state: JobState) -> float | None:
    """A placed job that has neither started nor reported progress is predicted to finish `now` plus what
    is left at its rate (`outlook`): its `deadlineMet` turns false when that passes the deadline (and is
    written then: a time past it is the next pass)."""
    if not job.placement or job.status.get("startedAt") or job.status.get("deadlineMet") is False:
        return None
    progress = job.progress or {}
    if progress.get("updatedAt"):
        return None
    rate = float(progress.get("stepsPerSecond") or 0.0) or state.curve.rate(sum(job.placement.values()))
    if rate <= 0:
        return None
    # A hair early: `now + left <= deadline` is read in floating point, and a pass too early only plans it again.
    return state.deadline - state.remaining_steps / rate - 1e-6


TIMERS: tuple[Timer, ...] = (_quiet_start_ends, _ack_times_out, _running_recorded_at, _outlook_turns_at)


def next_change_at(job: JobView, pods: Sequence[WorkerPod], now: float, state: JobState) -> float | None:
    """When time alone next changes what `transition` does for this job, after it ran at `now`; None if only
    news does."""
    if job.phase in phases.TRAINING_FINAL:
        return None
    return min((t for timer in TIMERS if (t := timer(job, pods, now, state)) is not None), default=None)
