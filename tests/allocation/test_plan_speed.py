"""The shortcuts `CapacityProfile._plan` takes on a profile with a segment per reservation give the plan
the whole computation gives: the restore carried over only where it runs past its segment, and the plan
worked out first over the segments up to a little past the job's earliest finish."""

import random

import numpy as np
from builders import job

from flotilla.allocation import ScalingCurve
from flotilla.allocation.admission import CapacityProfile, _carry_over, _tables
from flotilla.allocation.sizes import job_sizes

CURVES = (ScalingCurve.of({1: 1.0, 2: 1.9, 4: 3.6, 8: 6.4, 16: 10.0}),
          ScalingCurve.of({1: 1.0, 2: 1.7, 4: 2.6, 8: 3.0}),
          ScalingCurve.of({1: 1.0, 8: 8.0, 32: 30.0}))


def _carry_every_segment(lost, lens, restores):
    for i in range(len(lost) - 1):
        if lost[i] > lens[i] and not restores[i + 1]:
            lost[i + 1] += lost[i] - lens[i]


def test_the_restore_carried_over_only_where_it_runs_past_its_segment_is_the_same_as_walking_every_segment():
    rng = np.random.default_rng(5)
    for _ in range(2000):
        n = int(rng.integers(1, 40))
        lens = rng.choice([1.0, 5.0, 20.0, 100.0], n)
        restores = rng.random(n) < 0.3
        lost = restores * rng.choice([0.0, 30.0, 60.0])
        if rng.random() < 0.3:
            lost[0] = 45.0  # a restore under way
        expected, got = lost.copy(), lost.copy()
        _carry_every_segment(expected, lens, restores)
        _carry_over(got, lens, restores)
        assert np.array_equal(expected, got), (lens, restores, lost)


def _profile(rng: random.Random) -> CapacityProfile:
    capacity = rng.choice((8, 32))
    profile = CapacityProfile(0.0, capacity)
    for i in range(rng.randrange(5, 120)):  # many reservations: many short segments
        j = job(f"r{i}", rng.randrange(10, 5000), rng.uniform(100, 20000), max_gpus=capacity,
                curve=rng.choice(CURVES), restore=rng.choice((0.0, 30.0)))
        profile.reserve(j, j.deadline)
    return profile


def _plan_over_all(profile, j, x, until, k, held, pause):
    """`_plan` without its first-segments shortcut: the plan over all k segments before `until`."""
    tables = _tables(*job_sizes(j))
    applies, flat = profile._plan_flat(j, tables, x, until, k, held, pause)
    return flat if applies else profile._plan_stepped(j, tables, x, until, k, held, pause)


def test_a_plan_worked_out_over_the_first_segments_is_the_plan_over_all_of_them():
    checked = 0
    for seed in range(150):
        rng = random.Random(seed)
        profile = _profile(rng)
        held = rng.choice((0, 0, 1, 2, 4))
        j = job("x", rng.randrange(10, 8000), rng.uniform(50, 30000), done=rng.choice((0, 5)), max_gpus=16,
                placement={"n0": held} if held else None, curve=rng.choice(CURVES),
                restore=rng.choice((0.0, 10.0, 30.0, 200.0)))
        for x in job_sizes(j)[0]:
            k = int(profile.bounds.searchsorted(j.deadline, side="left"))
            if not k:
                continue
            pause = rng.choice((0.0, 20.0))
            got = profile._plan(j, x, j.deadline, held, pause)
            full = _plan_over_all(profile, j, x, j.deadline, k, held, pause)
            assert (got is None) == (full is None), seed
            if got is not None:
                assert got[1] == full[1] and np.array_equal(got[0], full[0]), seed
                checked += 1
    assert checked > 100


def test_the_flat_plan_is_the_stepped_plan():
    """`_plan_flat` (a job that gets all x GPUs until it finishes: one restore at most, a closed-form finish)
    against the segment-by-segment computation, on profiles with many short segments, restores and pauses:
    the same shares, the same finish to rounding, and infeasible where that is; taken often enough to
    matter."""
    taken = infeasible = 0
    for seed in range(300):
        rng = random.Random(1000 + seed)
        profile = _profile(rng)
        held = rng.choice((0, 0, 1, 2, 4, 8))
        j = job("x", rng.randrange(1, 8000), rng.uniform(5, 30000), done=rng.choice((0, 5)), max_gpus=16,
                placement={"n0": held} if held else None, curve=rng.choice(CURVES),
                restore=rng.choice((0.0, 0.5, 10.0, 30.0, 200.0)))
        tables = _tables(*job_sizes(j))
        for x in job_sizes(j)[0]:
            for until in (j.deadline, float("inf")):
                k = int(profile.bounds.searchsorted(until, side="left"))
                if not k:
                    continue
                pause = rng.choice((0.0, 0.0, 3.0, 20.0, 500.0))
                applies, flat = profile._plan_flat(j, tables, x, until, k, held, pause)
                if not applies:
                    continue
                with np.errstate(invalid="ignore"):  # a finish in a period that never ends: nan (skipped below)
                    stepped = profile._plan_stepped(j, tables, x, until, k, held, pause)
                if flat is None:
                    assert stepped is None or stepped[1] >= until * (1 - 1e-12), seed
                    infeasible += 1
                    continue
                assert stepped is not None, seed
                if np.isnan(stepped[1]):
                    continue  # the segment-by-segment finish in a segment that never ends (until=inf) is nan
                assert abs(flat[1] - stepped[1]) <= 1e-9 * max(1.0, abs(flat[1])), seed
                assert np.array_equal(flat[0], stepped[0]) and flat[0].dtype == stepped[0].dtype, seed
                taken += 1
    assert taken > 200 and infeasible > 5, (taken, infeasible)
