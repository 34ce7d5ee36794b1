"""The agent loop: every interval, collect from each source, label, buffer, publish."""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Sequence

from flotilla.agent.publish import BufferedPublisher
from flotilla.agent.sources import MetricSource
from flotilla.health.samples import Sample

log = logging.getLogger(__name__)


class HeartbeatSource:
    """One `heartbeat` sample (1) per collect: the controller treats its absence as a fault."""

    name = "heartbeat"

    def __init__(self, node: str) -> None:
        self.node = node

    def collect(self, now: float) -> list[Sample]:
        return [Sample(now, self.node, "heartbeat", 1.0)]

    def close(self) -> None:
        pass


class Agent:
    """Samples its sources every interval and publishes them. An agent that stops on purpose says
    goodbye with a last heartbeat of 0 for its node, so its silence is not taken for a lost node."""

    def __init__(self, node: str, sources: Sequence[MetricSource], publisher: BufferedPublisher,
                 job: Callable[[], str | None] = lambda: None) -> None:
        self.node, self.sources, self.publisher, self.job = node, list(sources), publisher, job

    def tick(self, now: float) -> list[Sample]:
        samples: list[Sample] = []
        for source in self.sources:
            try:
                samples += source.collect(now)
            except Exception:  # one broken source must not stop the others or the heartbeat
                log.exception("source %s failed", source.name)
        job = self.job()
        if job is not None:
            samples = [s if s.job is not None else Sample(s.ts, s.node, s.metric, s.value, job, s.gpu) for s in samples]
        self.publisher.add(samples)
        self.publisher.flush()
        return samples

    def run(self, interval: float, stop: threading.Event, duration: float | None = None) -> None:
        began = time.monotonic()
        next_tick = began
        while not stop.is_set() and (duration is None or time.monotonic() - began < duration):
            self.tick(time.time())
            next_tick += interval
            stop.wait(max(0.0, next_tick - time.monotonic()))
        for source in self.sources:
            source.close()
        self.publisher.add([Sample(time.time(), self.node, "heartbeat", 0.0, self.job())])
        self.publisher.flush()
        self.publisher.transport.close()
