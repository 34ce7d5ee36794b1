"""The controller's health responder: ingested samples -> detectors -> actions on the cluster.

A sink of the ingest pipeline. Every batch goes through one `HealthMonitor`
(and a tick every half second notices silence: lost heartbeats). For each decision:

* confirmed fault: the Node's `FlotillaGPUHealthy` condition goes False and it is
  tainted `flotilla.dev/unhealthy` (NoExecute for a hardware fault, NoSchedule for a
  transient one); every job on it gets a checkpoint request (`restart: true` when
  the fault no longer lets it write one), so the operator moves it to healthy GPUs;
* confirmed straggler: recorded, and acted on like a fault only with `straggler_action="evict"`;
* cleared (soft findings and lost heartbeats, by rule): condition back to True and taint removed, unless
  another fault the responder acted on is still active on the node (decisions are per node and fault kind):
  then the node keeps that one's condition and taint.

Two limits keep a fault of the pipeline or of the detectors from draining the fleet:

* **Pipeline faults.** The monitor reports silences many nodes share (and the
  controller's own stalls) as pipeline findings, never as node faults. The responder
  keeps the `IngestHealthy` condition (in `GET /v1/cluster`), the gauge
  `flotilla_ingest_pipeline_healthy`, the counter `flotilla_ingest_pipeline_stalls_total`,
  a decision-history record, a log line and an Event on the controller's Pod.
* **The taint budget** (`flotilla.health.budget`): a fault beyond it is recorded
  (`action-suppressed`), counted in `flotilla_health_actions_suppressed_total{reason="taint-budget"}`
  and logged, and the node is neither tainted nor are its jobs asked to move.

Every decision and its evidence goes into the decision history. Returning a node to
service after a non-transient fault is the admin's `POST /v1/nodes/{name}/return-to-service`,
which calls `release`.

`_decide` turns one detector decision into actions (`flotilla.controller.apply`) and writes nothing;
one applier writes them, in order.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, Callable, Literal, Sequence

from flotilla.controller import views
from flotilla.controller.actions import ClusterActionError, ClusterActions
from flotilla.controller.apply import (
    Action,
    Applier,
    CheckpointJobsOn,
    CheckpointJobsOnGpus,
    CountDetection,
    CountSuppressed,
    Record,
    SetGpusOut,
    SetNodeHealth,
)
from flotilla.controller.db import is_outage
from flotilla.controller.metrics import ControllerMetrics
from flotilla.controller.mirror import DecisionRecord
from flotilla.controller.store import Store
from flotilla.health.budget import TaintBudget
from flotilla.health.decision import HealthDecision
from flotilla.health.liveness import PipelineFinding
from flotilla.health.monitor import HealthMonitor
from flotilla.health.samples import Sample
from flotilla.health.scope import FaultScope, fault_scope
from flotilla.resources.names import Reason

log = logging.getLogger(__name__)


class HealthResponder:
    def __init__(self, store: Store, actions: ClusterActions, metrics: ControllerMetrics,
                 monitor: HealthMonitor | None = None, straggler_action: Literal["report", "evict"] = "report",
                 clock: Callable[[], float] = time.time, job_map_ttl: float = 2.0,
                 budget: TaintBudget | None = None, pod: tuple[str, str] | None = None) -> None:
        """`pod`: the controller's own (namespace, name), for Events about the pipeline; None: no Events."""
        self.store, self.actions, self.metrics = store, actions, metrics
        self.applier = Applier(store, actions, metrics)
        self.monitor = monitor or HealthMonitor()
        self.straggler_action = straggler_action
        self.clock = clock
        self.budget = budget or TaintBudget()
        self.pod = pod
        self._lock = threading.Lock()  # ingest arrives from HTTP worker threads and the Redis consumer
        self._act_lock = threading.Lock()  # actions in decision order; the budget's check and spend together
        self._job_of: dict[str, str] = {}
        self._domains: dict[str, str] = {}
        self._maps_at = float("-inf")
        self._job_map_ttl = job_map_ttl
        self._held: set[tuple[str, str]] = set()  # (node, fault kind) the budget held back (never tainted by us)
        self._device: set[tuple[str, str]] = set()  # (node, fault kind) acted on by taking GPUs out, not the node
        self._gpus_out: dict[str, dict[int, str]] = {}  # node -> GPUs this responder took out (and why)
        self._open: dict[str, PipelineFinding] = {}
        self.ingest_condition = _condition(True, "Delivering", "metric samples arrive", clock())
        self._stop = threading.Event()

    # -- the ingest sink ------------------------------------------------------

    def accept(self, samples: Sequence[Sample]) -> None:
        now = self.clock()
        self._refresh_maps(now)
        with self._lock:
            decisions = self.monitor.observe(self._with_jobs(samples), now)
            findings = self.monitor.take_pipeline_findings()
        self._act(decisions, findings)

    def tick(self) -> None:
        now = self.clock()
        self._refresh_maps(now)
        with self._lock:
            decisions = self.monitor.observe((), now)
            findings = self.monitor.take_pipeline_findings()
        self._act(decisions, findings)

    def release(self, node: str) -> None:
        with self._lock:
            self.monitor.release(node)
        self._held = {h for h in self._held if h[0] != node}
        self._device = {h for h in self._device if h[0] != node}
        self._gpus_out.pop(node, None)

    def conditions(self) -> list[dict[str, str | None]]:
        """The controller's own conditions, for `GET /v1/cluster`."""
        return [dict(self.ingest_condition)]

    def run(self, interval: float = 0.5) -> None:
        """Tick every `interval` s: the monitor judges liveness every half of its own interval (1 s)."""
        unreachable = False
        while not self._stop.wait(interval):
            try:
                self.tick()
            except Exception as e:
                if not is_outage(e):
                    log.exception("health tick failed")
                elif not unreachable:  # one line per outage, not one a tick
                    log.warning("health tick: the database is unreachable (%s); ticking on", type(e).__name__)
                unreachable = unreachable or is_outage(e)
            else:
                unreachable = False

    def stop(self) -> None:
        self._stop.set()

    def _refresh_maps(self, now: float) -> None:
        """node -> job (for samples without one) and node -> topology domain, re-read every few seconds."""
        if now - self._maps_at > self._job_map_ttl:
            self._job_of, self._domains, self._maps_at = self.store.job_of_node(), self.store.node_domains(), now
            self.monitor.domains = self._domains

    def _with_jobs(self, samples: Sequence[Sample]) -> list[Sample]:
        """Samples from agents that do not know their node's job get it from the allocation."""
        if all(s.job is not None for s in samples):
            return list(samples)
        return [s if s.job is not None or s.node not in self._job_of
                else dataclasses.replace(s, job=self._job_of[s.node]) for s in samples]

    # -- acting -----------------------------------------------------------------

    def _act(self, decisions: list[HealthDecision], findings: list[PipelineFinding]) -> None:
        with self._act_lock:
            for f in findings:
                self._report_pipeline(f)
            for d in decisions:
                try:
                    self.applier.apply(self._decide(d))
                except ClusterActionError as e:
                    log.error("could not act on %s %s for node %s: %s", d.kind, d.state, d.node, e)

    def _decide(self, d: HealthDecision) -> list[Action]:
        """The actions for one decision of the detectors (the responder's memory, the budget and what it held
        back, moves on here; nothing is written)."""
        acts = d.kind == "fault" or self.straggler_action == "evict"
        inputs = {"evidence": d.evidence, "job": d.job, "transient": d.transient, "checkpointable": d.checkpointable,
                  "detectedAt": d.ts}
        if d.state == "cleared":
            out: list[Action] = []
            if acts and (d.node, d.key) not in self._held and (d.node, d.key) not in self._device:
                remaining = self._acted_on(d.node)
                # another fault still holds the node: keep its taint, un-do only this finding
                out.append(self._taint(remaining[0], self._effect(remaining)) if remaining
                           else SetNodeHealth(d.node, True, "Cleared", d.reason))
            out.append(Record(DecisionRecord("health-cleared", "Node", d.node, d.reason, inputs, actor="controller")))
            log.info("node %s: %s cleared (%s)", d.node, d.kind, d.reason)
            self._held.discard((d.node, d.key))
            return out
        kind = "detection" if d.kind == "fault" else "straggler"
        out = [CountDetection(d.kind, max(0.0, self.clock() - d.ts)),
               Record(DecisionRecord(kind, "Node", d.node, d.reason, inputs, actor="controller"))]
        log.warning("node %s: %s confirmed: %s (evidence %s)", d.node, d.kind, d.reason, d.evidence)
        if not acts:
            return out
        total = self._node_gpus(d.node)
        scope = self._scope(d, total) if d.kind == "fault" else None
        if scope is not None and scope.scope == "device":
            return [*out, *self._take_gpus_out(d, scope, total, inputs)]
        domain = self._domains.get(d.node, d.node)
        held = self.budget.check(self.clock(), d.node, domain, len(self._domains.keys() | {d.node}),
                                 sum(1 for x in self._domains.values() if x == domain) or 1)
        if held is not None:
            log.warning("node %s: %s %s NOT acted on (no taint, no checkpoint request): %s; the decision is in "
                        "the history, an admin decides", d.node, d.kind, d.reason, held)
            return [*out, *self._held_back(d, held, inputs)]
        self.budget.spend(self.clock(), d.node, domain, node_gpus=total)
        self._held.discard((d.node, d.key))
        if scope is not None and d.key in ("xid", "ecc", "gpu-lost"):
            inputs["scope"] = {"scope": scope.scope, "why": scope.why}
        # the taint is the strongest any acted-on finding of the node asks for: a transient one never weakens it
        acted = self._acted_on(d.node) or [d]
        return [*out, self._taint(acted[0], self._effect([d, *acted])),
                CheckpointJobsOn(d.node, f"{d.kind} on node {d.node}: {d.reason}", not d.checkpointable)]

    def _node_gpus(self, node: str) -> int:
        found = self.store.node(node)
        return int(found[0].total_gpus) if found is not None else 0

    def _out_on(self, node: str) -> dict[int, str]:
        """The node's GPUs out of service on their own: what this responder took out, else what the node's
        annotation says (mirrored; e.g. taken out before a restart)."""
        if node in self._gpus_out:
            return self._gpus_out[node]
        found = self.store.node(node)
        raw = (found[0].gpus_out if found is not None else None) or {}
        return {int(g): str(why) for g, why in raw.items() if str(g).isdigit()}

    def _scope(self, d: HealthDecision, total: int) -> FaultScope | None:
        """What `d` takes out of service (flotilla.health.scope); None when the node's GPUs are not known (then
        the node, as before)."""
        if total < 1:
            return None
        try:
            return fault_scope(d, total, self._out_on(d.node))
        except ValueError as e:  # a GPU index beyond the node's count: the node's count is stale, act on the node
            log.warning("node %s: %s; acting on the whole node", d.node, e)
            return None

    def _take_gpus_out(self, d: HealthDecision, scope: FaultScope, total: int,
                       inputs: dict[str, Any]) -> list[Action]:
        """A device-local fault: only its GPUs leave service; only the jobs on them are asked for a checkpoint."""
        domain = self._domains.get(d.node, d.node)
        capacity = self.store.capacity()
        held = self.budget.check(self.clock(), d.node, domain, len(self._domains.keys() | {d.node}),
                                 sum(1 for x in self._domains.values() if x == domain) or 1,
                                 gpus=scope.gpus, node_gpus=total, cluster_gpus=int(capacity["gpus"]))
        inputs = inputs | {"scope": {"scope": "device", "gpus": list(scope.gpus), "why": scope.why}}
        gpus_text = ", ".join(map(str, scope.gpus))
        if held is not None:
            log.warning("node %s: %s on GPU %s NOT acted on: %s", d.node, d.reason, gpus_text, held)
            return self._held_back(d, held, inputs)
        self.budget.spend(self.clock(), d.node, domain, gpus=scope.gpus, node_gpus=total)
        self._held.discard((d.node, d.key))
        self._device.add((d.node, d.key))
        now_out = dict(self._out_on(d.node))
        for g in scope.gpus:
            now_out.setdefault(g, d.reason)
        self._gpus_out[d.node] = now_out
        log.warning("node %s: GPU %s out of service (%s); the node keeps its other GPUs", d.node, gpus_text, scope.why)
        reason = f"{d.reason} on GPU {gpus_text} of node {d.node}"
        return [Record(DecisionRecord("gpu-out-of-service", "Node", d.node, reason, inputs, actor="controller")),
                SetGpusOut(d.node, now_out, f"{d.reason} ({scope.why})"),
                CheckpointJobsOnGpus(d.node, scope.gpus, reason, not d.checkpointable)]

    def _held_back(self, d: HealthDecision, held: str, inputs: dict[str, Any]) -> list[Action]:
        """The taint budget held `d` back: remembered as never acted on, counted, and kept in the history."""
        self._held.add((d.node, d.key))
        return [CountSuppressed("taint-budget"),
                Record(DecisionRecord("action-suppressed", "Node", d.node, held, inputs | {"detection": d.reason},
                                      actor="controller"))]

    def _acted_on(self, node: str) -> list[HealthDecision]:
        """The node's active decisions the responder acted on (tainted for), the governing one first."""
        with self._lock:
            active = self.monitor.active_on(node)
        acted = [d for d in active if (d.kind == "fault" or self.straggler_action == "evict")
                 and (node, d.key) not in self._held and (node, d.key) not in self._device]
        return sorted(acted, key=lambda d: (not d.transient and d.kind == "fault", d.ts), reverse=True)

    @staticmethod
    def _effect(decisions: Sequence[HealthDecision]) -> str:
        lasting = any(not d.transient and d.kind == "fault" for d in decisions)
        return "NoExecute" if lasting else "NoSchedule"

    @staticmethod
    def _taint(d: HealthDecision, effect: str) -> SetNodeHealth:
        return SetNodeHealth(d.node, False, _condition_reason(d), d.reason, effect)

    def _report_pipeline(self, f: PipelineFinding) -> None:
        inputs = {"reason": f.reason, "silent": list(f.silent), "watched": f.watched, "since": f.since,
                  "state": f.state}
        if f.state == "open":
            self._open[f.scope] = f
            self.metrics.ingest_pipeline_stalls.labels(f.reason).inc()
            self.metrics.health_actions_suppressed.labels("pipeline-fault").inc(len(f.silent))
            self.metrics.ingest_pipeline_healthy.set(0)
            self.ingest_condition = _condition(False, _camel(f.reason), f.message, f.ts)
            log.warning("metric pipeline fault (%s): %s", f.scope, f.message)
            self._record(DecisionRecord("pipeline-fault", "Controller", f.scope, f.message, inputs, actor="controller"))
            self._event("Warning", Reason.INGEST_STALLED, f.message)
            return
        if f.reason == "controller-stalled":
            self.metrics.ingest_pipeline_stalls.labels(f.reason).inc()
            log.warning("health: %s", f.message)
            self._record(DecisionRecord("pipeline-fault", "Controller", f.scope, f.message, inputs, actor="controller"))
            self._event("Warning", Reason.CONTROLLER_STALLED, f.message)
            return
        self._open.pop(f.scope, None)
        log.info("metric pipeline (%s): %s", f.scope, f.message)
        self._record(DecisionRecord("pipeline-resumed", "Controller", f.scope, f.message, inputs, actor="controller"))
        if self._open:   # another scope is still silent
            latest = max(self._open.values(), key=lambda o: o.ts)
            self.ingest_condition = _condition(False, _camel(latest.reason), latest.message, f.ts)
            return
        self.metrics.ingest_pipeline_healthy.set(1)
        self.ingest_condition = _condition(True, "Resumed", f.message, f.ts)
        self._event("Normal", Reason.INGEST_RESUMED, f.message)

    def _event(self, type_: str, reason: str, message: str) -> None:
        if self.pod is None:
            return
        namespace, name = self.pod
        try:
            self.actions.post_event({"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name},
                                    type_, reason, message)
        except ClusterActionError as e:
            log.warning("could not post Event %s on pod %s/%s: %s", reason, namespace, name, e)

    def _record(self, decision: DecisionRecord) -> None:
        self.store.record([decision])
        self.metrics.decided([decision])


def _condition(healthy: bool, reason: str, message: str, ts: float) -> dict[str, str | None]:
    return {"type": "IngestHealthy", "status": "True" if healthy else "False", "reason": reason, "message": message,
            "lastTransitionTime": views.iso(ts)}


def _camel(text: str) -> str:
    return "".join(part.capitalize() for part in text.split("-"))


def _condition_reason(d: HealthDecision) -> str:
    """CamelCase reason for the Node condition, from the metric that decided."""
    metric = str(d.evidence.get("metric", d.kind))
    return "".join(part.capitalize() for part in metric.replace("-", "_").split("_")) or "Unhealthy"
