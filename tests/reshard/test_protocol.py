"""The resharding protocol driven through every phase and every crash point, without an API server: a job object
and its worker pods held here, each transition's writes applied in the order the operator sends them (status,
annotations, then pod deletions and creations), rank 0 and the kubelet played by `Cluster.tick`."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from flotilla.allocation import JobDecision, Verdict
from flotilla.operator.training import job_state
from flotilla.reshard import encoding
from flotilla.reshard.protocol import (
    ACK_TIMEOUT_SECONDS,
    QUIET_SECONDS,
    ApplyRendezvous,
    CreateWorker,
    DeleteWorker,
    Event,
    Settings,
    Step,
    Transition,
    next_change_at,
    rank_nodes,
    transition,
)
from flotilla.reshard.view import JobView, WorkerPod
from flotilla.resources.parse import parse_time
from tests.operator_plan.builders import T0, trainingjob


def admitted(placement: dict[str, int], reason: str = "decided") -> JobDecision:
    return JobDecision("ns/job", Verdict.ADMITTED, placement, reason)


def merge(into: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386), as the API server applies the operator's status patches."""
    out = dict(into)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


class Crash(Exception):
    pass


class Cluster:
    """One TrainingJob and its worker pods. `step` plans and applies one pass (or its first `crash_after`
    writes: the operator died there); `tick` lets time pass: pods start, terminating pods go, rank 0 answers a
    checkpoint request and reports its progress."""

    def __init__(self, max_gpus: int = 4, **kw: Any):
        self.body = trainingjob(min_gpus=1, max_gpus=max_gpus, **kw)
        self.pods: dict[str, WorkerPod] = {}
        self.now = T0 + 60
        self.steps = 0  # rank 0's training progress
        self.answer = True  # rank 0 acknowledges checkpoint requests
        self.serial = 0
        self.history: list[Step] = []
        self.events: list[Event] = []

    @property
    def status(self) -> dict[str, Any]:
        return self.body["status"]

    @property
    def job(self) -> JobView:
        return JobView.of(self.body)

    def plan(self, decision: JobDecision | None, **settings: Any) -> Transition:
        return transition(self.job, job_state(self.body), list(self.pods.values()), decision, self.now,
                          Settings("test", **settings))

    def step(self, decision: JobDecision | None, crash_after: int | None = None, **settings: Any) -> Transition:
        move = self.plan(decision, **settings)
        self.history.append(move.step)
        writes: list[Any] = [("status", {**move.lazy, **move.status})] if move.status else []
        if move.annotations:
            writes.append(("annotations", move.annotations))
        writes += [e for e in move.effects if not isinstance(e, Event)]
        for i, write in enumerate(writes):
            if crash_after is not None and i >= crash_after:
                raise Crash(i)
            self.write(write)
        self.events += move.events
        return move

    def write(self, write: Any) -> None:
        if isinstance(write, tuple) and write[0] == "status":
            self.body["status"] = merge(self.status, write[1])
        elif isinstance(write, tuple):
            meta = self.body["metadata"]
            meta["annotations"] = {**meta.get("annotations", {}), **write[1]}
        elif isinstance(write, CreateWorker):
            name = f"job-g{write.worker_set}-w{write.rank}"
            if name not in self.pods:  # a create of an existing pod is a no-op (409)
                node = rank_nodes(dict(write.placement), 1)[write.rank]
                self.serial += 1
                self.pods[name] = WorkerPod(name, f"pod-{self.serial}", write.worker_set, write.rank, node,
                                            "Pending", None, False, True)
        elif isinstance(write, DeleteWorker):
            pod = self.pods.get(write.name)
            if pod is not None and pod.uid == write.uid:
                self.pods[write.name] = WorkerPod(**{**pod.__dict__, "terminating": True})
        else:
            assert isinstance(write, ApplyRendezvous)

    def tick(self, seconds: float = 5.0) -> None:
        self.now += seconds
        for name, pod in list(self.pods.items()):
            if pod.terminating:
                del self.pods[name]
            elif pod.phase == "Pending":
                self.pods[name] = WorkerPod(**{**pod.__dict__, "phase": "Running", "started": self.now})
        job = self.job
        current = [p for p in self.pods.values() if p.worker_set == job.worker_set and p.phase == "Running"]
        if not current:
            return
        if job.worker_set == 0 or job.progress is None or job.progress.get("stepsPerSecond"):
            self.steps += int(seconds)
        else:  # a new worker set starts from the checkpoint it restores
            self.steps = int(job.checkpoint.step or 0) + int(seconds)
        notes = dict(self.body["metadata"].get("annotations") or {})
        request, ack = encoding.parse_request(notes), encoding.parse_ack(notes)
        if self.answer and request and request["generation"] > (ack["generation"] if ack else 0):
            notes.update(encoding.ack_annotation(request["generation"], self.steps, self.now))
        notes.update(encoding.progress_annotation(self.steps, 1.0, self.now, job.worker_set))
        self.body["metadata"]["annotations"] = notes

    def settle(self, decision: JobDecision, passes: int = 30) -> None:
        """Passes and ticks until the worker set on the decided placement runs and is recorded Running."""
        for _ in range(passes):
            self.step(decision)
            if self.running_on(decision.placement):
                return
            self.tick()
        raise AssertionError(f"not settled: {self.history[-6:]}, status {self.status}")

    def running_on(self, placement: dict[str, int]) -> bool:
        job = self.job
        mine = [p for p in self.pods.values() if p.worker_set == job.worker_set]
        return (job.phase == "Running" and dict(job.placement) == placement and len(mine) == sum(placement.values())
                and all(p.phase == "Running" for p in mine) and len(self.pods) == len(mine))

    def fail(self, rank: int) -> None:
        name = next(n for n, p in self.pods.items() if p.rank == rank and p.worker_set == self.job.worker_set)
        self.pods[name] = WorkerPod(**{**self.pods[name].__dict__, "phase": "Failed"})


