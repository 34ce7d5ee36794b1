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
    """One `heartbeat` sample (1) per collect: the controller treats its absence as a fault.
    An agent that stops on purpose says goodbye with a last heartbeat of 0, so that its
    silence is not taken for a lost node."""

    name = "heartbeat"

    def __init__(self, node: str) -> None:
        self.node = node

    def collect(self, now: float) -> list[Sample]:
        return [Sample(now, self.node, "heartbeat", 1.0)]

    def close(self) -> None:
        pass


class Agent:
    def __init__(self, sources: Sequence[MetricSource], publisher: BufferedPublisher,
                 job: Callable[[], str | None] = lambda: None) -> None:
        self.sources, self.publisher, self.job = list(sources), publisher, job

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
        for source in self.sources:
            if isinstance(source, HeartbeatSource):
                self.publisher.add([Sample(time.time(), source.node, "heartbeat", 0.0)])
        self.publisher.flush()
        self.publisher.transport.close()
