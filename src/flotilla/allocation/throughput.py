"""Measured throughput against the scaling curve: when to re-plan, and the corrected curve.

The operator compares a running job's measured steps/s (from its workers'
progress reports) with what its curve promises at its GPU count. When they
part by more than a tolerance, it re-plans with the curve scaled to match the
measurement, so admission and marginal gains use what the job really does.
"""

from __future__ import annotations

from flotilla.allocation.curve import ScalingCurve

DEFAULT_TOLERANCE = 0.2


def departs(curve: ScalingCurve, gpus: int, measured: float, tolerance: float = DEFAULT_TOLERANCE) -> bool:
    """Whether `measured` steps/s at `gpus` GPUs is off the curve by more than `tolerance` (relative)."""
    if gpus <= 0 or measured < 0:
        raise ValueError(f"need gpus > 0 and measured >= 0, got gpus={gpus}, measured={measured}")
    expected = curve.rate(gpus)
    return abs(measured - expected) > tolerance * expected


def calibrated(curve: ScalingCurve, gpus: int, measured: float) -> ScalingCurve:
    """The curve scaled so that it passes through the measurement at `gpus` GPUs."""
    if gpus <= 0 or measured <= 0:
        raise ValueError(f"need gpus > 0 and measured > 0, got gpus={gpus}, measured={measured}")
    factor = measured / curve.rate(gpus)
    return ScalingCurve(tuple((g, r * factor) for g, r in curve.points))