def running_job(placement: dict[str, int] | None = None) -> Cluster:
    c = Cluster()
    c.settle(admitted(placement or {"n0": 2}))
    c.tick(30)
    return c


def test_a_reshard_goes_through_every_phase_in_order():
    c = Cluster()
    small, large = {"n0": 2}, {"n0": 2, "n1": 2}
    assert c.step(admitted(small)).step is Step.PLACE
    assert c.status["phase"] == "Admitted" and c.status.get("reshards", 0) == 0
    c.settle(admitted(small))
    c.tick(30)
    c.answer = False
    first = c.step(admitted(large))
    assert first.step is Step.REQUEST and encoding.parse_request(first.annotations)["generation"] == 1
    assert c.status["phase"] == "Resharding" and c.status["checkpoint"]["requestedGeneration"] == 1
    c.tick()
    assert c.step(admitted(large)).step is Step.AWAIT
    c.answer = True
    c.tick()
    switch = c.step(admitted(large))
    assert switch.step is Step.SWITCH
    assert c.status["reshards"] == 1 and c.status["workerGeneration"] == 1 and c.status.get("restarts", 0) == 0
    assert c.status["checkpoint"]["generation"] == 1 and c.status["progress"]["steps"] == c.steps
    assert {type(e) for e in switch.effects} >= {DeleteWorker, Event}
    # The old set's pods still terminate on n0: its new workers wait for them, n1's start at once.
    assert {c.pods[n].node for n in c.pods if c.pods[n].worker_set == 1} == {"n1"}
    c.settle(admitted(large))
    assert c.history.count(Step.SWITCH) == 1 and c.status["reshards"] == 1
    reasons = [e.reason for e in c.events]
    assert reasons.index("CheckpointRequested") < reasons.index("CheckpointWritten") < reasons.index("Resharding")


def test_a_set_that_never_ran_moves_without_a_checkpoint():
    c = Cluster()
    c.step(admitted({"n0": 2}))
    assert c.step(admitted({"n1": 2})).step is Step.MOVE
    assert not c.body["metadata"]["annotations"] and c.status["workerGeneration"] == 1
    c.settle(admitted({"n1": 2}))


def test_a_crash_restart_is_counted_apart_from_reshards():
    c = running_job()
    c.fail(1)
    move = c.step(admitted({"n0": 2}))
    assert move.step is Step.RESTART
    assert c.status["restarts"] == 1 and c.status["workerGeneration"] == 1 and c.status.get("reshards", 0) == 0
    assert [e.reason for e in move.events] == ["WorkerFailed", "RestartFromCheckpoint"]
    c.settle(admitted({"n0": 2}))
    for _ in range(3):
        c.fail(0)
        c.step(admitted({"n0": 2}))
        if c.status["phase"] != "Failed":
            c.settle(admitted({"n0": 2}))
    assert c.status["phase"] == "Failed" and c.status["restarts"] == 3 and c.status.get("reshards", 0) == 0
    assert c.history[-1] is Step.FAIL


def test_no_acknowledgement_within_the_timeout_switches_from_the_last_checkpoint():
    c = running_job()
    c.answer = False
    assert c.step(admitted({"n1": 2})).step is Step.REQUEST
    c.now += ACK_TIMEOUT_SECONDS / 2
    assert c.step(admitted({"n1": 2})).step is Step.AWAIT
    asked = parse_time(c.status["checkpoint"]["requestedAt"], "requestedAt")
    assert next_change_at(c.job, list(c.pods.values()), c.now, job_state(c.body)) == asked + ACK_TIMEOUT_SECONDS
    c.now += ACK_TIMEOUT_SECONDS
    move = c.step(admitted({"n1": 2}))
    assert move.step is Step.SWITCH and "RestartFromCheckpoint" in [e.reason for e in move.events]
    assert c.status["reshards"] == 1 and c.status["checkpoint"]["generation"] == 1  # consumed, unacknowledged


def test_a_restart_request_from_the_controller_switches_without_waiting():
    c = running_job()
    c.answer = False
    c.body["metadata"]["annotations"].update(encoding.request_annotation(1, "node n0 faulty", c.now, "controller",
                                                                         restart=True))
    move = c.step(admitted({"n1": 2}))
    assert move.step is Step.SWITCH
    assert "requested by controller: node n0 faulty" in move.events[0].message
    c.settle(admitted({"n1": 2}))


