"""Straggler detection: a sequential test (CUSUM) per rank on its compute time against its role group.

Each evaluation gets the newest step time of every rank of one job (NaN when a
rank reported nothing new) and each rank's role group. A rank's deviation is
`log(step_time) - median(log(step_time))` over the healthy ranks of its role
group that reported in the same evaluation, so that a job-wide or role-wide
change (warm-up, a checkpoint, a slow data loader feeding the first stage) moves
the reference with it. A group with fewer than three reporting peers (a group of
one or two, or a group whose other machines are flagged) compares each rank with
its own baseline instead: its deviation from the job's median, minus that
deviation's usual level, minus what its healthy group peers' deviations do
together (a role-wide change).

The baseline is learned all the time, while peers still judge, so that a rank
that falls back to it has one; it is learned only from a rank that is healthy and
not suspect (its CUSUM below half the threshold), and once a rank turns suspect its
baseline goes back to what it was the last time its CUSUM was zero, before the
change began. A straggler is therefore never compared with its own slow self,
and what its finding states as the slowdown is the median deviation since its
CUSUM last left zero (the sequential test's estimate of the change) against
that baseline or its peers.

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
from flotilla.health.window import mad_factor


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
        self.basis = np.array(["role-peers"] * n, dtype=object)   # what each rank was last judged against
        self._noise: list[deque[float]] = [deque(maxlen=window) for _ in self.members]
        self._alpha = 2.0 / (history_span + 1)
        self._history_warmup = history_warmup
        self._base = np.zeros(n)        # each rank's usual log step time relative to the job's median
        self._safe = np.zeros(n)        # ... as it was the last time the rank's CUSUM was zero
        self._frozen = np.zeros(n, dtype=bool)
        self._seen = np.zeros(n, dtype=np.int64)
        self._excess: list[deque[float]] = [deque(maxlen=window) for _ in range(n)]   # since the CUSUM left zero

    def update(self, step_times: np.ndarray, peers: np.ndarray) -> list[Finding]:
        """`step_times`: (ranks,), NaN = no new step; `peers`: the ranks that may define normal."""
        with np.errstate(invalid="ignore", divide="ignore"):
            x = np.log(np.where(step_times > 0, step_times, np.nan))
        reported = np.isfinite(x)
        dev = np.full(len(x), np.nan)
        job_ref = x[reported & peers]
        rel = x - float(np.median(job_ref)) if len(job_ref) >= 3 else np.full(len(x), np.nan)
        own = np.where(self._seen >= self._history_warmup, rel - self._base, np.nan)
        for g, idx in enumerate(self.members):
            here = idx[reported[idx]]
            ref = here[peers[here]]
            if len(ref) >= 3:
                median = float(np.median(x[ref]))
                dev[here] = x[here] - median
                noise = float(np.median(np.abs(dev[ref]))) / mad_factor(len(ref))
                self.basis[here] = "role-peers"
            else:
                noise = self._against_own_baseline(here[np.isfinite(own[here])], own, peers, dev)
            if np.isfinite(noise):
                self._noise[g].append(noise)
            if len(self._noise[g]) >= self.warmup:
                self.sigma[idx] = max(float(np.median(self._noise[g])), self.min_sigma)
        judged = np.isfinite(dev) & np.isfinite(self.sigma)
        sigma = self.sigma[judged]
        z = np.clip(dev[judged] / sigma, -self.clip, self.clip)
        k = np.maximum(self.shift / (2.0 * sigma), self.k_min)
        self.cusum[judged] = np.clip(self.cusum[judged] + z - k, 0.0, 2.0 * self.threshold)
        self._track(judged, dev)
        self._learn(reported & peers & np.isfinite(rel), rel)
        return [Finding(int(i), "step_time", float(self.cusum[i]), self.slowdown(int(i)), 1.0, 1)
                for i in np.flatnonzero(self.cusum >= self.threshold)]

    def slowdown(self, member: int) -> float:
        """The rank's step time over its reference since its CUSUM last left zero (1.0 = as usual): the median,
        so that a noisy step or two from before the change does not pull it."""
        q = self._excess[member]
        return float(np.exp(np.median(q))) if q else 1.0

    def _against_own_baseline(self, here: np.ndarray, own: np.ndarray, peers: np.ndarray, dev: np.ndarray) -> float:
        """Deviation of each rank from its own baseline less what its healthy group peers do together (a change
        of the whole role); returns one noise sample, from the healthy ranks only."""
        if not len(here):
            return np.nan
        healthy = here[peers[here]]
        for i in here:
            others = healthy[healthy != i]
            dev[i] = own[i] - (float(np.median(own[others])) if len(others) else 0.0)
        self.basis[here] = "own-history"
        return float(np.median(np.abs(dev[healthy]))) / 0.6745 if len(healthy) else np.nan

    def _track(self, judged: np.ndarray, dev: np.ndarray) -> None:
        """The change-point bookkeeping: the deviations since each CUSUM last left zero, and the baseline as
        it was before a rank turned suspect."""
        zero = self.cusum <= 0.0
        for i in np.flatnonzero(zero):
            self._excess[i].clear()
        for i in np.flatnonzero(judged & ~zero):
            self._excess[i].append(float(dev[i]))
        suspect = self.cusum >= self.threshold / 2
        turned = suspect & ~self._frozen
        self._base[turned] = self._safe[turned]
        self._frozen = (self._frozen | suspect) & ~zero
        self._safe[zero] = self._base[zero]

    def _learn(self, usable: np.ndarray, rel: np.ndarray) -> None:
        """Move the baseline of healthy ranks that are not suspect; a rank's first value starts it."""
        learn = usable & ~self._frozen & (self.cusum < self.threshold / 2)
        first = learn & (self._seen == 0)
        self._base[first] = rel[first]
        move = learn & ~first
        self._base[move] += self._alpha * (rel[move] - self._base[move])
        self._seen[learn] += 1

    def calm(self, member: int) -> bool:
        return bool(self.cusum[member] < self.threshold / 2)
