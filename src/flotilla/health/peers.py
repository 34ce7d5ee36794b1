"""Minder-style faulty-machine detection inside one peer group (the machines of one job doing the same work).

Each evaluation gets one row per machine of the compared metrics (see
`metrics.COMPARED`, already reduced over the machine's GPUs). Every metric is
normalised against the group: a robust z-score around the peers' median, in
units of max(sigma, floor, rel_floor * |median|), sigma = MAD / E[MAD] for the group's size
(1.4826 * MAD in a large group), signed so that the bad
direction is positive and clipped. Because the median moves with the group, a
load shift that hits all machines at once leaves the scores near zero. A
machine's score on a metric is the mean of its z over a sliding window; a
machine whose best score stays above the threshold for `continuity`
consecutive evaluations is confirmed as the outlier.

A group with fewer than three healthy peers is scored against each machine's own
recent history instead (`SelfHistory`), through the same window and continuity
(`PeerOutlierDetector.judge`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flotilla.health.metrics import COMPARED
from flotilla.health.window import RollingMedian, Streak, mad_factor, nanmedian0

_SIGN = np.array([1.0 if m.bad == "high" else -1.0 for m in COMPARED])
_FLOOR = np.array([m.floor for m in COMPARED])
_REL_FLOOR = np.array([m.rel_floor for m in COMPARED])
_INTERMITTENT = np.array([m.intermittent for m in COMPARED])


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
    def __init__(self, size: int, *, window: int, continuity: int, threshold: float, clip: float,
                 flap_window: int = 60, flap_count: int = 6) -> None:
        self.continuity = continuity
        self.threshold = threshold
        self.clip = clip
        self.flap_count = flap_count
        self._scores = RollingMedian(window, (size, len(COMPARED)))
        self._extreme = np.zeros((flap_window, size, int(_INTERMITTENT.sum())), dtype=bool)
        self._next = 0
        self.flaps = np.zeros((size, int(_INTERMITTENT.sum())), dtype=np.int64)
        self._previous = np.full((size, len(COMPARED)), np.nan)
        self._jitter = np.zeros((size, len(COMPARED)))
        self._alpha = 0.05
        self._streak = Streak(size)
        self.last_scores = np.zeros((size, len(COMPARED)))
        self.last_known = np.zeros((size, len(COMPARED)), dtype=bool)   # the newest z was a score, not NaN

    def update(self, values: np.ndarray, peers: np.ndarray) -> list[Finding]:
        """`values`: (machines, compared metrics), NaN = missing; `peers`: mask of the machines that
        define normal (confirmed-faulty machines are scored but not used as peers)."""
        if peers.sum() < 3:
            return []
        ref = values[peers]
        median = nanmedian0(ref)
        mad = nanmedian0(np.abs(ref - median))
        # MAD of a small group underestimates the spread: scaled for the group's size (1.4826 for a large one)
        sigma = np.nan_to_num(mad) / mad_factor(int(peers.sum()))
        scale = np.maximum(np.maximum(sigma, _FLOOR), _REL_FLOOR * np.abs(np.nan_to_num(median)))
        # A deviation within a machine's own sample-to-sample noise is no evidence (a noisy sensor); intermittent
        # metrics keep the group's scale, or the flaps themselves would widen it.
        scale = np.where(_INTERMITTENT, scale, np.maximum(scale, self._noise(values)))
        return self.judge((values - median) / scale * _SIGN, values, np.broadcast_to(median, values.shape))

    def _noise(self, values: np.ndarray) -> np.ndarray:
        """Each machine's own noise per metric: an average of |successive differences| / 1.128 (= sigma)."""
        step = np.abs(values - self._previous)
        seen = np.isfinite(step)
        self._jitter = np.where(seen, (1 - self._alpha) * self._jitter + self._alpha * np.where(seen, step, 0.0),
                                self._jitter)
        self._previous = np.where(np.isfinite(values), values, self._previous)
        return self._jitter / 1.128

    def judge(self, z: np.ndarray, values: np.ndarray, reference: np.ndarray) -> list[Finding]:
        """Window and continuity over signed scores `z` (bad direction positive, NaN = no score) against
        `reference` (the peers' median, or each machine's own baseline), both shaped like `values`."""
        self.last_known = np.isfinite(z)
        z = np.clip(np.nan_to_num(z), -self.clip, self.clip)
        self.last_scores = scores = self._scores.push(z)
        best = scores.argmax(axis=1)
        best_score = scores[np.arange(len(best)), best]
        streak = self._streak.update(best_score > self.threshold)
        out = [
            Finding(int(i), COMPARED[best[i]].name, float(best_score[i]), float(values[i, best[i]]),
                    float(reference[i, best[i]]), int(streak[i]))
            for i in np.flatnonzero(streak >= self.continuity)
        ]
        # An intermittent fault (a link that flaps for a few seconds at a time) rarely fills the window: count
        # the evaluations at the clip over a longer window instead.
        self._extreme[self._next] = z[:, _INTERMITTENT] >= self.clip
        self._next = (self._next + 1) % len(self._extreme)
        self.flaps = self._extreme.sum(axis=0)
        names = [m.name for m in COMPARED if m.intermittent]
        columns = np.flatnonzero(_INTERMITTENT)
        done = {f.member for f in out}
        for i in np.flatnonzero(self.flaps.max(axis=1) >= self.flap_count):
            if int(i) not in done:
                k = int(self.flaps[i].argmax())
                out.append(Finding(int(i), names[k], float(scores[i, columns[k]]), float(values[i, columns[k]]),
                                   float(reference[i, columns[k]]), int(self.flaps[i, k])))
        return out

    def calm(self, member: int, metric_index: int) -> bool | None:
        """The machine looks normal on the metric now; None when it was not scored this evaluation (its own
        history does not judge during a job-wide excursion): not judged is not evidence that it recovered."""
        if not self.last_known[member, metric_index]:
            return None
        return bool(self.last_scores[member, metric_index] <= self.threshold) and not self.flaps[member].any()


class SelfHistory:
    """Each machine's own recent history of every compared metric: a slow moving baseline and spread.

    `score` gives the signed z of the newest values against the baseline, in units of
    max(1.2533 * mean absolute deviation, floor, rel_floor * |baseline|); NaN until a
    machine has `warmup` evaluations of a metric. `learn` moves the baseline (an
    exponential average over about `span` evaluations) only where the caller says the
    value is normal, so that a fault is not absorbed into it.
    """

    def __init__(self, size: int, *, span: int, warmup: int) -> None:
        self.alpha = 2.0 / (span + 1)
        self.warmup = warmup
        self.base = np.full((size, len(COMPARED)), np.nan)
        self._spread = np.zeros((size, len(COMPARED)))
        self._seen = np.zeros((size, len(COMPARED)), dtype=np.int64)

    def score(self, values: np.ndarray) -> np.ndarray:
        scale = np.maximum(np.maximum(1.2533 * self._spread, _FLOOR), _REL_FLOOR * np.abs(np.nan_to_num(self.base)))
        z = (values - self.base) / scale * _SIGN
        return np.where(self._seen >= self.warmup, z, np.nan)

    def learn(self, values: np.ndarray, normal: np.ndarray) -> None:
        have = np.isfinite(values)
        first = have & np.isnan(self.base)
        self.base[first] = values[first]
        move = have & normal & ~first
        d = np.where(move, values - self.base, 0.0)
        self.base += self.alpha * d
        self._spread = np.where(move, (1 - self.alpha) * self._spread + self.alpha * np.abs(d), self._spread)
        self._seen += have & (normal | first)