def test_a_checkpoint_written_for_a_move_no_longer_decided_replaces_the_set_in_place():
    c = running_job()
    c.answer = False
    c.step(admitted({"n1": 2}))
    c.answer = True
    c.tick()
    assert c.step(admitted({"n0": 2})).step is Step.REPLACE
    assert c.status["workerGeneration"] == 1 and c.status["reshards"] == 1
    c.settle(admitted({"n0": 2}))


def test_pending_rejected_quiet_and_finished():
    c = Cluster()
    c.now = T0 + 1
    assert c.step(None).step is Step.IDLE and not c.status  # a quiet start: nothing written yet
    c.now += QUIET_SECONDS
    assert c.step(None).step is Step.WAIT_FOR_GPUS and c.status["phase"] == "Pending"
    assert c.step(JobDecision("ns/job", Verdict.REJECTED, {}, "cannot meet its deadline")).step is Step.REJECT
    assert c.status["phase"] == "Rejected" and c.step(None).step is Step.IDLE
    done = running_job()
    rank0 = next(n for n, p in done.pods.items() if p.rank == 0)
    done.pods[rank0] = WorkerPod(**{**done.pods[rank0].__dict__, "phase": "Succeeded"})
    assert done.step(admitted({"n0": 2})).step is Step.SUCCEED and done.status["phase"] == "Succeeded"


def test_a_best_effort_job_says_it_runs_without_a_guarantee_waiting_or_running_and_is_not_admitted_again():
    c = Cluster()
    c.body["spec"]["bestEffort"] = True
    c.now = T0 + QUIET_SECONDS + 1
    best_effort = JobDecision("ns/job", Verdict.BEST_EFFORT, {}, "best-effort, no guarantee: too late; no GPUs now")
    assert c.step(best_effort).step is Step.WAIT_FOR_GPUS
    cond = next(x for x in c.status["conditions"] if x["type"] == "Admitted")
    assert (c.status["phase"], cond["status"], cond["reason"]) == ("Pending", "True", "BestEffort")
    assert job_state(c.body).verdict is Verdict.BEST_EFFORT  # admission is not tried again in the next pass
    assert "conditions" not in c.plan(best_effort).status  # said once
    c.step(JobDecision("ns/job", Verdict.BEST_EFFORT, {"n0": 2}, "best-effort, no guarantee: starts on 2 GPUs"))
    c.tick()
    c.step(JobDecision("ns/job", Verdict.BEST_EFFORT, {"n0": 2}, "best-effort"))
    assert c.status["phase"] in ("Admitted", "Running")
    assert job_state(c.body).verdict is Verdict.BEST_EFFORT
    # Without spec.bestEffort the same condition is not read as best-effort (a job cannot become one later).
    c.body["spec"]["bestEffort"] = False
    assert job_state(c.body).verdict is Verdict.ADMITTED


def test_a_shrink_for_serving_is_recorded_as_a_loan_and_paid_back():
    c = running_job({"n0": 4})
    c.step(admitted({"n0": 2}), lending={"ns/chat": 2})
    c.tick()
    move = c.step(admitted({"n0": 2}), lending={"ns/chat": 2})
    assert move.step is Step.SWITCH and c.status["lentTo"] == [{"serving": "ns/chat", "gpus": 2}]
    assert "lent 2 GPUs to sd/chat" in [e.message for e in move.events if e.reason == "LentGPUs"][0]
    c.settle(admitted({"n0": 2}))
    c.tick(30)
    c.step(admitted({"n0": 4}))
    c.tick()
    c.step(admitted({"n0": 4}))
    assert c.status["lentTo"] == [] and c.status["reshards"] == 2


@pytest.mark.parametrize("phase", ["request", "switch"])
@pytest.mark.parametrize("crash_after", range(0, 7))  # the switch pass writes 6 times, the request pass twice
def test_an_operator_killed_after_any_write_resumes_to_one_worker_set(phase, crash_after):
    """The operator dies after the first `crash_after` writes of the pass that asks for the checkpoint, or of the
    pass that switches; a fresh pass from what was written converges: one worker set on the new placement, one
    reshard, the checkpoint consumed, no step lost beyond it."""
    large = {"n0": 2, "n1": 2}
    c = running_job()
    if phase == "switch":
        c.step(admitted(large))
        c.tick()
    try:
        move = c.step(admitted(large), crash_after=crash_after)
        assert move.step is (Step.REQUEST if phase == "request" else Step.SWITCH)  # all its writes made
    except Crash:
        pass
    c.tick()
    c.settle(admitted(large))
    assert c.status["reshards"] == 1 and c.status["workerGeneration"] == 1
    ckpt = c.job.checkpoint
    assert ckpt.requested == ckpt.written == 1 and not ckpt.pending
    assert c.status["progress"]["steps"] >= int(ckpt.step or 0) > 0
    assert "RestartFromCheckpoint" not in [e.reason for e in c.events]  # acknowledged, not timed out
    assert sorted((p.worker_set, p.rank) for p in c.pods.values()) == [(1, 0), (1, 1), (1, 2), (1, 3)]
