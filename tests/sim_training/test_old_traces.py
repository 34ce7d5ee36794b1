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


# Where this allocator meets fewer than the previous one, a strict xfail that says why (a fix makes it fail, and
# the mark goes). The previous allocator broke promises there (it dropped a guarantee a re-plan could not
# re-derive, and admitted newcomers in its place); this one keeps every promise, and refuses the newcomers that
# would break one: on the bursty trace 268 of 300 against 278 (long admitted jobs that wait behind jobs with
# earlier deadlines make admission refuse newcomers, "would break the guarantee of": the reservation order, not
# the capacity). See docs/training.md, "Where the allocator still loses".
_FEWER = {
    "bursty": pytest.mark.xfail(strict=True,
                                reason="bursty trace: 268 met against the previous allocator's 278 (4 broken)"),
}


@pytest.mark.parametrize("jobs, gpus, seed, arrivals, factor, old_met, old_broken",
                         [pytest.param(*t, marks=_FEWER.get(t[3], ())) for t in OLD])
def test_as_many_deadlines_met_as_before(jobs, gpus, seed, arrivals, factor, old_met, old_broken):
    r = _run(jobs, gpus, seed, arrivals, factor)
    assert r.deadlines_met >= old_met, r.summary()
