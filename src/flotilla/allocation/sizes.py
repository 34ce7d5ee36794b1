"""The GPU counts a job may be given: buddy-style blocks within its elasticity."""

from __future__ import annotations

from functools import lru_cache

from flotilla.allocation.curve import ScalingCurve
from flotilla.allocation.snapshot import JobState


@lru_cache(maxsize=4096)
def _sizes(min_gpus: int, max_gpus: int, unit: int, curve: ScalingCurve) -> tuple[tuple[int, ...], tuple[float, ...]]:
    lo = max(unit, -(-min_gpus // unit) * unit)
    hi = (max_gpus // unit) * unit
    if hi < lo:
        return (), ()
    # unit * 2^k keeps blocks aligned on nodes (buddy-style); the bounds themselves
    # are always allowed so that minGPUs and maxGPUs stay reachable.
    candidates = {lo, hi}
    workers = 1
    while unit * workers <= hi:
        if unit * workers >= lo:
            candidates.add(unit * workers)
        workers *= 2
    sizes: list[int] = []
    rates: list[float] = []
    for g in sorted(candidates):
        r = curve.rate(g)
        # Past the curve's peak more GPUs buy nothing: never offer those sizes.
        if rates and r <= rates[-1]:
            continue
        sizes.append(g)
        rates.append(r)
    return tuple(sizes), tuple(rates)


def job_sizes(job: JobState) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Allowed GPU counts (ascending) and the steps/s at each, for `job`.

    Whole `gpusPerWorker` workers, within minGPUs..maxGPUs, in power-of-two
    worker counts (plus the bounds), and only where the curve still rises.
    """
    return _sizes(job.min_gpus, job.max_gpus, job.gpus_per_worker, job.curve)


def fit_size(sizes: tuple[int, ...], gpus: int) -> int:
    """The largest allowed size not above `gpus` (0 when none fits)."""
    best = 0
    for g in sizes:
        if g > gpus:
            break
        best = g
    return best
