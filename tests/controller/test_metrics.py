"""/metrics: state gauges read from the database, event counters and histograms."""

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from controller_fixtures import ADMIN, READER, auth, node, serving, training_job
from flotilla.controller.mirror import parse_node, parse_serving_deployment, parse_training_job


def scrape(client):
    r = client.get("/metrics", headers=auth(READER))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(r.text) for s in f.samples}


def test_metrics(client, controller, store, clock):
    store.upsert_node(parse_node(node("a", 8)))
    store.upsert_node(parse_node(node("b", 8, healthy=False)))
    store.upsert_serving(parse_serving_deployment(serving("s", prefill=1, decode=2)))
    store.upsert_job(parse_training_job(training_job("j", placement={"a": 2})))
    clock.now += 1
    result = store.upsert_job(parse_training_job(training_job("j", placement={"a": 2}, phase="Resharding")))
    controller.metrics.decided(result.decisions, result.reshard_seconds)
    clock.now += 7
    result = store.upsert_job(parse_training_job(training_job("j", placement={"a": 4}, reshards=1)))
    controller.metrics.decided(result.decisions, result.reshard_seconds)
    controller.metrics.detected("xid", 2.5)
    client.post("/v1/nodes/a/drain", headers=auth(ADMIN))
    m = scrape(client)
    assert m[("flotilla_training_jobs", (("phase", "Running"),))] == 1
    assert m[("flotilla_training_jobs_deadline_outlook", (("outlook", "on-track"),))] == 1
    assert m[("flotilla_gpus_capacity", ())] == 16
    assert m[("flotilla_gpus_schedulable", ())] == 0  # a drained, b unhealthy
    assert m[("flotilla_gpus_allocated", (("workload", "training"),))] == 4
    assert m[("flotilla_gpus_allocated", (("workload", "serving"),))] == 5
    assert m[("flotilla_nodes_unhealthy", ())] == 1 and m[("flotilla_nodes_cordoned", ())] == 1
    assert m[("flotilla_serving_pd_ratio", (("deployment", "default/s"),))] == 0.5
    assert m[("flotilla_serving_goodput_requests_per_second", (("deployment", "default/s"), ("source", "predicted")))] \
        == 9.5
    assert abs(m[("flotilla_serving_goodput_requests_per_second",
                  (("deployment", "default/s"), ("source", "observed")))] - 9.3) < 1e-9
    assert m[("flotilla_reshards_total", ())] == 1
    assert m[("flotilla_reshard_duration_seconds_sum", ())] == 7
    assert m[("flotilla_decisions_total", (("kind", "drain"),))] == 1
    assert m[("flotilla_decisions_total", (("kind", "checkpoint-request"),))] == 1
    assert m[("flotilla_detection_events_total", (("type", "xid"),))] == 1
    assert m[("flotilla_detection_latency_seconds_sum", ())] == 2.5
    assert m[("flotilla_api_request_duration_seconds_count",
              (("method", "POST"), ("route", "/v1/nodes/{name}/drain"), ("status", "202")))] == 1


def test_grafana_dashboard_uses_only_exported_metrics(controller):
    dashboard = json.loads((Path(__file__).parents[2] / "controller" / "grafana-dashboard.json").read_text())
    used = {re.sub(r"_(total|bucket|count|sum)$", "", name) for p in dashboard["panels"] for t in p["targets"]
            for name in re.findall(r"flotilla_[a-z_]+", t["expr"])}
    exported = {family.name for family in controller.metrics.registry.collect()}
    assert used and used <= exported, used - exported
    assert len(used) >= 15
