"""bench/scale.py's own measurements: the watch-based latency of a job and who wrote pods' status."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import scale  # noqa: E402


def _pod(job: str, generation: int, first: float, running: float | None) -> scale.Seen:
    return scale.Seen(first, job, generation, running)


def test_a_job_runs_when_the_last_pod_of_its_last_worker_set_is_seen_started():
    seen = {"a-w0": _pod("a", 0, 10.0, 10.4), "a-w1": _pod("a", 0, 10.1, 10.9),
            "b-g0": _pod("b", 0, 11.0, 11.5), "b-g1": _pod("b", 1, 20.0, 21.25),  # b was moved: its new set counts
            "c-w0": _pod("c", 0, 12.0, None)}  # not started: no latency for c
    assert sorted(scale.watch_latency(seen)) == [0.9000000000000004, 1.25]  # direct: from the job's first pod
    assert sorted(scale.watch_latency(seen, {"a": 9.5, "b": 10.0, "c": 12.0})) == [1.4000000000000004, 11.25]


def test_the_watch_records_first_seen_and_first_started_receive_times():
    log = scale.WatchLog(api=None, path="/api/v1/namespaces/x/pods")
    pod = {"kind": "Pod", "metadata": {"name": "a-w0", "labels": {"flotilla.dev/job": "a",
                                                                 "flotilla.dev/generation": "1"}},
           "status": {"phase": "Pending"}}
    log._record(pod, 5.0)
    log._record({**pod, "status": {"phase": "Running", "containerStatuses": [{"state": {"running": {}}}]}}, 6.5)
    log._record({**pod, "status": {"phase": "Succeeded", "containerStatuses": [{"state": {"terminated": {}}}]}}, 9.0)
    assert log.seen["a-w0"] == scale.Seen(5.0, "a", 1, 6.5, "Succeeded")


def test_pod_status_writes_are_counted_per_pod_by_writer(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()

    def event(verb, name, subresource=None, agent="kwok/v0.7.0 (linux/amd64)", ns="ns1"):
        ref = {"resource": "pods", "namespace": ns, "name": name, **({"subresource": subresource} if subresource else {})}
        return json.dumps({"verb": verb, "objectRef": ref, "userAgent": agent}, separators=(",", ":"))  # as the API server

    sched = "kube-scheduler/v0.0.0 (linux/amd64) kubernetes/$Format/scheduler"
    lines = [event("create", "p0"), event("create", "p1"), event("patch", "p0", "status"),
             event("patch", "p0", "status"), event("patch", "p1", "status"), event("patch", "p1", "status"),
             event("patch", "p1", "status", sched), event("patch", "p9", "status", ns="other")]
    (logs / "audit.log").write_text("\n".join(lines) + "\n")
    assert scale.pod_status_writers(tmp_path, "ns1") == {"kube-scheduler/scheduler": 0.5, "kwok": 2.0}


def test_pods_created_with_generate_name_count_one_each(tmp_path):
    (tmp_path / "logs").mkdir()
    # A Job's pods: the create's audit event names no pod (generateName), the status writes do.
    lines = [json.dumps({"verb": "create", "auditID": f"a{i}", "userAgent": "kube-controller-manager/v1.35.4",
                         "objectRef": {"resource": "pods", "namespace": "ns1"}}, separators=(",", ":"))
             for i in range(2)]
    lines += [json.dumps({"verb": "patch", "userAgent": "kwok/v0.7.0 (linux/amd64)",
                          "objectRef": {"resource": "pods", "namespace": "ns1", "name": f"j-{i}",
                                        "subresource": "status"}}, separators=(",", ":")) for i in range(4)]
    (tmp_path / "logs" / "audit.log").write_text("\n".join(lines) + "\n")
    assert scale.pod_status_writers(tmp_path, "ns1") == {"kwok": 2.0}


def test_a_ramp_trial_lasts_until_its_jobs_would_fill_the_cluster():
    # 8,000 GPUs, 2.5 GPUs a job: 40 jobs/s ask for 100 GPUs a second, 80 s to ask for all of them.
    assert scale.trial_seconds(40.0, 2.5, 8000, 12.0) == 80.0
    assert scale.trial_seconds(160.0, 2.5, 800, 12.0) == 12.0  # never shorter than the floor


def test_jobs_past_the_target_count_those_still_waiting():
    seen = {"a-w0": _pod("a", 0, 10.0, 10.5),  # 0.5 s
            "b-w0": _pod("b", 0, 10.0, 14.0),  # 4 s: past a 3 s target
            "c-w0": _pod("c", 0, 11.0, None),  # waiting for 9 s at t=20
            "d-w0": _pod("d", 0, 19.0, None)}  # waiting for 1 s
    assert scale.beyond_target(seen, 20.0, 3.0) == 2


def test_kwok_lag_is_binding_to_its_first_status_patch_from_the_audit_log(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()

    def event(verb, name, subresource, received, done, agent="kwok/v0.7.0 (linux/amd64)", code=200, ns="ns1"):
        ref = {"resource": "pods", "namespace": ns, "name": name, "subresource": subresource}
        return json.dumps({"verb": verb, "objectRef": ref, "userAgent": agent, "responseStatus": {"code": code},
                           "requestReceivedTimestamp": f"2026-11-23T10:00:{received}Z",
                           "stageTimestamp": f"2026-11-23T10:00:{done}Z"}, separators=(",", ":"))

    sched = "kube-scheduler/v1.31.0 (linux/amd64) kubernetes/abc/scheduler"
    lines = [event("create", "p0", "binding", "00.000000", "00.100000", sched),
             event("create", "p1", "binding", "00.100000", "00.200000", sched),
             event("patch", "p0", "status", "00.600000", "00.650000"),   # Running: 0.5 s after p0's binding
             event("patch", "p1", "status", "01.200000", "01.300000"),   # Running: 1.0 s after p1's binding
             event("patch", "p0", "status", "05.000000", "05.050000"),   # the exit: a patch, not a wait
             event("patch", "p1", "status", "00.300000", "00.400000", code=409),  # refused: not a write
             event("patch", "p2", "status", "00.300000", "00.400000", ns="other")]
    (logs / "audit.log").write_text("\n".join(lines) + "\n")
    lag = scale.kwok_lag(tmp_path, "ns1")
    assert lag["pods"] == 2 and lag["backlog_max"] == 2  # both bound before either was patched
    assert lag["running_patch_wait_s"] == scale.percentiles([0.5, 1.0], 3)
    assert lag["patch_s"] == scale.percentiles([0.05, 0.1, 0.05], 3)


def test_the_kwok_pod_workers_a_cluster_was_started_with_are_read_from_its_state(tmp_path):
    cluster = scale.Cluster(tmp_path, 19440, 2, 40, 32)
    assert cluster.env["FLOTILLA_KWOK_POD_WORKERS"] == "32"
    assert cluster.kwok_pod_workers() is None  # no cluster there
    (tmp_path / "kwok-config.yaml").write_text("kind: KwokConfiguration\noptions:\n  podPlayStageParallelism: 8\n")
    assert cluster.kwok_pod_workers() == 8


def test_a_direct_job_of_two_workers_gets_the_headless_service_its_pods_resolve_under():
    two = scale.Job("job-00001", 16, 8, 5.0)
    service = scale.direct_service(two)
    assert service is not None and service["spec"]["clusterIP"] == "None"
    pods = scale.direct_pods(two)
    assert [p["spec"]["subdomain"] for p in pods] == [service["metadata"]["name"]] * 2
    assert [p["spec"]["hostname"] for p in pods] == [p["metadata"]["name"] for p in pods]
    selector = service["spec"]["selector"].items()
    assert all(selector <= p["metadata"]["labels"].items() for p in pods)


def test_a_direct_job_of_one_worker_gets_no_service():
    one = scale.Job("job-00002", 8, 8, 5.0)
    assert scale.direct_service(one) is None
    assert "subdomain" not in scale.direct_pods(one)[0]["spec"]


class _DroppingCore:
    """A CoreV1Api whose first deletion of a namespace's pods loses its connection, as the API server did with
    15,500 pods at 1,000 nodes; the pods are gone by the next list."""

    def __init__(self) -> None:
        self.deletions = 0

    def delete_collection_namespaced_pod(self, namespace: str, grace_period_seconds: int) -> None:
        from urllib3.exceptions import ProtocolError

        self.deletions += 1
        if self.deletions == 1:
            raise ProtocolError("Connection aborted.")

    def list_namespaced_pod(self, namespace: str, limit: int):
        return type("PodList", (), {"items": [] if self.deletions >= 2 else [object()]})()


def test_a_deletion_of_a_phases_pods_that_loses_its_connection_is_sent_again():
    core = _DroppingCore()
    scale.clear_pods(core, "scale-direct-1", timeout=10)
    assert core.deletions == 2


def test_a_deletion_of_a_phases_jobs_that_loses_its_connection_is_sent_again_and_a_refusal_is_raised():
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import ProtocolError

    sent = []

    def send() -> None:  # the first is dropped (15,000 Jobs at 1,000 nodes, 2026-11-28), the second answered
        sent.append(1)
        if len(sent) == 1:
            raise ProtocolError("Connection aborted.")

    scale.delete_all("the Jobs in scale-kueue-1", send, lambda: len(sent) < 2, timeout=10)
    assert len(sent) == 2

    def refuse() -> None:
        raise ApiException(status=403, reason="Forbidden")

    with pytest.raises(ApiException):
        scale.delete_all("the Jobs in scale-kueue-1", refuse, lambda: True, timeout=10)


def test_each_finished_phase_is_kept_before_the_next_starts(tmp_path):
    scale.keep_partial({"nodes": 3, "direct": {"wall_s": 1.5}}, tmp_path)
    assert json.loads((tmp_path / "scale-partial.json").read_text())["direct"]["wall_s"] == 1.5


def test_the_operators_figures_come_from_two_scrapes_of_its_metrics_endpoint():
    import socket

    from flotilla.operator.metrics import OperatorMetrics, serve

    metrics = OperatorMetrics()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = serve(metrics, port, "127.0.0.1")
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        metrics.passed(3.0, 1, 0, 0, 0.5, "first")  # before the jobs: left out
        before = scale.scrape(url)
        for seconds in (0.004, 0.004, 0.015, 0.015, 0.3):
            metrics.passed(seconds, 10, 4, 1, 0.01, None)
        metrics.job_status_written(None, {"phase": "Rejected", "message": "rejected: deadline passed 3 s ago"})
        figures = scale.operator_figures(before, scale.scrape(url))
    finally:
        server.shutdown()
        server.server_close()
    assert figures["passes"] == 5 and figures["passes_by_kind"]["incremental"] == 5
    assert figures["passes_by_kind"]["first"] == 0
    assert figures["replan_ms"]["p50"] == 12.5  # in the 10-20 ms bucket, half-way through its passes
    assert figures["replan_ms_max_bucket"] == 500.0
    assert figures["replan_ms_mean"] == round(0.338 / 5 * 1e3, 1)
    assert figures["planned_objects_per_pass"] == 10 and figures["deferred"] == 5
    assert figures["planning_cpu_s"] == 0.05
    assert figures["rejections"] == {"deadline-passed": 1}


def test_histogram_quantile_interpolates_within_the_bucket_as_promql_does():
    assert scale.histogram_quantile(0.5, {0.01: 2, 0.02: 6, 0.05: 10, float("inf"): 10}) == 0.0175
    assert scale.histogram_quantile(0.99, {0.01: 0, 0.02: 0, float("inf"): 3}) == 0.02  # beyond the last bound
    assert scale.histogram_quantile(0.5, {0.01: 0, float("inf"): 0}) is None


def test_phases_are_a_subset_of_what_against_runs_in_running_order():
    def error(message: str) -> None:
        raise ValueError(message)

    assert scale.chosen_phases("kueue", None, error) == ("direct", "kueue", "flotilla")
    assert scale.chosen_phases("kueue", "flotilla, kueue", error) == ("kueue", "flotilla")
    assert scale.chosen_phases("direct", "flotilla", error) == ("flotilla",)
    with pytest.raises(ValueError, match="--phases: kueue not among direct, flotilla"):
        scale.chosen_phases("direct", "kueue", error)
    with pytest.raises(ValueError, match="none given"):
        scale.chosen_phases("kueue", " , ", error)
