"""Decisions unchanged: the incremental planner (`reconcile.Planner`) gives, pass after pass, the same
actions as a full re-plan (`reconcile.plan`) of the same objects at the same time, on seeded clusters that
the operator's own planning brought to a steady state (the 15,000-job one included), while jobs arrive,
start, report progress, finish and are deleted. Time alone is the full passes' (`full_every`), not tested
here: both planners are given the same `now`."""

from __future__ import annotations

from pathlib import Path

import pytest

from flotilla.allocation import policies
from flotilla.operator.reconcile import Planner, plan
from flotilla.pool import PoolPolicy
from tests.operator_plan.builders import T0
from tests.operator_plan.world import World

NOW = T0 + 600
DATA = Path(__file__).resolve().parents[1] / "data"


def by_key(plans):
    return {(kind, key): actions for kind, key, actions in plans}


def differences(world: World, planner: Planner, allocator, now: float, **kw) -> list[str]:
    """Keys whose incremental actions differ from a full re-plan's; the full re-plan's actions are applied."""
    views = world.views()
    incremental = by_key(planner.plan(now, allocator, *views, **kw))
    full = plan(now, allocator, *views, **kw)
    world.apply(full)
    return [f"{kind} {key}: {incremental.get((kind, key), [])} != {actions}"
            for kind, key, actions in full if incremental.get((kind, key), []) != actions]


def churn(world: World, step: int) -> None:
    """A step's worth of news: jobs arrive, some start, report progress, finish, one is deleted."""
    rng = world.rng
    for _ in range(rng.randrange(1, 6)):
        world.new_job()
    live = [k for k, b in world.jobs.items() if (b.get("status") or {}).get("phase") == "Running"]
    for key in rng.sample(live, min(3, len(live))):
        world.report_progress(key, 100 * (step + 1), NOW)
    for key in rng.sample(live, min(2, len(live))):
        world.finish(key)
    if step % 3 == 0 and world.jobs:
        world.jobs.pop(rng.choice(sorted(world.jobs)))


def run_steps(world: World, allocator, steps: int, planner: Planner | None = None, **kw) -> tuple[Planner, list[str]]:
    planner = planner or Planner(full_every=float("inf"))
    planner.plan(NOW, allocator, *world.views(), **kw)  # the first pass is full
    found: list[str] = []
    for step in range(steps):
        churn(world, step)
        found += differences(world, planner, allocator, NOW, **kw)
    return planner, found


@pytest.mark.parametrize("pooled", [False, True])
def test_incremental_passes_act_as_a_full_re_plan(pooled):
    allocator = policies.get("elastic-deadline")
    kw = {"pool": PoolPolicy()} if pooled else {}
    world = World(seed=7, nodes=40)
    if pooled:  # the pool's arbiter decides for training and serving
        world.add_serving("chat")
    world.grow(allocator, NOW, 400, finished=0.3, batch=100, **kw)
    assert not pooled or len(world.deployments) == 2
    planner, found = run_steps(world, allocator, 12, **kw)
    assert not found, found[:3]
    assert planner.full_passes == 1 and planner.passes == 13  # none of it was global


def test_a_node_cordoned_is_a_full_re_plan():
    allocator = policies.get("elastic-deadline")
    world = World(seed=3, nodes=10)
    world.grow(allocator, NOW, 60)
    planner, found = run_steps(world, allocator, 2)
    world.nodes["n0"] = {**world.nodes["n0"], "spec": {**world.nodes["n0"]["spec"], "unschedulable": True}}
    assert not differences(world, planner, allocator, NOW) and planner.full_passes == 2


def test_the_comparison_fails_when_the_incremental_path_skips_a_change(monkeypatch):
    """The same run with a planner that does not look at pods: the finished jobs' Succeeded patches are missed."""
    allocator = policies.get("elastic-deadline")
    world = World(seed=7, nodes=40)
    world.grow(allocator, NOW, 400, finished=0.3, batch=100)
    monkeypatch.setattr(Planner, "_changed", lambda self, key, body, pod_ids, decisions, lending:
                        key in self._acted or body is not self._jobs.get(key))
    _, found = run_steps(world, allocator, 4)
    assert found


