"""Prometheus metrics of the operator, in one dedicated registry: the one home of their names.

What the operator already counts for itself (API requests, throttled seconds, writes and objects in flight,
the view's size, the watches' events and lists, passes by kind) is read at scrape time by `StateCollector`:
nothing is added to the hot path for it. Events are counted as they happen, one counter increment each: a
pass (its duration, objects planned, actions), an admission, a rejection, a reshard, a reclaim, an API
error. docs/operator-metrics.md documents each metric, label by label, with example alerts.

| metric | type | labels |
|---|---|---|
| flotilla_operator_pass_duration_seconds | histogram | (a pass: the view's copy and the plan, not its writes) |
| flotilla_operator_pass_planned_objects | histogram | (jobs, ServingDeployments and Queues a pass planned) |
| flotilla_operator_passes_total | counter | kind: incremental, first, time, nodes, spec, inference-pools |
| flotilla_operator_plan_cpu_seconds_total | counter | (the planning thread's CPU) |
| flotilla_operator_actions_total | counter | (writes planned; an object's chain counts all its actions) |
| flotilla_operator_deferred_total | counter | (objects planned while their earlier writes were still on their way) |
| flotilla_operator_admissions_total | counter | guarantee: deadline, best-effort |
| flotilla_operator_rejections_total | counter | reason: capacity, breaks-guarantee, headroom, deadline-passed, |
|   |   | no-size-fits, other |
| flotilla_operator_reshards_total | counter | (TrainingJob status.reshards increments written) |
| flotilla_operator_reclaims_total, _reclaimed_gpus_total | counter | queue (the owner), from_queue (the borrower) |
| flotilla_operator_api_requests_total | counter | (writes sent: patches, creates, deletes, applies, Events) |
| flotilla_operator_api_errors_total | counter | reason: timeout, not-leader, http-<status>, other |
| flotilla_operator_throttled_seconds_total | counter | (waits imposed by --qps/--burst) |
| flotilla_operator_leader | gauge | (1 while this replica acts: it holds the Lease, or runs without election) |
| flotilla_operator_writes_in_flight | gauge | (API writes sent and not answered; at most --concurrency) |
| flotilla_operator_objects_in_flight | gauge | (objects whose write chain is on its way) |
| flotilla_operator_view_objects | gauge | kind: nodes, jobs, servings, deployments, pods, queues |
| flotilla_operator_watch_events_total | counter | kind |
| flotilla_operator_watch_lists_total | counter | kind (the first list, and one per watch that could not resume) |
| flotilla_operator_relists_total | counter | kind (periodic full re-lists), result: ok, failed |
| flotilla_operator_relist_ghosts_total | counter | kind (objects a list lacked: deleted while no watch looked) |
| process_cpu_seconds_total, process_resident_memory_bytes, ... | | (prometheus_client's process collector) |
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from flotilla.resources import phases

if TYPE_CHECKING:
    from flotilla.operator.handlers import Operator

log = logging.getLogger(__name__)

PASS_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 60)
PLANNED_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)
PASS_KINDS = ("incremental", "first", "time", "nodes", "spec", "inference-pools")
VIEW_KINDS = ("nodes", "jobs", "servings", "deployments", "pods", "queues")
GUARANTEES = ("deadline", "best-effort")

# A rejection's reason label, from the allocator's message (flotilla.allocation.elastic `_admit` and
# admission `Shortfall.describe`): (label, how the message starts or what it holds). Bounded: the label is
# one of these or "other", never the message itself.
REJECTION_REASONS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("deadline-passed", lambda m: "deadline passed" in m),
    ("no-size-fits", lambda m: "no GPU count fits" in m),
    ("breaks-guarantee", lambda m: "would break the guarantee" in m or "would put the guarantee" in m),
    ("headroom", lambda m: "it could finish only within" in m),
    ("capacity", lambda m: m.removeprefix("rejected: ").startswith("needs ")),
)


def rejection_reason(message: str) -> str:
    """The bounded `reason` label of a rejection whose status message is `message`."""
    for label, matches in REJECTION_REASONS:
        if matches(message):
            return label
    return "other"


class StateCollector(Collector):
    """What the operator keeps anyway, read when Prometheus scrapes (none of it costs the hot path)."""

    def __init__(self, source: Callable[[], Operator | None]) -> None:
        self.source = source

    def collect(self) -> Iterable[Metric]:
        op = self.source()
        if op is None:
            return
        kube, informers, relister = op.kube, op.informers, op.relister
        # Acting: its reconcile loop runs (with --leader-elect, only once it holds the Lease) and, when fenced,
        # the Lease is still certainly its own.
        fence = op.settings.fence
        acting = kube is not None and (fence is None or getattr(fence, "lapse", lambda: None)() is None)
        yield GaugeMetricFamily("flotilla_operator_leader",
                                "1 while this replica acts (holds the Lease, or runs without election)",
                                value=1 if acting else 0)
        yield CounterMetricFamily("flotilla_operator_api_requests", "API writes sent",
                                  value=kube.requests if kube else 0)
        yield CounterMetricFamily("flotilla_operator_throttled_seconds",
                                  "Seconds writes waited for the client rate limit (--qps, --burst)",
                                  value=kube.throttled_seconds if kube else 0.0)
        errors = CounterMetricFamily("flotilla_operator_api_errors", "API writes that failed, by why",
                                     labels=["reason"])
        for reason, n in sorted((kube.errors if kube else {}).items()):
            errors.add_metric([reason], n)
        yield errors
        yield GaugeMetricFamily("flotilla_operator_writes_in_flight",
                                "API writes sent and not answered (at most --concurrency)",
                                value=kube.in_flight if kube else 0)
        yield GaugeMetricFamily("flotilla_operator_objects_in_flight", "Objects whose write chain is on its way",
                                value=len(op.in_flight))
        view = GaugeMetricFamily("flotilla_operator_view_objects", "Objects in the operator's view", labels=["kind"])
        for kind in VIEW_KINDS:
            view.add_metric([kind], len(getattr(op.view, kind)))
        yield view
        events = CounterMetricFamily("flotilla_operator_watch_events", "Watch events received", labels=["kind"])
        lists = CounterMetricFamily("flotilla_operator_watch_lists",
                                    "Lists by the watches: the first, and one each time a watch could not resume",
                                    labels=["kind"])
        by_kind: dict[str, list[int]] = {}
        for w in informers:
            got = by_kind.setdefault(w.kind, [0, 0])
            got[0] += w.events
            got[1] += w.lists
        for kind, (n_events, n_lists) in sorted(by_kind.items()):
            events.add_metric([kind], n_events)
            lists.add_metric([kind], n_lists)
        yield events
        yield lists
        relists = CounterMetricFamily("flotilla_operator_relists", "Periodic full re-lists, by kind and result",
                                      labels=["kind", "result"])
        ghosts = CounterMetricFamily("flotilla_operator_relist_ghosts",
                                     "Objects a list lacked (deleted while no watch looked), dropped from the view",
                                     labels=["kind"])
        if relister is not None:
            for (kind, result), n in sorted(relister.counts.items()):
                relists.add_metric([kind, result], n)
            for kind, n in sorted(relister.ghosts.items()):
                ghosts.add_metric([kind], n)
        yield relists
        yield ghosts


class OperatorMetrics:
    def __init__(self, source: Callable[[], Operator | None] = lambda: None) -> None:
        self.registry = r = CollectorRegistry()
        r.register(StateCollector(source))
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes (read at scrape)
        self.pass_duration = Histogram("flotilla_operator_pass_duration_seconds",
                                       "A reconcile pass: the view's copy and the plan, not its writes",
                                       buckets=PASS_BUCKETS, registry=r)
        self.planned = Histogram("flotilla_operator_pass_planned_objects",
                                 "Objects (jobs, ServingDeployments, Queues) a reconcile pass planned",
                                 buckets=PLANNED_BUCKETS, registry=r)
        self.passes = Counter("flotilla_operator_passes", "Reconcile passes by kind: incremental, or full and why",
                              ["kind"], registry=r)
        self.plan_cpu = Counter("flotilla_operator_plan_cpu_seconds", "CPU seconds of the planning thread",
                                registry=r)
        self.actions = Counter("flotilla_operator_actions", "Writes planned", registry=r)
        self.deferred = Counter("flotilla_operator_deferred",
                                "Objects planned while their earlier writes were still on their way", registry=r)
        self.admissions = Counter("flotilla_operator_admissions", "TrainingJobs admitted (Pending to Admitted)",
                                  ["guarantee"], registry=r)
        self.rejections = Counter("flotilla_operator_rejections", "TrainingJobs rejected at admission, by why",
                                  ["reason"], registry=r)
        self.reshards = Counter("flotilla_operator_reshards", "TrainingJob reshards written (status.reshards + 1)",
                                registry=r)
        self.reclaims = Counter("flotilla_operator_reclaims",
                                "Reclaims announced: a borrower gives GPUs back to the queue that lent them",
                                ["queue", "from_queue"], registry=r)
        self.reclaimed_gpus = Counter("flotilla_operator_reclaimed_gpus", "GPUs given back by reclaims",
                                      ["queue", "from_queue"], registry=r)
        # Every labelled series exists from the start at 0: a rate() over a counter that appears late misses
        # its first increment.
        for kind in PASS_KINDS:
            self.passes.labels(kind)
        for g in GUARANTEES:
            self.admissions.labels(g)
        for label, _ in REJECTION_REASONS:
            self.rejections.labels(label)
        self.rejections.labels("other")

    def passed(self, seconds: float, planned: int, actions: int, deferred: int, plan_cpu_s: float,
               full_reason: str | None) -> None:
        self.pass_duration.observe(seconds)
        self.planned.observe(planned)
        self.passes.labels(full_reason or "incremental").inc()
        self.plan_cpu.inc(plan_cpu_s)
        if actions:
            self.actions.inc(actions)
        if deferred:
            self.deferred.inc(deferred)

    def job_status_written(self, before: str | None, patch: dict[str, Any]) -> None:
        """A TrainingJob status patch answered; `before`: the job's phase when it was planned."""
        phase = patch.get("phase")
        if phase == phases.ADMITTED and before in (None, "", phases.PENDING):
            best_effort = any(c.get("type") == "Admitted" and c.get("reason") == "BestEffort"
                              for c in patch.get("conditions") or ())
            self.admissions.labels("best-effort" if best_effort else "deadline").inc()
        elif phase == phases.REJECTED and before != phases.REJECTED:
            self.rejections.labels(rejection_reason(str(patch.get("message") or ""))).inc()
        if "reshards" in patch:
            self.reshards.inc()

    def reclaimed(self, queue: str, from_queue: str, gpus: int) -> None:
        self.reclaims.labels(queue, from_queue).inc()
        self.reclaimed_gpus.labels(queue, from_queue).inc(gpus)


def serve(metrics: OperatorMetrics, port: int, host: str = "0.0.0.0") -> Any:
    """Serve /metrics on host:port from a thread of its own (prometheus_client's server): it answers even
    while the event loop is busy, and standby replicas serve it too. Returns the server (shutdown() stops it)."""
    from prometheus_client import start_http_server

    try:
        server, _ = start_http_server(port, addr=host, registry=metrics.registry)
    except OSError as e:
        raise SystemExit(f"--metrics-port {port}: cannot serve metrics on {host}:{port}: {e.strerror or e}") from None
    log.info("serving Prometheus metrics on http://%s:%d/metrics", host, port)
    return server
