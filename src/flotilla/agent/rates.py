"""Cumulative counters -> per-second rates, in the agent, so that the detectors only ever see rates.

Rules (one series per key, e.g. ("net_errors",) or ("pcie_replay", gpu)):

* first sample of a series: no rate yet (None), the value is remembered;
* a counter that went down was reset (driver reload, NIC re-created, exporter
  restart): it counted up from 0 since, so the increase is the new value, as
  Prometheus' rate() takes it;
* a gap longer than `max_gap` seconds (the source was silent, a GPU came back):
  no rate for this sample, the series starts again from it; an average over a
  long silence would spread a burst so thin it says nothing about now;
* a sample not newer than the last one (a repeated scrape): no rate, and the
  last sample is kept.
"""

from __future__ import annotations

from typing import Hashable


class CounterRates:
    def __init__(self, max_gap: float = 30.0) -> None:
        if max_gap <= 0:
            raise ValueError("max_gap must be positive")
        self.max_gap = max_gap
        self._last: dict[Hashable, tuple[float, float]] = {}

    def rate(self, key: Hashable, ts: float, value: float) -> float | None:
        last = self._last.get(key)
        if last is not None and ts <= last[0]:
            return None
        self._last[key] = (ts, value)
        if last is None or ts - last[0] > self.max_gap:
            return None
        increase = value - last[1] if value >= last[1] else value
        return increase / (ts - last[0])
