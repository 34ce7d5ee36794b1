"""Passes while jobs arrive: a pass that takes newly arrived TrainingJobs starts once arrivals pause for the
debounce, or `batch_seconds` after the first of them if sooner, so that 20 arrivals a second make a few passes, not
one every debounce, and a burst is taken when it ends; a job arriving after a quiet spell is planned at once
(`handlers.QUIET_BATCHES`)."""

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


def passes_while_jobs_arrive(monkeypatch, batch_seconds: float, rate: float = 20.0, seconds: float = 2.0,
                             quiet_before: float = 0.0, woken_before: float | None = None,
                             gaps: list[float] | None = None) -> tuple[int, list[float]]:
    """(passes, each job's wait from its arrival to the pass that took it, in order of arrival) with jobs arriving
    at `rate`, the first of them `quiet_before` seconds after the loop started; `woken_before`: each comes that
    long after something else woke the loop (a pod's event); `gaps`: the seconds after each job before the next
    (instead of `rate` and `seconds`)."""
    world = World(seed=2, nodes=2)
    op = handlers.Operator(handlers.Settings(allocator=policies.get("elastic-deadline"), debounce_seconds=0.2,
                                             batch_seconds=batch_seconds))
    view = op.view
    arrived: dict[str, float] = {}
    waits: list[float] = []
    passes = 0

    async def reconcile_once(op, kube):
        nonlocal passes
        passes += 1
        now = asyncio.get_running_loop().time()
        waits.extend(now - arrived.pop(key) for key in list(arrived) if key in view.jobs)  # in arrival order
        return 0.0

    async def run():
        monkeypatch.setattr(handlers, "_reconcile_once", reconcile_once)
        loop = asyncio.get_running_loop()
        reconciling = loop.create_task(handlers._reconcile_forever(op, None))
        await asyncio.sleep(quiet_before)
        for gap in gaps if gaps is not None else [1 / rate] * max(1, int(rate * seconds)):
            if woken_before is not None:
                view.wake.set()
                await asyncio.sleep(woken_before)
            body = world.new_job()
            arrived[f"{body['metadata']['namespace']}/{body['metadata']['name']}"] = loop.time()
            view.record("jobs", {"type": "ADDED", "object": body})
            await asyncio.sleep(gap)
        while arrived:
            await asyncio.sleep(0.05)
        reconciling.cancel()

    asyncio.run(run())
    return passes, waits


def test_arrivals_are_batched_into_few_passes(monkeypatch):
    passes, waits = passes_while_jobs_arrive(monkeypatch, batch_seconds=0.5)
    assert passes <= 6, passes  # 40 jobs in 2 s: a pass about every half second
    assert waits[0] < 0.15, waits[0]  # the burst's first job came after a quiet spell: planned at once
    assert max(waits) >= 0.4, waits  # the next ones waited for a batch (due 0.5 s after the first of them)
    assert max(waits) < 0.5 + 0.3, waits  # and not much longer (the 0.3: the loop's own latency, loaded)
    unbatched, _ = passes_while_jobs_arrive(monkeypatch, batch_seconds=0.0)
    assert unbatched > passes  # one every debounce (0.2 s)


def test_a_lone_arrival_after_a_quiet_spell_is_planned_at_once(monkeypatch):
    # Two jobs 1.2 s apart (more than QUIET_BATCHES x 0.5 s): neither the batch (0.5 s) nor the debounce
    # (0.2 s) is waited for, by either.
    passes, waits = passes_while_jobs_arrive(monkeypatch, batch_seconds=0.5, rate=1 / 1.2, seconds=2.4)
    assert passes == 2 and len(waits) == 2
    assert max(waits) < 0.15, waits
    # 0.7 s apart: the second is not alone (it came within QUIET_BATCHES x 0.5 s of the first), but nothing comes
    # after it: it is taken once arrivals have paused for the debounce (0.2 s), not a whole batch (0.5 s) later.
    _, waits = passes_while_jobs_arrive(monkeypatch, batch_seconds=0.5, rate=1 / 0.7, seconds=1.4)
    assert waits[0] < 0.15 and 0.15 <= waits[1] < 0.4, waits
    # Woken by another event 0.1 s before it came: the loop was already in its debounce (0.2 s), and the
    # lone job is taken when that ends, not a batch after it came.
    _, waits = passes_while_jobs_arrive(monkeypatch, batch_seconds=0.5, rate=1 / 1.2, seconds=2.4, woken_before=0.1)
    assert max(waits) < 0.25, waits


def test_a_burst_is_taken_in_one_pass_when_it_ends(monkeypatch):
    # Waves of 10 jobs 5 ms apart, a second apart (a client's waves, bench/scale.py's): after the first wave (whose
    # head, after a quiet spell, is planned at once), each wave is one pass, taken once it has paused for the
    # debounce: its first job waits ~0.05 + 0.2 s, not the whole batch (0.5 s).
    wave = [0.005] * 9 + [1.0 - 0.045]
    passes, waits = passes_while_jobs_arrive(monkeypatch, batch_seconds=0.5, gaps=wave * 4)
    assert passes <= 2 + 3, passes  # the first wave's head and the rest of it, then one pass a wave
    later = waits[10:]
    assert max(later) < 0.45, later  # the whole batch (0.5 s) waited for nothing: the wave had ended
    assert min(later) >= 0.15, later  # and the pass still waited for the wave's end (the debounce after its last)
