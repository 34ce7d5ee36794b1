"""The agent loop: every interval, collect from each source, label, buffer, publish."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Callable, Sequence

from flotilla.agent.publish import BufferedPublisher
from flotilla.agent.sources import MetricSource
from flotilla.agent.steps import StepIntake
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
    """Samples its sources every interval and publishes them. Samples that name no job get the job (and
    role) the step intake learned for their GPU from the workers' reports, else `job()` (--job). An
    agent that stops on purpose says goodbye with a last heartbeat of 0 for its node, so its silence is
    not taken for a lost node."""

    def __init__(self, node: str, sources: Sequence[MetricSource], publisher: BufferedPublisher,
                 job: Callable[[], str | None] = lambda: None, intake: StepIntake | None = None) -> None:
        self.node, self.sources, self.publisher, self.job, self.intake = node, list(sources), publisher, job, intake
        if intake is not None and intake not in self.sources:
            self.sources.append(intake)

    def _label(self, s: Sample, default_job: str | None) -> Sample:
        if s.job is not None and (s.role is not None or self.intake is None):
            return s
        job, role = self.intake.placement(s.gpu) if self.intake is not None else (None, None)
        if s.job is not None and s.job != job:
            return s
        job = job or default_job
        return s if job is None else replace(s, job=job, role=s.role if s.role is not None else role)

    def current_job(self) -> str | None:
        return (self.intake.job if self.intake is not None else None) or self.job()

    def tick(self, now: float) -> list[Sample]:
        samples: list[Sample] = []
        for source in self.sources:
            try:
                samples += source.collect(now)
            except Exception:  # one broken source must not stop the others or the heartbeat
                log.exception("source %s failed", source.name)
        default_job = self.job()
        samples = [self._label(s, default_job) for s in samples]
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
        self.publisher.add([Sample(time.time(), self.node, "heartbeat", 0.0, self.current_job())])
        self.publisher.flush()
        self.publisher.transport.close()
