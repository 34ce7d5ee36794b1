"""The operator's Prometheus metrics (flotilla.operator.metrics): what a pass, a status write and the
operator's own counters show on /metrics, and that the labels stay bounded."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from flotilla.allocation import policies
from flotilla.operator.actions import PatchStatus
from flotilla.operator.handlers import Operator, Settings
from flotilla.operator.kube import Kube
from flotilla.operator.metrics import REJECTION_REASONS, rejection_reason, serve
from flotilla.operator.reconcile import plan
from tests.operator_plan.builders import T0, node, trainingjob


def samples(op: Operator) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client import generate_latest

    out = {}
    for family in text_string_to_metric_families(generate_latest(op.metrics.registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def operator() -> Operator:
    return Operator(Settings(allocator=policies.get(policies.DEFAULT)))


def planned_statuses() -> dict[str, dict]:
    """The first status patch of four jobs, as the real planner writes them: one admitted, three rejected
    for different reasons."""
    big = trainingjob("big", min_gpus=1, max_gpus=4, deadline_seconds=100)
    big["spec"]["totalSteps"] = 100_000  # 3 steps/s at most: far past its deadline
    jobs = {f"ns/{b['metadata']['name']}": b for b in (
        big, trainingjob("late", deadline_seconds=10), trainingjob("odd", min_gpus=3, max_gpus=3, per_worker=2),
        trainingjob("ok"))}
    out = {}
    for _, key, actions in plan(T0 + 30, policies.get(policies.DEFAULT), jobs, {"n0": node("n0")}, {}, {}, {}):
        for a in actions:
            if isinstance(a, PatchStatus):
                out[key] = a.status
    return out


def test_admissions_and_rejections_by_bounded_reason_from_the_planners_own_writes():
    op, statuses = operator(), planned_statuses()
    for status in statuses.values():
        op.metrics.job_status_written(None, status)
    got = samples(op)
    assert got[("flotilla_operator_admissions_total", (("guarantee", "deadline"),))] == 1
    assert got[("flotilla_operator_admissions_total", (("guarantee", "best-effort"),))] == 0
    for reason, n in (("capacity", 1), ("deadline-passed", 1), ("no-size-fits", 1), ("other", 0)):
        assert got[("flotilla_operator_rejections_total", (("reason", reason),))] == n, reason
    # Written again (a retried patch, or a job already in that phase): not counted twice.
    op.metrics.job_status_written("Rejected", statuses["ns/late"])
    op.metrics.job_status_written("Running", statuses["ns/ok"])
    again = samples(op)
    assert again[("flotilla_operator_rejections_total", (("reason", "deadline-passed"),))] == 1
    assert again[("flotilla_operator_admissions_total", (("guarantee", "deadline"),))] == 1


def test_rejection_reason_is_one_of_a_fixed_set_never_the_message():
    labels = {label for label, _ in REJECTION_REASONS} | {"other"}
    for message in ("rejected: admitting it would break the guarantee of ns/a, ns/b",
                    "rejected: it could finish only within 12 s of its deadline (...)",
                    "rejected: something new 1234", ""):
        assert rejection_reason(message) in labels
    assert rejection_reason("rejected: admitting it would break the guarantee of ns/a") == "breaks-guarantee"
    assert rejection_reason("rejected: something new 1234") == "other"


def test_a_pass_a_reshard_and_a_reclaim():
    op = operator()
    op.metrics.passed(0.03, 12, 7, 2, 0.025, "nodes")
    op.metrics.passed(0.004, 1, 0, 0, 0.003, None)
    op.metrics.job_status_written("Running", {"phase": "Resharding", "reshards": 3})
    op.metrics.reclaimed("team-a", "team-b", 8)
    got = samples(op)
    assert got[("flotilla_operator_pass_duration_seconds_count", ())] == 2
    assert got[("flotilla_operator_pass_duration_seconds_bucket", (("le", "0.005"),))] == 1
    assert got[("flotilla_operator_pass_duration_seconds_sum", ())] == pytest.approx(0.034)
    assert got[("flotilla_operator_pass_planned_objects_sum", ())] == 13
    assert got[("flotilla_operator_passes_total", (("kind", "nodes"),))] == 1
    assert got[("flotilla_operator_passes_total", (("kind", "incremental"),))] == 1
    assert got[("flotilla_operator_passes_total", (("kind", "time"),))] == 0
    assert got[("flotilla_operator_actions_total", ())] == 7
    assert got[("flotilla_operator_deferred_total", ())] == 2
    assert got[("flotilla_operator_plan_cpu_seconds_total", ())] == pytest.approx(0.028)
    assert got[("flotilla_operator_reshards_total", ())] == 1
    assert got[("flotilla_operator_reclaims_total", (("from_queue", "team-b"), ("queue", "team-a")))] == 1
    assert got[("flotilla_operator_reclaimed_gpus_total", (("from_queue", "team-b"), ("queue", "team-a")))] == 8


def test_what_the_operator_counts_anyway_is_read_at_scrape_time():
    op = operator()
    assert samples(op)[("flotilla_operator_leader", ())] == 0  # its loop has not started: a standby
    kube = Kube(client.ApiClient(), concurrency=4)
    op.kube = kube
    kube.requests, kube.throttled_seconds, kube.in_flight = 41, 2.5, 3
    kube.errors.update({"timeout": 2, "http-409": 1})
    op.view.jobs.update({"ns/a": {}, "ns/b": {}})
    op.view.nodes["n0"] = {}
    got = samples(op)
    assert got[("flotilla_operator_api_requests_total", ())] == 41
    assert got[("flotilla_operator_throttled_seconds_total", ())] == 2.5
    assert got[("flotilla_operator_writes_in_flight", ())] == 3
    assert got[("flotilla_operator_api_errors_total", (("reason", "timeout"),))] == 2
    assert got[("flotilla_operator_api_errors_total", (("reason", "http-409"),))] == 1
    assert got[("flotilla_operator_view_objects", (("kind", "jobs"),))] == 2
    assert got[("flotilla_operator_view_objects", (("kind", "nodes"),))] == 1
    assert got[("flotilla_operator_objects_in_flight", ())] == 0
    assert got[("flotilla_operator_leader", ())] == 1


def test_a_replica_whose_lease_lapsed_is_no_longer_the_leader():
    from flotilla.operator.leader import LeaseFence

    now = [100.0]
    fence = LeaseFence(15, 10, clock=lambda: now[0])
    op = Operator(Settings(allocator=policies.get(policies.DEFAULT), fence=fence))
    op.kube = Kube(client.ApiClient(), concurrency=1)
    fence.renewed(95.0)
    assert samples(op)[("flotilla_operator_leader", ())] == 1
    now[0] = 106.0  # 11 s since the last renewal: past the 10 s renew deadline
    assert samples(op)[("flotilla_operator_leader", ())] == 0


def test_served_over_http_and_a_taken_port_is_refused_by_name():
    op = operator()
    op.metrics.passed(0.01, 1, 1, 0, 0.01, "first")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = serve(op.metrics, port, "127.0.0.1")
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'flotilla_operator_passes_total{kind="first"} 1.0' in body
        with pytest.raises(SystemExit, match=f"--metrics-port {port}"):
            serve(op.metrics, port, "127.0.0.1")
    finally:
        server.shutdown()
        server.server_close()
