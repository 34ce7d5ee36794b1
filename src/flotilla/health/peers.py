"""Minder-style faulty-machine detection inside one peer group (the machines of one training job).

Each evaluation gets one row per machine of the compared metrics (see
`metrics.COMPARED`, already reduced over the machine's GPUs). Every metric is
normalised against the group: a robust z-score around the peers' median, in
units of max(1.4826 * MAD, floor, rel_floor * |median|), signed so that the bad
direction is positive and clipped. Because the median moves with the group, a
load shift that hits all machines at once leaves the scores near zero. A
machine's score on a metric is the mean of its z over a sliding window; a
machine whose best score stays above the threshold for `continuity`
consecutive evaluations is confirmed as the outlier.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flotilla.health.metrics import COMPARED
from flotilla.health.window import RollingMedian, Streak, nanmedian0

_SIGN = np.array([1.0 if m.bad == "high" else -1.0 for m in COMPARED])
_FLOOR = np.array([m.floor for m in COMPARED])
_REL_FLOOR = np.array([m.rel_floor for m in COMPARED])


@dataclass(frozen=True, slots=True)
class Finding:
    """A member (machine or rank) whose score has exceeded the threshold for `streak` evaluations."""

    member: int
    metric: str
    score: float
    value: float
    peer_median: float
    streak: int


class PeerOutlierDetector:
    def __init__(self, size: int, *, window: int, continuity: int, threshold: float, clip: float) -> None:
        self.continuity = continuity
        self.threshold = threshold
        self.clip = clip
        self._scores = RollingMedian(window, (size, len(COMPARED)))
        self._streak = Streak(size)
        self.last_scores = np.zeros((size, len(COMPARED)))

    def update(self, values: np.ndarray, peers: np.ndarray) -> list[Finding]:
        """`values`: (machines, compared metrics), NaN = missing; `peers`: mask of the machines that
        define normal (confirmed-faulty machines are scored but not used as peers)."""
        if peers.sum() < 3:
            return []
        ref = values[peers]
        median = nanmedian0(ref)
        mad = nanmedian0(np.abs(ref - median))
        scale = np.maximum(np.maximum(1.4826 * np.nan_to_num(mad), _FLOOR), _REL_FLOOR * np.abs(np.nan_to_num(median)))
        z = np.clip((values - median) / scale * _SIGN, -self.clip, self.clip)
        self.last_scores = scores = self._scores.push(np.nan_to_num(z))
        best = scores.argmax(axis=1)
        best_score = scores[np.arange(len(best)), best]
        streak = self._streak.update(best_score > self.threshold)
        return [
            Finding(int(i), COMPARED[best[i]].name, float(best_score[i]), float(values[i, best[i]]),
                    float(median[best[i]]), int(streak[i]))
            for i in np.flatnonzero(streak >= self.continuity)
        ]

    def calm(self, member: int, metric_index: int) -> bool:
        return bool(self.last_scores[member, metric_index] <= self.threshold)
