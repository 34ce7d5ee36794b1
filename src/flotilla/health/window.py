"""Sliding windows and continuity counters shared by the detectors (numpy, per peer group)."""

from __future__ import annotations

import numpy as np


class RollingMean:
    """Mean over the last `width` rows pushed, per cell, ignoring NaN cells."""

    def __init__(self, width: int, shape: tuple[int, ...]) -> None:
        if width < 1:
            raise ValueError("window width must be at least 1")
        self.width = width
        self._values = np.zeros((width, *shape))
        self._present = np.zeros((width, *shape))
        self._sum = np.zeros(shape)
        self._count = np.zeros(shape)
        self._next = 0

    def push(self, row: np.ndarray) -> np.ndarray:
        """Add one row (NaN = missing) and return the window mean (NaN where the window is empty)."""
        present = ~np.isnan(row)
        clean = np.where(present, row, 0.0)
        i = self._next
        self._sum += clean - self._values[i]
        self._count += present - self._present[i]
        self._values[i] = clean
        self._present[i] = present
        self._next = (i + 1) % self.width
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self._count > 0, self._sum / np.maximum(self._count, 1), np.nan)


class Streak:
    """Consecutive evaluations each member has been flagged."""

    def __init__(self, size: int) -> None:
        self.counts = np.zeros(size, dtype=np.int64)

    def update(self, flagged: np.ndarray) -> np.ndarray:
        self.counts = np.where(flagged, self.counts + 1, 0)
        return self.counts
