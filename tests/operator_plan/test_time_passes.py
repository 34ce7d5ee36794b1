"""Decisions unchanged when time alone moves: a time-driven full pass (`Planner._why_full` "time") runs the
allocator but plans only the jobs whose decision or loans changed, whose objects changed, or whose own timer
(`training.replan_at`) is due. Its actions must equal a full re-plan's (every job planned) at the same time,
pass after pass, while time steps past every kind of timer: quiet starts (new jobs, waiting or placed),
workers recorded Running QUIET_SECONDS after they started, checkpoint acknowledgements that time out,
and the deadline outlook of a placed job whose workers have not started."""

from __future__ import annotations

from pathlib import Path

import pytest

from flotilla.allocation import Decision, JobDecision, Verdict, policies
from flotilla.operator import training
from flotilla.operator.actions import PatchStatus
from flotilla.operator.reconcile import Planner, plan
from flotilla.operator.timeutil import rfc3339
from flotilla.reshard import protocol
from flotilla.reshard.view import JobView
from tests.operator_plan.builders import T0, trainingjob
from tests.operator_plan.test_incremental import by_key, differences
from tests.operator_plan.world import World

NOW = T0 + 600
DATA = Path(__file__).resolve().parents[1] / "data"
STEPS = (1.0, 3.0, 9.5, 11.0, 31.0, 64.0, 125.0)  # seconds between two passes: past 10 s and 120 s timers


