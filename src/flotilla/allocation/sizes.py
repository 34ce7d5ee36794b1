"""The GPU counts a job may be given: any whole-worker count within its elasticity where the curve rises."""

from __future__ import annotations

from bisect import bisect_right
from functools import lru_cache

from flotilla.allocation.curve import ScalingCurve
from flotilla.allocation.snapshot import JobState


@lru_cache(maxsize=4096)
def _sizes(min_gpus: int, max_gpus: int, unit: int, curve: ScalingCurve) -> tuple[tuple[int, ...], tuple[float, ...]]:
    lo = max(unit, -(-min_gpus // unit) * unit)
    hi = (max_gpus // unit) * unit
    sizes: list[int] = []
    rates: list[float] = []
    for g in range(lo, hi + 1, unit):
        r = curve.rate(g)
        # Past the curve's peak more GPUs buy nothing: never offer those sizes.
        if rates and r <= rates[-1]:
            continue
        sizes.append(g)
        rates.append(r)
    return tuple(sizes), tuple(rates)


def job_sizes(job: JobState) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Allowed GPU counts (ascending) and the steps/s at each, for `job`.

    Every whole number of `gpusPerWorker` workers within minGPUs..maxGPUs, and
    only where the curve still rises. A reservation takes exactly what the
    deadline needs (5 GPUs, not 8).
    """
    return _sizes(job.min_gpus, job.max_gpus, job.gpus_per_worker, job.curve)


@lru_cache(maxsize=4096)
def _tiling(sizes: tuple[int, ...], node_gpus: int) -> tuple[int, ...]:
    return tuple(s for s in sizes if s == sizes[0] or s == sizes[-1] or node_gpus % s == 0 or s % node_gpus == 0)


def tiling_sizes(job: JobState, node_gpus: int) -> tuple[int, ...]:
    """The job's sizes that tile nodes of `node_gpus` GPUs (a divisor or a multiple of it), plus its bounds:
    the steps leftover GPUs are handed out in, so that lending them does not fragment nodes."""
    sizes = job_sizes(job)[0]
    if not sizes or node_gpus <= 0:
        return sizes
    return _tiling(sizes, node_gpus)


def fit_size(sizes: tuple[int, ...], gpus: int) -> int:
    """The largest allowed size not above `gpus` (0 when none fits)."""
    i = bisect_right(sizes, gpus)
    return sizes[i - 1] if i else 0
