"""The controller's health responder: ingested samples -> detectors -> actions on the cluster.

A sink of the ingest pipeline. Every batch goes through one `HealthMonitor`
(and a tick every second notices silence: lost heartbeats). For each decision:

* confirmed fault: the Node's `FlotillaGPUHealthy` condition goes False and it is
  tainted `flotilla.dev/unhealthy` (NoExecute for a hardware fault, NoSchedule for a
  transient one); every job on it gets a checkpoint request (`restart: true` when
  the fault no longer lets it write one), so the operator moves it to healthy GPUs;
* confirmed straggler: recorded, and acted on like a fault only with `straggler_action="evict"`;
* cleared (transient findings, by rule): condition back to True, taint removed.

Every decision and its evidence goes into the decision history. Returning a node to
service after a non-transient fault is the admin's `POST /v1/nodes/{name}/return-to-service`,
which calls `release`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Callable, Literal, Sequence

from flotilla.controller import checkpoints
from flotilla.controller.actions import ClusterActionError, ClusterActions
from flotilla.controller.metrics import ControllerMetrics
from flotilla.controller.mirror import DecisionRecord
from flotilla.controller.store import Store
from flotilla.health.decision import HealthDecision
from flotilla.health.monitor import HealthMonitor
from flotilla.health.samples import Sample

log = logging.getLogger(__name__)
TERMINAL = ("Succeeded", "Failed", "Rejected")


class HealthResponder:
    def __init__(self, store: Store, actions: ClusterActions, metrics: ControllerMetrics,
                 monitor: HealthMonitor | None = None, straggler_action: Literal["report", "evict"] = "report",
                 clock: Callable[[], float] = time.time, job_map_ttl: float = 2.0) -> None:
        self.store, self.actions, self.metrics = store, actions, metrics
        self.monitor = monitor or HealthMonitor()
        self.straggler_action = straggler_action
        self.clock = clock
        self._lock = threading.Lock()  # ingest arrives from HTTP worker threads and the Redis consumer
        self._job_of: dict[str, str] = {}
        self._job_map_at = float("-inf")
        self._job_map_ttl = job_map_ttl
        self._stop = threading.Event()

    # -- the ingest sink ------------------------------------------------------

    def accept(self, samples: Sequence[Sample]) -> None:
        now = self.clock()
        with self._lock:
            decisions = self.monitor.observe(self._with_jobs(samples, now), now)
        self._act(decisions)

    def tick(self) -> None:
        now = self.clock()
        with self._lock:
            decisions = self.monitor.observe((), now)
        self._act(decisions)

    def release(self, node: str) -> None:
        with self._lock:
            self.monitor.release(node)

    def run(self, interval: float = 1.0) -> None:
        while not self._stop.wait(interval):
            try:
                self.tick()
            except Exception:
                log.exception("health tick failed")

    def stop(self) -> None:
        self._stop.set()

    def _with_jobs(self, samples: Sequence[Sample], now: float) -> list[Sample]:
        """Samples from agents that do not know their node's job get it from the allocation."""
        if all(s.job is not None for s in samples):
            return list(samples)
        if now - self._job_map_at > self._job_map_ttl:
            self._job_of, self._job_map_at = self.store.job_of_node(), now
        return [s if s.job is not None or s.node not in self._job_of
                else dataclasses.replace(s, job=self._job_of[s.node]) for s in samples]

    # -- acting -----------------------------------------------------------------

    def _act(self, decisions: list[HealthDecision]) -> None:
        for d in decisions:
            try:
                self._act_one(d)
            except ClusterActionError as e:
                log.error("could not act on %s %s for node %s: %s", d.kind, d.state, d.node, e)

    def _act_one(self, d: HealthDecision) -> None:
        acts = d.kind == "fault" or self.straggler_action == "evict"
        inputs = {"evidence": d.evidence, "job": d.job, "transient": d.transient, "checkpointable": d.checkpointable,
                  "detectedAt": d.ts}
        if d.state == "cleared":
            if acts:
                self.actions.set_node_health(d.node, True, "Cleared", d.reason)
                self.store.set_node_fields(d.node, healthy=True, taint=None, health_reason=None, health_message=None)
            self._record(DecisionRecord("health-cleared", "Node", d.node, d.reason, inputs, actor="controller"))
            log.info("node %s: %s cleared (%s)", d.node, d.kind, d.reason)
            return
        self.metrics.detected(d.kind, max(0.0, self.clock() - d.ts))
        kind = "detection" if d.kind == "fault" else "straggler"
        self._record(DecisionRecord(kind, "Node", d.node, d.reason, inputs, actor="controller"))
        log.warning("node %s: %s confirmed: %s (evidence %s)", d.node, d.kind, d.reason, d.evidence)
        if not acts:
            return
        effect = "NoSchedule" if d.transient or d.kind == "straggler" else "NoExecute"
        reason = _condition_reason(d)
        self.actions.set_node_health(d.node, False, reason, d.reason, effect=effect)
        self.store.set_node_fields(d.node, healthy=False, taint={"value": reason, "effect": effect},
                                   health_reason=reason, health_message=d.reason)
        for job in self.store.jobs_on_node(d.node):
            if job.phase in TERMINAL:
                continue
            checkpoints.request(self.store, self.actions, self.metrics, job.key,
                                f"{d.kind} on node {d.node}: {d.reason}", not d.checkpointable,
                                actor="controller", requested_by="controller")

    def _record(self, decision: DecisionRecord) -> None:
        self.store.record([decision])
        self.metrics.decided([decision])


def _condition_reason(d: HealthDecision) -> str:
    """CamelCase reason for the Node condition, from the metric that decided."""
    metric = str(d.evidence.get("metric", d.kind))
    return "".join(part.capitalize() for part in metric.replace("-", "_").split("_")) or "Unhealthy"
