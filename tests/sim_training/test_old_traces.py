"""elastic-deadline on the traces of the previous round's `bench/training.py --quick`: no more broken promises,
and as many deadlines met as the allocator before this one.

The previous allocator's figures on these traces (commit 1d581df: deadlines met, admitted jobs that missed):
150 jobs / 64 GPUs: 150, 0; 300 jobs / 128 GPUs bursty: 299, 1; 300 jobs / 256 GPUs at 0.5-1.5x: 262, 3.
No node is lost in these traces, so every admitted job that misses is a broken promise.
"""

from functools import lru_cache

import pytest

from flotilla.allocation import policies
from flotilla.sim.training import SimResult, simulate
from flotilla.sim.training_trace import generate

OLD = [  # (jobs, GPUs, seed, arrivals, deadline factor, the old allocator's deadlines met, its broken promises)
    (150, 64, 1, "poisson", (1.2, 3.0), 150, 0),
    (300, 128, 2, "bursty", (1.2, 3.0), 299, 1),
    (300, 256, 3, "poisson", (0.5, 1.5), 262, 3),
]


@lru_cache(maxsize=None)
def _run(jobs, gpus, seed, arrivals, factor) -> SimResult:
    trace = generate(jobs, gpus, seed=seed, load=2.0, arrivals=arrivals, deadline_factor=factor)
    return simulate(trace, gpus, policies.get("elastic-deadline"))


@pytest.mark.parametrize("jobs, gpus, seed, arrivals, factor, old_met, old_broken", OLD)
def test_no_more_broken_promises_than_before(jobs, gpus, seed, arrivals, factor, old_met, old_broken):
    r = _run(jobs, gpus, seed, arrivals, factor)
    assert r.admitted_missed <= old_broken, r.summary()


# Where this allocator meets fewer than the previous one, each a strict xfail that says why (a fix makes it fail,
# and the mark goes). The previous allocator broke promises on both (it dropped a guarantee a re-plan could not
# re-derive, and admitted newcomers in its place); this one keeps every promise, and refuses the newcomers that
# would break one: on the bursty trace 267 of 300 against 299 (long admitted jobs that wait behind jobs with
# earlier deadlines make admission refuse newcomers: "would break the guarantee of": 20 of the 33 for job-00139,
# which laid just ahead of each newcomer fits with it in 19 of 20: the reservation order, not the capacity);
# on the 300/256 trace 261 against 262 (its 10 extra are refused for job-00183 and job-00072, the promises it
# broke). See docs/training.md, "Where the allocator still loses".
_FEWER = {
    "bursty": pytest.mark.xfail(strict=True, reason="bursty trace: 267 met against the previous allocator's 299"),
    256: pytest.mark.xfail(strict=True, reason="300/256 trace: 261 met (0 broken) against 262 (3 broken)"),
}


@pytest.mark.parametrize("jobs, gpus, seed, arrivals, factor, old_met, old_broken",
                         [pytest.param(*t, marks=_FEWER.get(t[3]) or _FEWER.get(t[1]) or ()) for t in OLD])
def test_as_many_deadlines_met_as_before(jobs, gpus, seed, arrivals, factor, old_met, old_broken):
    r = _run(jobs, gpus, seed, arrivals, factor)
    assert r.deadlines_met >= old_met, r.summary()
