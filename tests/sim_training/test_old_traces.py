"""elastic-deadline on the traces of the previous round's `bench/training.py --quick`: no broken promise, and as
many deadlines met as the allocator before this one.

The previous allocator's figures on these traces (commit 1d581df, deadlines met and admitted jobs that missed),
both allocators judged by this simulator, which re-plans when a resized job's restore ends (as the operator
does when the new workers report): 150 jobs / 64 GPUs: 150, 0; 300 jobs / 128 GPUs bursty: 278, 4; 300 jobs /
256 GPUs at 0.5-1.5x: 262, 5. (Under the simulator of its day, which re-planned only at arrivals and
completions: 150, 0; 299, 1; 262, 3.) No node is lost in these traces, so every admitted job that misses is a
broken promise.
"""

from functools import lru_cache

import pytest

from flotilla.allocation import policies
from flotilla.sim.training import SimResult, simulate
from flotilla.sim.training_trace import generate

OLD = [  # (jobs, GPUs, seed, arrivals, deadline factor, the old allocator's deadlines met, its broken promises)
    (150, 64, 1, "poisson", (1.2, 3.0), 150, 0),
    (300, 128, 2, "bursty", (1.2, 3.0), 278, 4),
    (300, 256, 3, "poisson", (0.5, 1.5), 262, 5),
]


@lru_cache(maxsize=None)
def _run(jobs, gpus, seed, arrivals, factor) -> SimResult:
    trace = generate(jobs, gpus, seed=seed, load=2.0, arrivals=arrivals, deadline_factor=factor)
    return simulate(trace, gpus, policies.get("elastic-deadline"))


@pytest.mark.parametrize("jobs, gpus, seed, arrivals, factor, old_met, old_broken", OLD)
def test_no_promise_broken(jobs, gpus, seed, arrivals, factor, old_met, old_broken):
    r = _run(jobs, gpus, seed, arrivals, factor)
    assert r.admitted_missed == 0, r.summary()


def test_no_promise_broken_where_plans_with_no_time_to_spare_broke_one():
    # The held-out 256-GPU shape on a seed of its own (used to tune the headroom admission keeps, never
    # reported as held-out). Without the headroom an admitted job missed here (7603ca0: 718 met, 1 broken), as
    # on held-out seed 15, where a job admitted with 0.3 s to spare lost its guarantee when a plan ahead of it
    # moved by a re-derived share.
    r = _run(1000, 256, 21, "poisson", (0.5, 1.5))
    assert r.admitted_missed == 0, r.summary()


@pytest.mark.parametrize("jobs, gpus, seed, arrivals, factor, old_met, old_broken", OLD)
def test_as_many_deadlines_met_as_before(jobs, gpus, seed, arrivals, factor, old_met, old_broken):
    r = _run(jobs, gpus, seed, arrivals, factor)
    assert r.deadlines_met >= old_met, r.summary()