class SlowStarts(World):
    """A World whose pods start late: created Pending, Running (with a startTime) when `start` says."""

    def apply(self, plans):
        before = set(self.pods)
        super().apply(plans)
        for key in set(self.pods) - before:
            self.pods[key] = {**self.pods[key], "status": {"phase": "Pending"}}

    def start(self, share: float, now: float) -> None:
        for key, pod in list(self.pods.items()):
            if (pod.get("status") or {}).get("phase") == "Pending" and self.rng.random() < share:
                started = rfc3339(now - self.rng.uniform(0.0, 8.0))
                self.pods[key] = {**pod, "status": {"phase": "Running", "startTime": started}}

    def submit(self, now: float) -> None:
        """A job created now: elastic (so the allocator grows and shrinks it through checkpoints), its
        deadline tight enough that a late start turns its outlook."""
        rng = self.rng
        gpus = rng.choice((1, 2, 4, 8, 16))
        name = f"t{self.serial}"
        self.serial += 1
        body = trainingjob(name, min_gpus=max(1, gpus // 4), max_gpus=gpus, per_worker=1,
                           deadline_seconds=rng.choice((900, 1800, 3600, 36000)))
        body["spec"]["totalSteps"] = rng.randrange(300, 3000)
        body["metadata"]["creationTimestamp"] = rfc3339(now)
        self.jobs[f"ns/{name}"] = body


def still() -> float:
    """The planner's clock for its own passes: none takes any time, so every pass after the first is a
    time-driven full pass (full_every 0)."""
    return 0.0


def walk(world: SlowStarts, allocator, passes: int, now: float, arrivals: int = 3) -> list[str]:
    """`passes` time passes, time stepping by STEPS, news between them; the differences found."""
    planner = Planner(full_every=0.0, clock=still)
    planner.plan(now, allocator, *world.views())
    assert planner.full_reason == "first"
    found: list[str] = []
    for step in range(passes):
        now += world.rng.choice(STEPS)
        if world.rng.random() < 0.6:  # else a pass with no news: time alone moves
            for _ in range(world.rng.randrange(0, arrivals + 1)):
                world.submit(now)
            world.start(0.3, now)
            running = [k for k, b in world.jobs.items() if (b.get("status") or {}).get("phase") == "Running"]
            for key in world.rng.sample(running, min(1, len(running))):
                world.finish(key)
        found += differences(world, planner, allocator, now)
        assert planner.full_reason == "time"
    return found


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_time_passes_act_as_planning_every_job(seed):
    allocator = policies.get("elastic-deadline")
    world = SlowStarts(seed=seed, nodes=6)
    for _ in range(30):
        world.submit(NOW - 30)
    world.settle(allocator, NOW)
    found = walk(world, allocator, 40, NOW)
    assert not found, found[:3]


@pytest.mark.parametrize("timer", [protocol._quiet_start_ends, protocol._running_recorded_at],
                         ids=lambda t: t.__name__)
def test_the_walks_need_these_timers(monkeypatch, timer):
    """The same walks with one kind of timer left out: some pass differs from planning every job. (A
    checkpoint's timeout and a turning outlook mostly come with a changed decision in these walks: each has a
    test of its own below.)"""
    monkeypatch.setattr(protocol, "TIMERS", tuple(t for t in protocol.TIMERS if t is not timer))
    allocator = policies.get("elastic-deadline")
    world = SlowStarts(seed=1, nodes=6)
    for _ in range(30):
        world.submit(NOW - 30)
    world.settle(allocator, NOW)
    assert walk(world, allocator, 40, NOW)


def lone_job(world: SlowStarts, name: str, created: float, min_gpus: int, max_gpus: int,
             deadline: int = 3600) -> str:
    body = trainingjob(name, min_gpus=min_gpus, max_gpus=max_gpus, per_worker=1, deadline_seconds=deadline)
    body["metadata"]["creationTimestamp"] = rfc3339(created)
    world.jobs[f"ns/{name}"] = body
    return f"ns/{name}"


@pytest.mark.parametrize("with_timer", [True, False])
def test_a_placed_jobs_outlook_turns_in_a_time_pass(monkeypatch, with_timer):
    """A job placed whose workers never start: its predicted completion is `now` plus what is left, and
    `deadlineMet` turns false in the time pass after that passes its deadline. fifo-gang's decisions do not
    move with time, so only the job's timer has it planned."""
    if not with_timer:
        monkeypatch.setattr(protocol, "TIMERS", tuple(t for t in protocol.TIMERS
                                                      if t is not protocol._outlook_turns_at))
    allocator = policies.get("fifo-gang")
    world = SlowStarts(seed=0, nodes=1)
    key = lone_job(world, "stuck", NOW - 60, 4, 4, deadline=600)  # 1,000 steps at 3/s: 333 s of 600
    planner = Planner(full_every=0.0, clock=still)
    world.apply(planner.plan(NOW, allocator, *world.views()))
    assert world.jobs[key]["status"]["phase"] == "Admitted" and world.jobs[key]["status"]["deadlineMet"]
    turns = protocol._outlook_turns_at(JobView.of(world.jobs[key]), [], NOW, training.job_state(world.jobs[key]))
    assert NOW < turns < NOW + 600
    assert not differences(world, planner, allocator, turns - 5)
    found = differences(world, planner, allocator, turns + 5)
    assert planner.full_reason == "time"
    assert bool(found) is not with_timer
    assert world.jobs[key]["status"]["deadlineMet"] is False


class Wants:
    """An allocator that admits every job where `placements` says (a stand-in that does not move with
    time, so that only a job's timer has it planned in a time pass)."""

    name = "wants"

    def __init__(self, placements: dict[str, dict[str, int]]):
        self.placements = placements

    def decide(self, snapshot):
        return Decision({j.key: JobDecision(j.key, Verdict.ADMITTED, self.placements[j.key], "as wanted",
                                            sum(self.placements[j.key].values()), sum(self.placements[j.key].values()))
                         for j in snapshot.jobs}, self.name)


@pytest.mark.parametrize("with_timer", [True, False])
def test_an_unacknowledged_checkpoint_times_out_in_a_time_pass(monkeypatch, with_timer):
    """A running job asked for a checkpoint to grow whose rank 0 never answers: the time pass
    ACK_TIMEOUT_SECONDS after the request replaces its workers, as planning every job would."""
    if not with_timer:
        monkeypatch.setattr(protocol, "TIMERS", tuple(t for t in protocol.TIMERS if t is not protocol._ack_times_out))
    world = SlowStarts(seed=0, nodes=1)
    key = lone_job(world, "small", NOW - 60, 1, 8, deadline=36000)
    allocator = Wants({key: {"n0": 2}})
    world.settle(allocator, NOW)
    world.start(1.0, NOW - 20)
    planner = Planner(full_every=0.0, clock=still)
    world.apply(planner.plan(NOW, allocator, *world.views()))
    assert world.jobs[key]["status"]["phase"] == "Running"
    allocator.placements[key] = {"n0": 4}
    for t in (NOW + 1, NOW + 2, NOW + 3, NOW + 4):  # asked, then its writes (the last pass has none)
        assert not differences(world, planner, allocator, t)
    asked = world.jobs[key]["status"]["checkpoint"]
    assert asked["requestedGeneration"] > asked.get("generation", 0) and key not in planner._acted
    found = differences(world, planner, allocator, NOW + 2 + training.ACK_TIMEOUT_SECONDS)
    assert planner.full_reason == "time"
    assert bool(found) is not with_timer
    assert world.jobs[key]["status"]["reshards"] == 1


def test_a_time_pass_plans_few_jobs():
    """On the recorded 5,000-live-job world (1,000 nodes), a time pass plans the jobs with news or a due timer,
    not all of them, and acts as planning all of them would."""
    allocator = policies.get("elastic-deadline")
    world = SlowStarts.load(DATA / "world-1000x5000-live.json.gz", seed=5000)
    live = sum(1 for b in world.jobs.values() if not training.is_final(b))
    planner = Planner(full_every=0.0, clock=still)
    now = NOW
    first = planner.plan(now, allocator, *world.views())
    assert len(first) == live
    world.apply(first)
    for step in (1.0, 125.0):
        now += step
        for _ in range(5):
            world.submit(now)
        world.start(0.5, now)
        views = world.views()
        incremental = by_key(planner.plan(now, allocator, *views))
        full = plan(now, allocator, *views)
        world.apply(full)
        assert planner.full_reason == "time"
        if step > 1:  # the pass after the first plans the jobs the first one patched
            assert 0 < len(incremental) < live // 10
        assert not [key for kind, key, actions in full if incremental.get((kind, key), []) != actions]


def test_a_job_waiting_for_its_checkpoint_is_written_once():
    """Asked to move, a running job is Resharding until rank 0 acknowledges (or the timeout): one write for
    the request, one for the wait, then none (it went back to Running and to Resharding every other pass)."""
    world = SlowStarts(seed=0, nodes=1)
    key = lone_job(world, "small", NOW - 60, 1, 8, deadline=36000)
    allocator = Wants({key: {"n0": 2}})
    world.settle(allocator, NOW)
    world.start(1.0, NOW - 20)
    world.settle(allocator, NOW)
    allocator.placements[key] = {"n0": 4}
    writes = []
    for t in range(1, 8):
        full = plan(NOW + t, allocator, *world.views())
        writes.append(sum(isinstance(a, PatchStatus) for _, k, actions in full if k == key for a in actions))
        world.apply(full)
        assert world.jobs[key]["status"]["phase"] == "Resharding"
    assert writes == [1, 1, 0, 0, 0, 0, 0]


def test_a_global_change_when_a_time_pass_is_due_still_plans_every_job():
    allocator = policies.get("elastic-deadline")
    world = SlowStarts(seed=4, nodes=3)
    for _ in range(12):
        world.submit(NOW - 30)
    world.settle(allocator, NOW)
    planner = Planner(full_every=0.0, clock=still)
    world.apply(planner.plan(NOW, allocator, *world.views()))
    world.nodes["n0"] = {**world.nodes["n0"], "spec": {**world.nodes["n0"]["spec"], "unschedulable": True}}
    live = sum(1 for b in world.jobs.values() if not training.is_final(b))
    assert len(planner.plan(NOW + 20, allocator, *world.views())) == live and planner.full_reason == "nodes"
    assert len(planner.plan(NOW + 40, allocator, *world.views())) < live and planner.full_reason == "time"
