"""bench/scale.py --against kueue: Kueue's objects and configuration, the Job path's bookkeeping, the summary.

None of these needs Kueue built; the one that overlays /etc in a mount namespace skips where `unshare` cannot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import scale  # noqa: E402
import scale_kueue  # noqa: E402


def test_kueue_runs_off_cluster_on_the_benchs_ports_without_webhooks_or_leader_election(tmp_path):
    config = scale_kueue.configuration(18600, tmp_path / "certs", 200.0, 400, workers=16)
    assert config["health"]["healthProbeBindAddress"] == "127.0.0.1:18620"
    assert config["metrics"]["bindAddress"] == "127.0.0.1:18621"
    assert config["webhook"] == {"port": 18622, "host": "127.0.0.1", "certDir": str(tmp_path / "certs")}
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["internalCertManagement"] == {"enable": False}
    assert config["integrations"] == {"frameworks": ["batch/job"]}
    assert config["clientConnection"] == {"qps": 200.0, "burst": 400}
    workers = config["controller"]["groupKindConcurrency"]
    assert workers["Workload.kueue.x-k8s.io"] == workers["Job.batch"] == 16 and workers["Pod"] == 5  # shipped: 5
    assert scale_kueue.configuration(18600, tmp_path, 50.0, 100)["controller"]["groupKindConcurrency"][
        "Job.batch"] == 5


def test_the_cluster_queue_covers_every_gpu_cpu_and_byte_of_the_nodes():
    flavor, cq, lq = scale_kueue.queue_objects("ns1", 100, 8, "nvidia.com/gpu")
    assert flavor["kind"] == "ResourceFlavor" and cq["kind"] == "ClusterQueue" and lq["kind"] == "LocalQueue"
    (group,) = cq["spec"]["resourceGroups"]
    quota = {r["name"]: r["nominalQuota"] for r in group["flavors"][0]["resources"]}
    assert quota == {"cpu": "9600", "memory": "100Ti", "nvidia.com/gpu": "800"}  # 100 nodes of 96 CPUs, 1Ti, 8 GPUs
    assert sorted(group["coveredResources"]) == sorted(quota)
    assert group["flavors"][0]["name"] == flavor["metadata"]["name"]
    assert lq["metadata"]["namespace"] == "ns1" and lq["spec"]["clusterQueue"] == cq["metadata"]["name"]


def test_a_kueue_job_is_suspended_in_the_queue_with_the_direct_paths_pods():
    one = scale.Job("job-00002", 4, 4, 5.0)
    job = scale.kueue_job(one)
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"][scale_kueue.QUEUE_LABEL] == scale_kueue.LOCAL_QUEUE
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == 1
    assert job["spec"]["completionMode"] == "NonIndexed"
    direct = scale.direct_pods(one)[0]
    template = job["spec"]["template"]
    assert template["metadata"]["labels"] == direct["metadata"]["labels"]
    assert template["metadata"]["annotations"] == direct["metadata"]["annotations"]  # KWOK ends it as a bare pod
    assert template["spec"]["containers"] == direct["spec"]["containers"]
    assert template["spec"]["tolerations"] == direct["spec"]["tolerations"]
    assert "subdomain" not in template["spec"]


def test_a_kueue_job_of_two_workers_is_indexed_under_the_rendezvous_service():
    two = scale.Job("job-00001", 16, 8, 5.0)
    job = scale.kueue_job(two)
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == 2
    assert job["spec"]["completionMode"] == "Indexed"
    service = scale.direct_service(two)
    assert service is not None
    assert job["spec"]["template"]["spec"]["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["selector"].items() <= job["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize(("suspend", "conditions", "phase"), [
    (True, [], "Pending"),
    (False, [], "Running"),
    (False, [{"type": "Complete", "status": "True"}], "Succeeded"),
    (False, [{"type": "Failed", "status": "True"}], "Failed"),
    (False, [{"type": "Complete", "status": "False"}], "Running"),
])
def test_a_jobs_phase_comes_from_its_suspension_and_conditions(suspend, conditions, phase):
    assert scale_kueue.job_phase({"spec": {"suspend": suspend}, "status": {"conditions": conditions}}) == phase


def test_the_watch_records_a_job_admitted_when_kueue_unsuspends_it():
    log = scale.WatchLog(api=None, path="/apis/batch/v1/namespaces/x/jobs")
    job = {"kind": "Job", "metadata": {"name": "job-1"}, "spec": {"suspend": True}}
    log._record(job, 1.0)
    log._record({**job, "metadata": {"name": "job-1", "labels": {}}}, 1.5)  # e.g. a label: still suspended
    assert log.seen["job-1"].admitted is None and log.seen["job-1"].phase == "Pending"
    log._record({**job, "spec": {"suspend": False}}, 2.25)
    log._record({**job, "spec": {"suspend": False},
                 "status": {"conditions": [{"type": "Complete", "status": "True"}]}}, 9.0)
    assert log.seen["job-1"].admitted == 2.25 and log.seen["job-1"].phase == "Succeeded"
    assert log.seen["job-1"].running is None  # a Job is not a pod


def test_writes_are_counted_per_job_by_writer_within_the_phase(tmp_path):
    (tmp_path / "logs").mkdir()

    def event(verb, resource, second, agent, subresource=None):
        ref = {"resource": resource, **({"subresource": subresource} if subresource else {})}
        return json.dumps({"verb": verb, "objectRef": ref, "userAgent": agent,
                           "requestReceivedTimestamp": f"2026-11-28T10:00:{second:02d}.000000Z"})

    kueue = "kueue/v0.17.0 (linux/amd64) abcdef0"
    jobctl = "kube-controller-manager/v1.35.4 (linux/amd64) kubernetes/$Format/job-controller"
    lines = [event("create", "workloads", 10, kueue), event("patch", "workloads", 11, kueue, "status"),
             event("patch", "workloads", 12, kueue, "status"), event("update", "jobs", 12, kueue),
             event("create", "pods", 13, jobctl), event("update", "jobs", 14, jobctl, "status"),
             event("create", "workloads", 30, kueue)]  # after the phase: not counted
    (tmp_path / "logs" / "audit.log").write_text("\n".join(lines) + "\n")
    start = scale.audit_time("2026-11-28T10:00:10Z")
    writes = scale.audit_writes(tmp_path, start, start + 10, jobs=2, top=2)
    assert list(writes) == ["kueue", "kube-controller-manager/job-controller"]  # the busier first
    assert writes["kueue"] == {"per_job": 2.0, "top": {"patch workloads/status": 1.0, "create workloads": 0.5}}
    assert writes["kube-controller-manager/job-controller"]["per_job"] == 1.0


def _phase(admit, p99, cpu, requests, admission=None):
    return {"admit_per_s": admit, "job_create_to_running_s": {"p99": p99}, "apiserver_s_per_job": cpu,
            "requests_per_job": requests, **({"admission": admission} if admission else {})}


def test_the_summary_compares_each_figure_and_judges_the_targets():
    report = {"nodes": 100, "jobs": 500, "rate": 20.0, "load_avg_1m": 3.1,
              "direct": _phase(None, 0.5, 0.015, 4.0),
              "kueue": _phase(18.0, 2.0, 0.030, 12.0, {"cpu_s_per_1000_jobs": 10.0, "peak_rss_mb": 100.0}),
              "flotilla": _phase(20.0, 2.5, 0.027, 9.0, {"cpu_s_per_1000_jobs": 25.0, "peak_rss_mb": 150.0})}
    out = scale_kueue.summary(report)
    assert out["bare_pods"]["admission_cpu_s_per_1000_jobs"] is None and out["bare_pods"]["rss_mb"] is None
    assert out["kueue"]["p99_submit_to_running_s"] == 2.0
    assert out["flotilla_vs_kueue"] == {"admit_per_s": 1.11, "p99_submit_to_running_s": 1.25,
                                        "apiserver_cpu_s_per_job": 0.9, "requests_per_job": 0.75,
                                        "admission_cpu_s_per_1000_jobs": 2.5, "rss_mb": 1.5}
    assert out["targets"] == {"apiserver_cpu_per_job_le_kueue": True, "p99_le_kueue": False,
                              "admit_per_s_ge_kueue": True, "admission_cpu_le_2x_kueue": False}
    json.dumps(out)  # one JSON line


def test_a_missing_figure_is_no_verdict():
    flo = dict.fromkeys(scale_kueue.FIGURES, 1.0)
    kueue = {**flo, "p99_submit_to_running_s": None}
    assert scale_kueue.targets(flo, kueue)["p99_le_kueue"] is None
    assert scale_kueue.ratio(1.0, None) is None and scale_kueue.ratio(1.0, 0.0) is None


def test_kueue_starts_in_a_mount_namespace_unless_unshare_is_missing(tmp_path):
    command = scale_kueue.launch_command(Path("/x/kueue"), tmp_path / "c.yaml", tmp_path / "kc", tmp_path / "certs",
                                         tmp_path / "scratch", "/usr/bin/unshare")
    assert command[:5] == ["/usr/bin/unshare", "--mount", "--propagation", "private", "--"]
    assert command[-5:] == ["/x/kueue", "--config", str(tmp_path / "c.yaml"), "--kubeconfig", str(tmp_path / "kc")]
    assert command[7].endswith('exec "$@"')
    assert scale_kueue.launch_command(Path("/x/kueue"), tmp_path / "c.yaml", tmp_path / "kc", tmp_path / "certs",
                                      tmp_path / "scratch", None) == command[-5:]


def test_the_metrics_certificate_is_seen_inside_the_namespace_only(tmp_path):
    unshare = scale_kueue.can_unshare()
    if unshare is None:
        pytest.skip("no mount namespace here (unshare missing or not permitted): the bench falls back to creating "
                    f"{scale_kueue.METRICS_CERTS}")
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "tls.crt").write_text("CERT\n")
    (certs / "tls.key").write_text("KEY\n")
    (tmp_path / "scratch").mkdir()
    script = scale_kueue.overlay_script(tmp_path / "scratch", certs) + '; exec "$@"'
    inside = subprocess.run([unshare, "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh",
                             "cat", str(scale_kueue.METRICS_CERTS / "tls.crt")], capture_output=True, text=True)
    assert inside.returncode == 0, inside.stderr
    assert inside.stdout == "CERT\n"
    outside = scale_kueue.METRICS_CERTS / "tls.crt"
    assert not outside.exists() or outside.read_text() != "CERT\n"  # it went with the namespace
