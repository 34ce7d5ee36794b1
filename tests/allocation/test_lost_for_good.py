"""An admitted job whose deadline no layout could meet (`admission.earliest_finish`, `elastic._lost_for_good`):
the bound against `CapacityProfile.reserve` at its edge and at random, and such a job left out of the ledger.

Curves are linear (1 step/s per GPU up to 8) unless said otherwise.
"""

from __future__ import annotations

import random

import pytest
from builders import job, nodes, snapshot

from flotilla.allocation import ScalingCurve, Verdict
from flotilla.allocation.admission import CapacityProfile, earliest_finish
from flotilla.allocation.elastic import DeadlineElastic, _Ledger

ADMITTED = Verdict.ADMITTED


def reserves(j, deadline, gpus=8, current=0, pause=0.0, grace_steps=0) -> bool:
    """Whether `reserve` finds any plan for `j` alone on `gpus` GPUs."""
    profile = CapacityProfile(0.0, gpus)
    return profile.reserve(j, deadline, current=current, pause=pause, grace_steps=grace_steps) is not None


def test_a_job_exactly_at_the_edge_can_still_be_reserved():
    # 800 steps at 8 GPUs: 100 s.
    j = job("a", 800, 100)
    assert earliest_finish(j, 0.0, 8) == 100.0
    assert reserves(j, 100.0) and not reserves(j, 99.9)


def test_fewer_gpus_than_its_largest_size_bound_it_to_the_largest_that_fits():
    j = job("a", 800, 200)
    assert earliest_finish(j, 0.0, 4) == 200.0
    assert earliest_finish(j, 0.0, 0) == float("inf")


def test_a_job_that_keeps_its_gpus_pays_what_is_left_of_its_pause_and_a_move_a_restore():
    # 800 steps left on the 8 GPUs it holds, 10 s of a restore still to run: 110 s. Any other size pays a
    # whole 30 s restore.
    j = job("a", 900, 110, done=100, restore=30, placement={"n0": 8})
    assert earliest_finish(j, 0.0, 8, current=8, pause=10.0) == 110.0
    assert reserves(j, 110.0, current=8, pause=10.0) and not reserves(j, 109.9, current=8, pause=10.0)
    # Holding 4 GPUs: staying takes 10 + 200 s, moving to 8 takes 30 + 100 s.
    assert earliest_finish(j, 0.0, 8, current=4, pause=10.0) == 130.0
    assert reserves(j, 130.0, current=4, pause=10.0) and not reserves(j, 129.9, current=4, pause=10.0)


def test_one_step_of_grace_is_one_step_at_the_fastest_size():
    j = job("a", 900, 110, done=100, restore=30, placement={"n0": 8})
    assert earliest_finish(j, 0.0, 8, current=8, pause=10.0, grace_steps=1) == 10.0 + 799 / 8
    assert reserves(j, 109.875, current=8, pause=10.0, grace_steps=1)
    assert not reserves(j, 109.87, current=8, pause=10.0, grace_steps=1)


def test_a_first_start_pays_no_restore():
    assert earliest_finish(job("a", 800, 100, restore=30), 0.0, 8) == 100.0
    assert earliest_finish(job("a", 900, 100, done=100, restore=30), 0.0, 8) == 130.0


CURVES = (ScalingCurve.of({1: 1.0, 8: 8.0}), ScalingCurve.of({1: 1.0, 2: 1.7, 4: 2.6, 8: 3.0}),
          ScalingCurve.of({1: 1.0, 8: 8.0, 32: 30.0}))


