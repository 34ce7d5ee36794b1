"""Straggler detection: a sequential test (CUSUM) per rank on its compute time against its role group.

Each evaluation gets the newest step time of every rank of one job (NaN when a
rank reported nothing new) and each rank's role group. A rank's deviation is
`log(step_time) - median(log(step_time))` over the healthy ranks of its role
group that reported in the same evaluation, so that a job-wide or role-wide
change (warm-up, a checkpoint, a slow data loader feeding the first stage) moves
the reference with it. A group with fewer than three reporting peers (a group of
one or two) compares each rank with its own recent history instead: its
deviation from the job's median, minus that deviation's own long-run level.

The deviation is divided by the group's noise (sigma, a robust estimate over the
last `window` evaluations) and accumulated by a one-sided CUSUM,

    S = min(max(0, S + clip(dev / sigma) - k), 2 * threshold),    k = max(shift / (2 sigma), k_min)

which is the optimal sequential test for a step of `shift` in the mean: a steady
slowdown of `shift` (e.g. 5 %) adds `shift / sigma - k` per step, so it is found
after about `threshold / (shift / sigma - k)` steps however small it is, while
noise keeps S near 0. A rank whose S reaches `threshold` is a straggler. Step
times must be the rank's own compute time (without waiting on collectives): in a
synchronous job every rank's wall time is the slowest rank's.
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

import numpy as np

from flotilla.health.peers import Finding
from flotilla.health.window import RollingMedian, mad_factor


class StragglerDetector:
    def __init__(self, groups: Sequence[int] | np.ndarray, *, shift: float, threshold: float, window: int,
                 min_sigma: float, k_min: float = 0.5, clip: float = 4.0, history_span: int = 120,
                 history_warmup: int = 30) -> None:
        self.groups = np.asarray(groups, dtype=np.int64)
        self.members = [np.flatnonzero(self.groups == g) for g in np.unique(self.groups)]
        self.shift, self.threshold, self.min_sigma, self.k_min, self.clip = shift, threshold, min_sigma, k_min, clip
        self.warmup = max(3, window // 4)
        n = len(self.groups)
        self.cusum = np.zeros(n)
        self.sigma = np.full(n, np.nan)
        self._noise: list[deque[float]] = [deque(maxlen=window) for _ in self.members]
        self._level = RollingMedian(15, (n,), skip_missing=True)
        self.level = np.zeros(n)
        self._alpha = 2.0 / (history_span + 1)
        self._history_warmup = history_warmup
        self._base = np.zeros(n)
        self._seen = np.zeros(n, dtype=np.int64)

    def update(self, step_times: np.ndarray, peers: np.ndarray) -> list[Finding]:
        """`step_times`: (ranks,), NaN = no new step; `peers`: the ranks that may define normal."""
        with np.errstate(invalid="ignore", divide="ignore"):
            x = np.log(np.where(step_times > 0, step_times, np.nan))
        reported = np.isfinite(x)
        dev = np.full(len(x), np.nan)
        job_ref = x[reported & peers]
        job_median = float(np.median(job_ref)) if len(job_ref) >= 3 else np.nan
        for g, idx in enumerate(self.members):
            here = idx[reported[idx]]
            ref = here[peers[here]]
            if len(ref) >= 3:
                median = float(np.median(x[ref]))
                dev[here] = x[here] - median
                noise = float(np.median(np.abs(dev[ref]))) / mad_factor(len(ref))
            elif np.isfinite(job_median) and len(here):
                noise = self._own_history(here, x[here] - job_median, dev)
            else:
                continue
            if np.isfinite(noise):
                self._noise[g].append(noise)
            if len(self._noise[g]) >= self.warmup:
                self.sigma[idx] = max(float(np.median(self._noise[g])), self.min_sigma)
        self.level = np.nan_to_num(self._level.push(dev))
        judged = np.isfinite(dev) & np.isfinite(self.sigma)
        sigma = self.sigma[judged]
        z = np.clip(dev[judged] / sigma, -self.clip, self.clip)
        k = np.maximum(self.shift / (2.0 * sigma), self.k_min)
        self.cusum[judged] = np.clip(self.cusum[judged] + z - k, 0.0, 2.0 * self.threshold)
        return [Finding(int(i), "step_time", float(self.cusum[i]), float(np.exp(self.level[i])), 1.0, 1)
                for i in np.flatnonzero(self.cusum >= self.threshold)]

    def _own_history(self, here: np.ndarray, rel: np.ndarray, dev: np.ndarray) -> float:
        """Deviation of each rank from its own long-run level relative to the job; returns one noise sample."""
        warm = self._seen[here] >= self._history_warmup
        first = self._seen[here] == 0
        self._base[here[first]] = rel[first]
        d = rel - self._base[here]
        dev[here[warm]] = d[warm]
        # learn the level while the rank is not alarming, so that a straggler is not absorbed into it
        learn = self.cusum[here] < self.threshold / 2
        self._base[here[learn]] += self._alpha * d[learn]
        self._seen[here] += 1
        return float(np.median(np.abs(d[warm]))) / 0.6745 if warm.any() else np.nan

    def calm(self, member: int) -> bool:
        return bool(self.cusum[member] < self.threshold / 2)