def test_on_a_recorded_15000_job_snapshot():
    """1,000 nodes x 8 GPUs; 15,000 jobs of which 12,105 finished, 2,859 running (2,938 pods), 36 rejected.
    Recorded by `python -m tests.operator_plan.world tests/data/world-1000x15000.json.gz` (seed 15000)."""
    allocator = policies.get("elastic-deadline")
    world = World.load(DATA / "world-1000x15000.json.gz", seed=15000)
    assert len(world.jobs) == 15000
    planner, found = run_steps(world, allocator, 4)
    assert not found, found[:3]
    assert planner.full_passes == 1


class Ticks:
    """A clock for the planner's timing of its own passes: each pass reads it when it starts and, if full,
    when it ends; every pass here takes `took` seconds."""

    def __init__(self, took: float):
        self.took, self.at, self.started = took, 0.0, True

    def __call__(self) -> float:
        self.started = not self.started
        if not self.started:
            self.at += 100.0
            return self.at
        return self.at + self.took


@pytest.mark.parametrize("took, quiet_until", [(1.0, 11.0), (8.0, 32.0)])
def test_time_driven_full_passes_count_from_the_end_and_grow_with_their_cost(took, quiet_until):
    """The next time-driven full pass comes `full_every` (10 s) after the end of the last one, or 3x its
    cost (full_share 0.25) when that is longer: a full pass slower than `full_every` does not make every
    pass full."""
    allocator = policies.get("elastic-deadline")
    world = World(seed=3, nodes=10)
    world.grow(allocator, NOW, 60)
    planner = Planner(full_every=10.0, clock=Ticks(took))
    planner.plan(NOW, allocator, *world.views())
    assert planner.full_reason == "first"
    planner.plan(NOW + quiet_until - 0.5, allocator, *world.views())
    assert planner.full_reason is None and planner.full_passes == 1
    planner.plan(NOW + quiet_until, allocator, *world.views())
    assert planner.full_reason == "time" and planner.full_passes == 2


def fresh_job(world: World, now: float, name: str, gpus: int = 1) -> str:
    """A job of `gpus` GPUs (8 a worker) submitted at `now`."""
    from flotilla.operator.timeutil import rfc3339
    from tests.operator_plan.builders import trainingjob

    body = trainingjob(name, min_gpus=gpus, max_gpus=gpus, per_worker=min(gpus, 8))
    body["metadata"]["creationTimestamp"] = rfc3339(now)
    world.jobs[f"ns/{name}"] = body
    return f"ns/{name}"


def test_a_jobs_quiet_start_ends_without_a_full_pass(monkeypatch):
    """Written once at the end of its first QUIET_SECONDS (Pending when it waits, Running when its workers
    have run that long): the incremental planner plans it then by its timer, as a full re-plan would."""
    from flotilla.operator import training

    allocator = policies.get("elastic-deadline")
    world = World(seed=3, nodes=2)
    world.grow(allocator, NOW, 40)  # the 16 GPUs taken, jobs waiting
    planner = Planner(full_every=float("inf"))
    planner.plan(NOW, allocator, *world.views())
    waiting = fresh_job(world, NOW, "late", gpus=16)  # both nodes: it waits
    assert not differences(world, planner, allocator, NOW + 1)
    assert "phase" not in world.jobs[waiting]["status"]  # quiet: nothing written yet
    assert not differences(world, planner, allocator, NOW + training.QUIET_SECONDS + 1)
    assert world.jobs[waiting]["status"]["phase"] == "Pending"

    # A job placed at once: its workers run; Running is recorded QUIET_SECONDS after they started.
    world.nodes["n2"] = {**world.nodes["n0"], "metadata": {**world.nodes["n0"]["metadata"], "name": "n2"}}
    planner.plan(NOW + 12, allocator, *world.views())  # a node added: a full pass
    world.jobs = {k: b for k, b in world.jobs.items() if (b.get("status") or {}).get("phase") != "Pending"}
    placed = fresh_job(world, NOW + 20, "quick")
    assert not differences(world, planner, allocator, NOW + 20)
    assert world.jobs[placed]["status"]["phase"] == "Admitted"
    for key in world.pod_of(placed):
        world.pods[key] = {**world.pods[key], "status": {"phase": "Running", "startTime": "2026-01-01T00:10:21Z"}}
    assert not differences(world, planner, allocator, NOW + 22)
    assert world.jobs[placed]["status"]["phase"] == "Admitted"
    assert not differences(world, planner, allocator, NOW + 21 + training.QUIET_SECONDS)
    assert world.jobs[placed]["status"]["phase"] == "Running"

    # The same with a planner that keeps no timers: the end of the quiet start is missed.
    monkeypatch.setattr(training, "replan_at", lambda body, pods, now, state=None: None)
    world.jobs = {k: b for k, b in world.jobs.items() if k != waiting}
    planner = Planner(full_every=float("inf"))
    planner.plan(NOW + 40, allocator, *world.views())
    fresh_job(world, NOW + 40, "late-again", gpus=16)
    assert not differences(world, planner, allocator, NOW + 41)
    assert differences(world, planner, allocator, NOW + 41 + training.QUIET_SECONDS)


