"""Prometheus metrics of the controller, in one dedicated registry.

State that lives in the database (jobs, GPUs, outlook, serving plans, nodes) is
read at scrape time by `StateCollector`, so it is right after a restart; events
(reshards, detections, ingest, API requests) are counted as they happen.

| metric | type | labels |
|---|---|---|
| flotilla_training_jobs | gauge | phase |
| flotilla_training_jobs_deadline_outlook | gauge | outlook: on-track, at-risk, missed, rejected, done, no-deadline |
| flotilla_gpus_capacity, flotilla_gpus_schedulable, flotilla_gpus_free | gauge | (GPUs on all nodes; on healthy uncordoned ones; not held) |
| flotilla_gpus_allocated | gauge | workload: training, serving |
| flotilla_nodes_unhealthy, flotilla_nodes_cordoned | gauge | |
| flotilla_serving_replicas | gauge | deployment, role: prefill, decode |
| flotilla_serving_pd_ratio | gauge | deployment (prefill / decode replicas) |
| flotilla_serving_goodput_requests_per_second | gauge | deployment, source: predicted, observed |
| flotilla_serving_slo_attainment_ratio | gauge | deployment |
| flotilla_queue_nominal_gpus, flotilla_queue_used_gpus, flotilla_queue_borrowed_gpus, flotilla_queue_lent_gpus, flotilla_queue_guaranteed_gpus | gauge | queue (from each Queue's status) |
| flotilla_queue_jobs | gauge | queue, state: admitted, pending |
| flotilla_queue_reclaims_total | counter | queue (that got the GPUs back; unknown when the operator did not say), from_queue (the borrower) |
| flotilla_queue_reclaimed_gpus_total | counter | queue, from_queue |
| flotilla_queue_reclaim_duration_seconds | histogram | queue (from the operator's reclaim condition to the smaller allocation seen) |
| flotilla_reshards_total | counter | |
| flotilla_reshard_duration_seconds | histogram | |
| flotilla_decisions_total | counter | kind |
| flotilla_detection_events_total | counter | type |
| flotilla_detection_latency_seconds | histogram | |
| flotilla_ingest_samples_total, flotilla_ingest_batches_total | counter | transport: http, redis (batches also result) |
| flotilla_ingest_rejected_total | counter | transport: http, redis, stats; reason: malformed, unauthenticated, forbidden, node-mismatch, no-node-claim |
| flotilla_ingest_dead_letters_total | counter | transport: http, redis; reason: invalid, refused, sink-failed (kept in the `dead_letters` table) |
| flotilla_api_database_unavailable_total | counter | (API requests answered 503 while the database was unreachable) |
| flotilla_ingest_lag_seconds | gauge | transport (now minus the newest sample's time, at ingest) |
| flotilla_ingest_pending_entries | gauge | (Redis entries delivered to the group, not yet acked) |
| flotilla_ingest_pipeline_healthy | gauge | (1 while samples arrive; 0 while a pipeline fault is open) |
| flotilla_ingest_pipeline_stalls_total | counter | reason: no-delivery, shared-silence, controller-stalled |
| flotilla_health_actions_suppressed_total | counter | reason: taint-budget, pipeline-fault |
| flotilla_api_request_duration_seconds | histogram | method, route, status |
| flotilla_serving_scrapes_total | counter | result: ok, failed (one per engine endpoint scraped) |
| flotilla_serving_scrape_failures_total | counter | reason: endpoints, connect, http, parse |
"""

from __future__ import annotations

from typing import Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from flotilla.controller.mirror import DecisionRecord
from flotilla.controller.store import Store
from flotilla.health.samples import Sample