@pytest.mark.parametrize("seed", range(6))
def test_no_plan_reserve_finds_finishes_before_the_bound(seed):
    """On random profiles (other jobs reserved first, others' claims), with random held GPUs, pauses and
    grace: wherever `reserve` finds a plan, the bound is at or before the deadline it met."""
    rng = random.Random(seed)
    checked = 0
    for _ in range(300):
        capacity = rng.choice((8, 16, 32))
        claims = tuple(sorted((rng.uniform(0, 300), rng.randint(-4, 6)) for _ in range(rng.randint(0, 2))))
        profile = CapacityProfile(0.0, capacity, claims)
        for k in range(rng.randint(0, 6)):
            other = job(f"o{k}", rng.randint(50, 3000), rng.uniform(50, 600), max_gpus=capacity)
            profile.reserve(other, other.deadline)
        unit = rng.choice((1, 1, 2))
        current = rng.choice((0, 0, unit, 2 * unit, 4 * unit))
        done = rng.choice((0, rng.randint(1, 50)))
        j = job("j", done + rng.randint(20, 4000), 0.0, done=done, unit=unit, max_gpus=rng.choice((4, 8, 32)),
                restore=rng.choice((0.0, 10.0, 30.0)), curve=rng.choice(CURVES))
        pause = rng.choice((0.0, 0.0, rng.uniform(0, 30)))
        grace = rng.choice((0, 1))
        most = capacity - min(0, min((g for _, g in claims), default=0))
        bound = earliest_finish(j, 0.0, most, current, pause, grace)
        for deadline in (bound - 1.0, bound - 0.01, rng.uniform(1, 3 * bound if bound < float("inf") else 900)):
            if deadline > 0 and profile.copy().reserve(j, deadline, current=current, pause=pause,
                                                       grace_steps=grace) is not None:
                checked += 1
                assert bound <= deadline + 1e-6, (seed, j, deadline, bound)
    assert checked >= 50  # the random deadlines are often met: the test bites


def hopeless(**extra):
    # 8,000 steps due at 100 s: even alone on the 8 GPUs, 1,000 s.
    return job("late", 8000, 100, done=10, verdict=ADMITTED, placement={"n0": 4}, share=4, **extra)


def test_a_guarantee_lost_for_good_says_by_how_much_and_runs_as_large_as_helps():
    d = DeadlineElastic().decide(snapshot(nodes(8), hopeless(), now=0.0)).jobs
    assert d["late"].verdict is ADMITTED
    assert d["late"].reason == ("admitted, but its deadline can no longer be met (even alone on all 8 GPUs it "
                                "would finish 899 s after it, restores counted); runs on what is left; "
                                "grows 4->8 GPUs: marginal gain outweighs 0 s restore")
    assert (d["late"].gpus, d["late"].guaranteed_gpus, d["late"].share) == (8, 0, 4)


def test_an_admitted_job_past_its_deadline_is_lost_for_good():
    late = job("late", 800, 100, done=10, verdict=ADMITTED, placement={"n0": 4})
    d = DeadlineElastic().decide(snapshot(nodes(8), late, now=150.0)).jobs
    assert d["late"].reason.startswith("admitted, but its deadline can no longer be met (deadline passed 50 s ago)")


def test_a_guarantee_lost_for_good_is_not_laid_out_repaired_or_reserved_for(monkeypatch):
    laid_out = []
    for name in ("of", "repair", "refloored", "without"):
        original = getattr(_Ledger, name)  # `of` comes bound to the class

        def spy(*args, _name=name, _original=original, **kwargs):
            made = _original(*args, **kwargs)
            laid_out.append((_name, [j.key for j in made.order]))
            return made

        monkeypatch.setattr(_Ledger, name, staticmethod(spy) if name == "of" else spy)
    a = job("a", 400, 400, done=10, verdict=ADMITTED, placement={"n1": 2}, share=2)
    # b's deadline comes before late's: it does not go last in deadline order.
    b = job("b", 100, 50, submit=5)
    d = DeadlineElastic().decide(snapshot(nodes(4, 4), a, hopeless(), b, now=0.0)).jobs
    assert laid_out == [("of", ["b", "a"])]
    assert d["b"].verdict is ADMITTED and d["a"].guaranteed_gpus == 1


def test_a_guarantee_only_the_others_break_is_still_repaired():
    # Alone on the 4 GPUs left, b could still finish (800 steps by 250 s): it stays in the ledger and keeps
    # the old reason, after a repair finds no plan for both.
    a = job("a", 800, 200, verdict=ADMITTED, placement={"n0": 4})
    b = job("b", 800, 250, verdict=ADMITTED, placement={"n1": 4})
    d = DeadlineElastic().decide(snapshot(nodes(4, 4, unschedulable=("n1",)), a, b)).jobs
    assert "its deadline can no longer be guaranteed (needs" in d["b"].reason