def test_replan_at_a_checkpoint_acknowledgements_timeout():
    from flotilla.operator import training
    from flotilla.operator.timeutil import rfc3339
    from tests.operator_plan.builders import trainingjob

    asked = NOW - 30
    body = trainingjob("j", status={"phase": "Resharding", "reshards": 0, "checkpoint": {
        "requestedGeneration": 2, "generation": 1, "requestedAt": rfc3339(asked)}})
    assert training.replan_at(body, [], NOW) == asked + training.ACK_TIMEOUT_SECONDS
    body["status"]["checkpoint"]["generation"] = 2  # acknowledged: only news moves it on
    assert training.replan_at(body, [], NOW) is None


def test_a_busy_job_is_planned_in_the_first_pass_after_its_writes():
    """A job whose writes are on their way is not planned (its actions would wait anyway); the first pass
    after, it is, though nothing about it changed (a write that failed leaves it as it was)."""
    allocator = policies.get("elastic-deadline")
    world = World(seed=3, nodes=2)
    world.grow(allocator, NOW, 40)
    planner = Planner(full_every=float("inf"))
    planner.plan(NOW, allocator, *world.views())
    key = fresh_job(world, NOW - 60, "new")  # past its quiet start: it has a status to write
    planned = by_key(planner.plan(NOW, allocator, *world.views(), busy={key}))
    assert ("jobs", key) not in planned
    again = by_key(planner.plan(NOW, allocator, *world.views()))  # its writes failed: nothing changed
    assert again[("jobs", key)] == by_key(plan(NOW, allocator, *world.views()))[("jobs", key)] != []


def test_what_earlier_writes_did_is_left_out_and_the_job_planned_again():
    """Pods created whose watch events have not come (`Done.pods`) are not created again, nor the rendezvous
    Service that goes with their creation; the job is planned again in the next pass (its pods may never come)."""
    from flotilla.allocation.fifo import FifoGang
    from flotilla.operator.actions import ApplyObject, CreatePod, Done, pod_key
    from tests.operator_plan.builders import node, trainingjob

    jobs, nodes = {"ns/j": trainingjob("j", min_gpus=2, max_gpus=2)}, {"n0": node("n0")}
    [(_, _, first)] = [p for p in Planner().plan(NOW, FifoGang(), jobs, nodes, {}, {}, {}) if p[0] == "jobs"]
    creates = [pod_key(a.manifest) for a in first if isinstance(a, CreatePod)]
    assert len(creates) == 2 and any(isinstance(a, ApplyObject) for a in first)
    planner = Planner(full_every=float("inf"))
    done = Done(pods=frozenset(creates))
    for _ in range(2):
        [(_, _, actions)] = planner.plan(NOW, FifoGang(), jobs, nodes, {}, {}, {}, done=done)
        assert actions and not [a for a in actions if isinstance(a, (CreatePod, ApplyObject))]
    assert Done(pods=frozenset(creates[:1])).outstanding("jobs", first) == [
        a for a in first if not (isinstance(a, CreatePod) and pod_key(a.manifest) == creates[0])]
