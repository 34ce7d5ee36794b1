"""Passes while jobs arrive: a pass that takes newly arrived TrainingJobs starts `batch_seconds` after the first
of them, so that 20 arrivals a second make a few passes, not one every debounce."""

from __future__ import annotations

import asyncio

from flotilla.allocation import policies
from flotilla.operator import handlers
from flotilla.operator.view import View
from tests.operator_plan.world import World


def test_a_new_job_marks_its_arrival_until_a_pass_takes_the_view():
    world = World(seed=1, nodes=2)
    view = View()
    first = world.new_job()
    view.put("jobs", first)
    at = view.first_arrival
    assert at is not None
    view.put("jobs", world.new_job())
    view.put("jobs", {**first, "status": {"phase": "Admitted"}})  # news about a known job is no arrival
    assert view.first_arrival == at
    view.taken()
    assert view.first_arrival is None and not view.wake.is_set()
    view.put("jobs", {**first, "status": {"phase": "Running"}})
    assert view.first_arrival is None


def passes_while_jobs_arrive(monkeypatch, batch_seconds: float, rate: float = 20.0, seconds: float = 2.0):
    """(passes, the longest wait of a job from its arrival to the pass that took it) with jobs arriving at `rate`."""
    world, view = World(seed=2, nodes=2), View()
    monkeypatch.setattr(handlers, "view", view)
    monkeypatch.setattr(handlers, "settings", handlers.Settings(
        allocator=policies.get("elastic-deadline"), debounce_seconds=0.2, batch_seconds=batch_seconds))
    arrived: dict[str, float] = {}
    waits: list[float] = []
    passes = 0

    async def reconcile_once(kube):
        nonlocal passes
        passes += 1
        now = asyncio.get_running_loop().time()
        waits.extend(now - arrived.pop(key) for key in list(arrived) if key in view.jobs)
        return 0.0

    async def run():
        monkeypatch.setattr(handlers, "_reconcile_once", reconcile_once)
        loop = asyncio.get_running_loop()
        reconciling = loop.create_task(handlers._reconcile_forever(None))
        for _ in range(int(rate * seconds)):
            body = world.new_job()
            arrived[f"{body['metadata']['namespace']}/{body['metadata']['name']}"] = loop.time()
            view.record("jobs", {"type": "ADDED", "object": body})
            await asyncio.sleep(1 / rate)
        while arrived:
            await asyncio.sleep(0.05)
        reconciling.cancel()

    asyncio.run(run())
    return passes, max(waits)


def test_arrivals_are_batched_into_few_passes(monkeypatch):
    passes, longest = passes_while_jobs_arrive(monkeypatch, batch_seconds=0.5)
    assert passes <= 6, passes  # 40 jobs in 2 s: a pass about every half second
    assert longest >= 0.45  # the first job of a batch waited for the batch
    unbatched, _ = passes_while_jobs_arrive(monkeypatch, batch_seconds=0.0)
    assert unbatched > passes  # one every debounce (0.2 s)