DURATION_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class StateCollector(Collector):
    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterable[Metric]:
        jobs = GaugeMetricFamily("flotilla_training_jobs", "TrainingJobs by phase", labels=["phase"])
        for phase, n in sorted(self.store.jobs_by_phase().items()):
            jobs.add_metric([phase], n)
        yield jobs
        outlook = GaugeMetricFamily("flotilla_training_jobs_deadline_outlook",
                                    "TrainingJobs by deadline outlook", labels=["outlook"])
        for name, n in self.store.outlook_counts().items():
            outlook.add_metric([name], n)
        yield outlook

        cap = self.store.capacity()
        yield GaugeMetricFamily("flotilla_gpus_capacity", "GPUs on all nodes", value=cap["gpus"])
        yield GaugeMetricFamily("flotilla_gpus_schedulable", "GPUs on healthy uncordoned nodes",
                                value=cap["schedulableGpus"])
        yield GaugeMetricFamily("flotilla_gpus_free", "Schedulable GPUs held by no workload", value=cap["freeGpus"])
        allocated = GaugeMetricFamily("flotilla_gpus_allocated", "GPUs held by workloads", labels=["workload"])
        allocated.add_metric(["training"], cap["trainingGpus"])
        allocated.add_metric(["serving"], cap["servingGpus"])
        yield allocated

        health = self.store.node_health_counts()
        yield GaugeMetricFamily("flotilla_nodes_unhealthy", "Nodes with FlotillaGPUHealthy=False",
                                value=health["unhealthy"])
        yield GaugeMetricFamily("flotilla_nodes_cordoned", "Cordoned nodes", value=health["cordoned"])

        replicas = GaugeMetricFamily("flotilla_serving_replicas", "Serving instances by role",
                                     labels=["deployment", "role"])
        ratio = GaugeMetricFamily("flotilla_serving_pd_ratio", "Prefill instances per decode instance",
                                  labels=["deployment"])
        goodput = GaugeMetricFamily("flotilla_serving_goodput_requests_per_second",
                                    "Requests per second within SLO", labels=["deployment", "source"])
        attainment = GaugeMetricFamily("flotilla_serving_slo_attainment_ratio",
                                       "Observed fraction of requests within SLO", labels=["deployment"])
        for sd in self.store.all_servings():
            replicas.add_metric([sd.key, "prefill"], sd.prefill_replicas)
            replicas.add_metric([sd.key, "decode"], sd.decode_replicas)
            if sd.decode_replicas:
                ratio.add_metric([sd.key], sd.prefill_replicas / sd.decode_replicas)
            if sd.predicted_goodput is not None:
                goodput.add_metric([sd.key, "predicted"], sd.predicted_goodput)
            if "requestsPerSecond" in sd.observed and "attainment" in sd.observed:
                goodput.add_metric([sd.key, "observed"], sd.observed["requestsPerSecond"] * sd.observed["attainment"])
            if "attainment" in sd.observed:
                attainment.add_metric([sd.key], sd.observed["attainment"])
        yield from (replicas, ratio, goodput, attainment)
        yield from queue_gauges(self.store)


QUEUE_GPU_GAUGES = (("nominal", "GPUs the queue is guaranteed"), ("used", "GPUs its jobs and deployments hold"),
                    ("borrowed", "GPUs it uses beyond its nominal share, lent by other queues"),
                    ("lent", "Its nominal GPUs other queues use"),
                    ("guaranteed", "GPUs promised to its jobs' deadlines now"))


def queue_gauges(store: Store) -> Iterable[Metric]:
    """Each Queue's status as the operator last wrote it (0 before it did)."""
    rows = store.all_queues()
    for what, doc in QUEUE_GPU_GAUGES:
        g = GaugeMetricFamily(f"flotilla_queue_{what}_gpus", doc, labels=["queue"])
        for q in rows:
            g.add_metric([q.name], q.usage.get(what, 0))
        yield g
    jobs = GaugeMetricFamily("flotilla_queue_jobs", "Jobs and deployments of the queue by admission state",
                             labels=["queue", "state"])
    for q in rows:
        for state in ("admitted", "pending"):
            jobs.add_metric([q.name, state], q.usage.get(state, 0))
    yield jobs


