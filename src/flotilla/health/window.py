"""Sliding windows and continuity counters shared by the detectors (numpy, per peer group)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np


@lru_cache(maxsize=None)
def mad_factor(n: int) -> float:
    """E[median_i |x_i - median(x)|] for n standard normal draws: a group of n's MAD / this = sigma.
    0.6745 for large groups; much less for small ones (for 3, one of the three deviations is 0)."""
    if n >= 200:
        return 0.6745
    x = np.random.default_rng(0).standard_normal((4000, max(n, 1)))
    return float(np.median(np.abs(x - np.median(x, axis=1, keepdims=True)), axis=1).mean())


def nanmedian0(a: np.ndarray) -> np.ndarray:
    """Median along axis 0 ignoring NaN (NaN where a column is all NaN).

    Same result as np.nanmedian(a, axis=0), several times faster on the small
    arrays the detectors use (np.nanmedian takes a masked-array path there).
    """
    ordered = np.sort(a, axis=0)            # NaN sorts last
    count = (~np.isnan(a)).sum(axis=0)
    lo = np.expand_dims(np.maximum(count - 1, 0) // 2, 0)
    hi = np.expand_dims(count // 2, 0)
    hi = np.minimum(hi, a.shape[0] - 1)
    median = 0.5 * (np.take_along_axis(ordered, lo, 0) + np.take_along_axis(ordered, hi, 0))[0]
    return np.where(count > 0, median, np.nan)


class RollingMedian:
    """Per-cell median over the last `width` rows pushed.

    The median, not the mean, so that a few wild samples (a sensor glitch, a
    two-second stall) cannot carry a window: more than half of it must agree.
    With `skip_missing`, NaN cells (no report) are left out; otherwise the
    caller passes no NaN and cells start at 0.
    """

    def __init__(self, width: int, shape: tuple[int, ...], skip_missing: bool = False) -> None:
        if width < 1:
            raise ValueError("window width must be at least 1")
        self.width = width
        self.skip_missing = skip_missing
        self._rows = np.full((width, *shape), np.nan if skip_missing else 0.0)
        self._next = 0

    def push(self, row: np.ndarray) -> np.ndarray:
        """Add one row and return the window's median (NaN where a cell has no value, with `skip_missing`)."""
        self._rows[self._next] = row
        self._next = (self._next + 1) % self.width
        return nanmedian0(self._rows) if self.skip_missing else np.median(self._rows, axis=0)


class Streak:
    """Consecutive evaluations each member has been flagged."""

    def __init__(self, size: int) -> None:
        self.counts = np.zeros(size, dtype=np.int64)

    def update(self, flagged: np.ndarray) -> np.ndarray:
        self.counts = np.where(flagged, self.counts + 1, 0)
        return self.counts
