"""The metric-source interface every agent source implements."""

from __future__ import annotations

from typing import Protocol

from flotilla.health.samples import Sample


class SourceUnavailable(RuntimeError):
    """The source cannot run on this machine (no GPU, no driver, no pynvml); the message says why."""


class MetricSource(Protocol):
    name: str

    def collect(self, now: float) -> list[Sample]:
        """Samples for time `now` (seconds since the epoch). `job` may be left None: the agent fills it in."""
        ...

    def close(self) -> None: ...