class ControllerMetrics:
    def __init__(self, store: Store) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(StateCollector(store))
        r = self.registry
        self.reshards = Counter("flotilla_reshards", "Reshards observed (TrainingJob status.reshards increments)",
                                registry=r)
        self.reshard_duration = Histogram("flotilla_reshard_duration_seconds", "Time TrainingJobs spent Resharding",
                                          buckets=DURATION_BUCKETS, registry=r)
        self.decisions = Counter("flotilla_decisions", "Decisions recorded in the audit trail", ["kind"], registry=r)
        self.detection_events = Counter("flotilla_detection_events", "Faults and stragglers detected", ["type"],
                                        registry=r)
        self.detection_latency = Histogram("flotilla_detection_latency_seconds",
                                           "From the first anomalous sample to the detection",
                                           buckets=DURATION_BUCKETS, registry=r)
        self.ingest_samples = Counter("flotilla_ingest_samples", "Samples ingested", ["transport"], registry=r)
        self.ingest_batches = Counter("flotilla_ingest_batches", "Sample batches received", ["transport", "result"],
                                      registry=r)
        self.ingest_rejected = Counter("flotilla_ingest_rejected", "Sample batches and statistics refused, by why",
                                       ["transport", "reason"], registry=r)
        self.ingest_dead_letters = Counter("flotilla_ingest_dead_letters",
                                           "Samples (or stream entries) never to be stored, kept as dead letters",
                                           ["transport", "reason"], registry=r)
        self.database_unavailable = Counter("flotilla_api_database_unavailable",
                                            "API requests answered 503 because the database was unreachable",
                                            registry=r)
        self.ingest_lag = Gauge("flotilla_ingest_lag_seconds", "Now minus the newest sample's time, at ingest",
                                ["transport"], registry=r)
        self.ingest_pending = Gauge("flotilla_ingest_pending_entries",
                                    "Redis stream entries delivered to the consumer group and not yet acked",
                                    registry=r)
        self.ingest_pipeline_healthy = Gauge("flotilla_ingest_pipeline_healthy",
                                             "1 while metric samples arrive; 0 while a pipeline fault is open",
                                             registry=r)
        self.ingest_pipeline_healthy.set(1)
        self.ingest_pipeline_stalls = Counter("flotilla_ingest_pipeline_stalls",
                                              "Silences of the metric pipeline (not of nodes)", ["reason"], registry=r)
        self.health_actions_suppressed = Counter("flotilla_health_actions_suppressed",
                                                 "Health verdicts or actions held back (node silences inside a "
                                                 "pipeline fault; taints beyond the taint budget)", ["reason"],
                                                 registry=r)
        self.serving_scrapes = Counter("flotilla_serving_scrapes", "Scrapes of serving engines' /metrics",
                                       ["result"], registry=r)
        self.serving_scrape_failures = Counter("flotilla_serving_scrape_failures",
                                               "Failed scrapes of serving engines, by why", ["reason"], registry=r)
        self.reclaims = Counter("flotilla_queue_reclaims", "Reclaims seen: a borrower gave GPUs back to their owner",
                                ["queue", "from_queue"], registry=r)
        self.reclaimed_gpus = Counter("flotilla_queue_reclaimed_gpus", "GPUs given back by reclaims",
                                      ["queue", "from_queue"], registry=r)
        self.reclaim_duration = Histogram("flotilla_queue_reclaim_duration_seconds",
                                          "From the operator's reclaim to the borrower's smaller allocation",
                                          ["queue"], buckets=DURATION_BUCKETS, registry=r)
        self.api_latency = Histogram("flotilla_api_request_duration_seconds", "REST API request latency",
                                     ["method", "route", "status"], buckets=LATENCY_BUCKETS, registry=r)

    def decided(self, decisions: Sequence[DecisionRecord], reshard_seconds: float | None = None) -> None:
        for d in decisions:
            self.decisions.labels(d.kind).inc()
            if d.kind == "reshard":
                self.reshards.inc()
            elif d.kind == "reclaim":
                owner, borrower = d.inputs.get("toQueue") or "unknown", d.inputs.get("fromQueue") or "unknown"
                self.reclaims.labels(owner, borrower).inc()
                self.reclaimed_gpus.labels(owner, borrower).inc(d.inputs.get("gpus") or 0)
                if d.inputs.get("seconds") is not None:
                    self.reclaim_duration.labels(owner).observe(d.inputs["seconds"])
        if reshard_seconds is not None:
            self.reshard_duration.observe(reshard_seconds)

    def detected(self, event_type: str, latency_seconds: float) -> None:
        """For the detectors: one fault or straggler found `latency_seconds` after its first sign."""
        self.detection_events.labels(event_type).inc()
        self.detection_latency.observe(latency_seconds)

    def ingested(self, transport: str, samples: Sequence[Sample], now: float) -> None:
        self.ingest_batches.labels(transport, "ok").inc()
        self.ingest_samples.labels(transport).inc(len(samples))
        if samples:
            self.ingest_lag.labels(transport).set(max(0.0, now - max(s.ts for s in samples)))

    def rejected(self, transport: str, reason: str) -> None:
        self.ingest_batches.labels(transport, "rejected").inc()
        self.ingest_rejected.labels(transport, reason).inc()
