"""A job's measured scaling curve: steps per second as a function of GPUs."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass


@dataclass(frozen=True)
class ScalingCurve:
    """Measured (gpus, steps/s) points, sorted by GPU count.

    Between two points the rate is interpolated linearly. Above the largest
    measured point the rate stays flat (never extrapolated upward: an unmeasured
    speed-up is not promised). Below the smallest point the rate falls in
    proportion to the GPUs (a pessimistic, linear scale-down).
    """

    points: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("a scaling curve needs at least one (gpus, stepsPerSecond) point")
        pts = tuple(sorted((int(g), float(r)) for g, r in self.points))
        for g, r in pts:
            if g <= 0 or r <= 0:
                raise ValueError(f"scaling curve point ({g}, {r}): gpus and stepsPerSecond must be > 0")
        if len({g for g, _ in pts}) != len(pts):
            raise ValueError("scaling curve has two points for the same GPU count")
        object.__setattr__(self, "points", pts)

    @classmethod
    def of(cls, points: dict[int, float] | list[tuple[int, float]]) -> "ScalingCurve":
        items = points.items() if isinstance(points, dict) else points
        return cls(tuple(items))

    def rate(self, gpus: int) -> float:
        """Steps per second at `gpus` GPUs (0 for no GPUs)."""
        if gpus <= 0:
            return 0.0
        pts = self.points
        g0, r0 = pts[0]
        if gpus <= g0:
            return r0 * gpus / g0
        if gpus >= pts[-1][0]:
            return pts[-1][1]
        i = bisect_left(pts, (gpus, float("-inf")))
        g1, r1 = pts[i]
        if g1 == gpus:
            return r1
        ga, ra = pts[i - 1]
        return ra + (r1 - ra) * (gpus - ga) / (g1 - ga)

    def seconds_for(self, steps: float, gpus: int) -> float:
        """Seconds to run `steps` at `gpus` GPUs (inf when it cannot run)."""
        r = self.rate(gpus)
        return steps / r if r > 0 else float("inf")
