"""Straggler detection: a rank whose step time stays above its peers' median by a margin.

Each evaluation gets the newest step time of every rank of one job (NaN when a
rank reported nothing new). A rank's level is its mean step time over a
sliding window; its score is that level divided by the median level of all
ranks. A rank whose score exceeds 1 + margin for `continuity` consecutive
evaluations is a straggler. Step times must be the rank's own compute time
(without waiting on collectives), or every rank of a synchronous job would show
the straggler's time.
"""

from __future__ import annotations

import numpy as np

from flotilla.health.peers import Finding
from flotilla.health.window import RollingMedian, Streak


class StragglerDetector:
    def __init__(self, size: int, *, window: int, continuity: int, margin: float) -> None:
        self.continuity = continuity
        self.margin = margin
        self._levels = RollingMedian(window, (size,), skip_missing=True)
        self._streak = Streak(size)
        self.last_ratio = np.ones(size)

    def update(self, step_times: np.ndarray, peers: np.ndarray) -> list[Finding]:
        levels = self._levels.push(step_times)
        ref = levels[peers & ~np.isnan(levels)]
        if len(ref) < 3:
            return []
        median = float(np.median(ref))
        if median <= 0:
            return []
        self.last_ratio = ratio = np.nan_to_num(levels / median, nan=1.0)
        streak = self._streak.update(ratio > 1.0 + self.margin)
        return [Finding(int(i), "step_time", float(ratio[i]), float(levels[i]), median, int(streak[i]))
                for i in np.flatnonzero(streak >= self.continuity)]

    def calm(self, member: int) -> bool:
        return bool(self.last_ratio[member] <= 1.0 + self.margin)
