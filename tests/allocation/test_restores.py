"""Restores in a plan: the share a running job can keep, and the GPUs it holds while it restores.

Both cases come from re-plans that broke guarantees on bench/training.py's traces (see docs/training.md).
Curves are linear (1 step/s per GPU) unless said otherwise.
"""

import numpy as np
from builders import job, nodes, snapshot

from flotilla.allocation import ScalingCurve, Verdict
from flotilla.allocation.admission import CapacityProfile
from flotilla.allocation.elastic import DeadlineElastic

RESNET50 = ScalingCurve.of({1: 10.0, 2: 19.6078, 4: 37.7358, 8: 70.1754, 16: 123.0769, 32: 197.5309})


def _free_at(profile: CapacityProfile, t: float) -> float:
    k = int(np.searchsorted(profile.bounds, t, side="right")) - 1
    return float(profile._free[k])


def test_a_running_job_keeps_the_share_it_holds_when_that_still_makes_its_deadline():
    # From the 300-job bursty trace: 1,447 steps left, 62 s to its deadline, 5 GPUs held (45.9 steps/s:
    # 32 s). Any other size first pays a 53 s restore, so only 5, or 25 and more, make it. The search
    # for the smallest share gallops from 3 and must not step over 5 to answer 25 (which took 20 GPUs
    # from later jobs and broke a guarantee).
    j = job("a", 12091, 62.0, done=12091 - 1447, min_gpus=2, max_gpus=32, placement={"n0": 5}, restore=53.2,
            curve=RESNET50)
    profile = CapacityProfile(0.0, 128)
    r = profile.reserve(j, j.deadline, current=5)
    assert (r.size, r.now_gpus) == (5, 5)
    assert _free_at(profile, 1.0) == 123


def test_a_restore_that_runs_past_a_segment_keeps_the_gpus_until_the_job_finishes():
    # 8 GPUs, 4 of them claimed by others from t=100. The job holds 2, has started, needs 360 steps by
    # t=150: 3 GPUs (restore 50 s, then 120 s) is too late, 4 GPUs finish at 50 + 90 = 140. The restore
    # pushes its finish past t=100, and it holds its 4 GPUs until 140: nothing is free in [100, 140).
    j = job("a", 361, 150.0, done=1, max_gpus=8, placement={"n0": 2}, restore=50.0)
    profile = CapacityProfile(0.0, 8, claimed=((100.0, 4),))
    r = profile.reserve(j, j.deadline, current=2)
    assert r.size == 4
    assert _free_at(profile, 50.0) == 4
    assert _free_at(profile, 120.0) == 0
    assert _free_at(profile, 145.0) == 4


def test_a_first_start_after_waiting_costs_no_restore():
    # 4 GPUs, all claimed by others until t=100. The job has not started: it waits, then starts on 4 GPUs
    # at t=100 and needs 400 s of 4 GPUs; its deadline is t=500. A restore counted for its first start
    # would make it 550 and reject it.
    j = job("a", 1600, 500.0, max_gpus=4, restore=50.0)
    profile = CapacityProfile(0.0, 4, claimed=((0.0, 4), (100.0, 0)))
    r = profile.reserve(j, j.deadline)
    assert (r.size, r.now_gpus) == (4, 0)


def test_a_restore_under_way_holds_the_gpus_and_later_jobs_do_not_count_on_them():
    # a holds 4 of 8 GPUs and restores until t=50, then needs 50 s (by t=110: any other size restores
    # again and is too late): it frees them at t=100, not t=50.
    # c (no restore) needs 1,000 steps by t=160: 4 GPUs until 100 and 8 after give it 880: rejected.
    # (Planning a's restore as a deadline 50 s earlier frees its GPUs at t=50 on paper: 1,080, admitted,
    # and a promise broken.)
    a = job("a", 400, 110.0, done=200, max_gpus=4, placement={"n0": 4}, restore=50.0,
            verdict=Verdict.ADMITTED, resumes_at=50.0)
    c = job("c", 1000, 160.0, max_gpus=8, submit=0.0)
    d = DeadlineElastic().decide(snapshot(nodes(8), a, c)).jobs
    assert d["a"].guaranteed_gpus == 4
    assert d["c"].verdict is Verdict.REJECTED, d["c"].reason
