"""The operator on a real API server with KWOK GPU nodes."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from e2e.kube import ROOT, OperatorProcess, apply, get, items, kubectl, wait_for, wait_for_gpus_free_outside
from flotilla.operator.training import pod_name

WORKER = "flotilla.dev/role=worker"
# These tests are about the operator's mechanics; FIFO gang at minGPUs makes the GPU counts exact.
OPERATOR_ARGS = ("--policy", "fifo-gang")


def job_manifest(name: str, min_gpus: int = 2, max_gpus: int = 4, per_worker: int = 1,
                 exit_after: str | None = None, exit_code: str = "0") -> str:
    # KWOK nodes act on the sim-* annotations; on a real cluster (kind) the container does the same.
    annotations, command = {}, "sleep 3600"
    if exit_after:
        annotations = {"flotilla.dev/sim-exit-code": exit_code, "flotilla.dev/sim-exit-after": exit_after}
        command = f"sleep {exit_after.rstrip('s')}; exit {exit_code}"
    return json.dumps({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
        "spec": {
            "deadlineSeconds": 7200, "totalSteps": 1000,
            "elasticity": {"minGPUs": min_gpus, "maxGPUs": max_gpus, "gpusPerWorker": per_worker},
            "throughput": [{"gpus": 1, "stepsPerSecond": 1.0}, {"gpus": 4, "stepsPerSecond": 3.5}],
            "template": {"metadata": {"annotations": annotations},
                         "spec": {"containers": [{"name": "worker", "image": "busybox:1.36",
                                                         "command": ["sh", "-c", command]}]}},
        },
    })


def phase(name: str, ns: str) -> str | None:
    tj = get("trainingjob", name, ns)
    return (tj or {}).get("status", {}).get("phase")


def job_uid(name: str, ns: str) -> str:
    return get("trainingjob", name, ns)["metadata"]["uid"]


def pods_of(uid: str, ns: str) -> list[dict]:
    """The worker pods of the job with this UID (a label for the selector; the owner reference decides)."""
    return [p for p in items("pods", ns, f"{WORKER},flotilla.dev/job-uid={uid}")
            if any(r.get("controller") and r["uid"] == uid for r in p["metadata"].get("ownerReferences") or [])]


def running_pods(ns: str, job: str) -> list[dict]:
    return [p for p in pods_of(job_uid(job, ns), ns) if p.get("status", {}).get("phase") == "Running"]


def events_for(ns: str, name: str) -> list[str]:
    """The reason of every occurrence: an Event repeated N times is one Event with count N."""
    evs = items("events", ns)
    return [e["reason"] for e in evs if e["involvedObject"]["name"] == name for _ in range(e.get("count") or 1)]


def test_examples_run_on_kwok_gpu_nodes(operator, namespace):
    wait_for_gpus_free_outside(namespace)  # an earlier module's namespace may still be going
    result = kubectl("apply", "-n", namespace, "-f", str(ROOT / "examples"))
    assert "trainingjob.flotilla.dev/llama-ft created" in result.stdout

    for name, gpus, workers in (("llama-ft", 8, 2), ("resnet50", 2, 2)):
        wait_for(f"{name} Running", lambda: phase(name, namespace) == "Running", timeout=60)
        tj = get("trainingjob", name, namespace)
        st = tj["status"]
        assert st["gpus"] == gpus
        assert sum(p["gpus"] for p in st["placement"]) == gpus
        pods = running_pods(namespace, name)
        assert len(pods) == workers == st["workers"]
        # Each pod asks for its GPUs and runs where the placement says.
        placed_nodes = {p["node"] for p in st["placement"]}
        for pod in pods:
            assert pod["spec"]["nodeName"] in placed_nodes
            assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == str(gpus // workers)
            assert pod["metadata"]["ownerReferences"][0]["uid"] == tj["metadata"]["uid"]
        assert st["observedGeneration"] == tj["metadata"]["generation"]
        assert {c["type"]: c["status"] for c in st["conditions"]} == {"Admitted": "True", "Ready": "True"}
        assert st["deadlineMet"] is True and st["estimatedCompletion"]
        # Routine transitions are conditions, not Events.
        assert {c["type"]: c["reason"] for c in st["conditions"]} == {"Admitted": "Admitted",
                                                                       "Ready": "WorkersRunning"}

    sd = wait_for("chat Ready", lambda: (s := get("servingdeployment", "chat", namespace))
                  and s.get("status", {}).get("phase") == "Ready" and s)
    assert sd["status"]["ratio"] == "1:2" and sd["status"]["gpus"] == 6
    deps = {d["metadata"]["name"]: d for d in items("deployments", namespace)}
    assert deps["chat-prefill"]["spec"]["replicas"] == 1 and deps["chat-decode"]["spec"]["replicas"] == 2
    assert deps["chat-decode"]["status"]["readyReplicas"] == 2

    table = kubectl("get", "flotilla", "-n", namespace).stdout
    assert "llama-ft" in table and "Running" in table and "1:2" in table


def test_an_auto_mode_serving_deployment_comes_up_with_the_planners_plan(operator, namespace):
    from flotilla.operator.serving import initial_plan

    body = {"apiVersion": "flotilla.dev/v1alpha1", "kind": "ServingDeployment", "metadata": {"name": "auto"},
            "spec": {"slo": {"ttftMs": 400, "tpotMs": 100, "attainment": 0.9},
                     "workload": {"requestsPerSecond": 4, "inputTokens": 512, "outputTokens": 128},
                     "profile": {"name": "opt-13b-a100"}, "maxGPUs": 8,
                     "prefill": {"template": {"spec": {"containers": [{"name": "p", "image": "vllm/vllm-openai"}]}}},
                     "decode": {"template": {"spec": {"containers": [{"name": "d", "image": "vllm/vllm-openai"}]}}}}}
    assert apply(json.dumps(body), namespace).returncode == 0
    expected = initial_plan(body["spec"])
    sd = wait_for("auto Ready", lambda: (s := get("servingdeployment", "auto", namespace))
                  and s.get("status", {}).get("phase") == "Ready" and s)
    st = sd["status"]
    assert (st["prefillReplicas"], st["decodeReplicas"]) == (expected.prefill_replicas, expected.decode_replicas)
    assert st["gpus"] == expected.gpus and st["lastPlan"]["reason"] == expected.reason
    assert "Scaled" in events_for(namespace, "auto")


def test_deleting_a_job_removes_its_pods(operator, namespace):
    assert apply(job_manifest("doomed"), namespace).returncode == 0
    wait_for("doomed's pods running", lambda: len(running_pods(namespace, "doomed")) == 2)
    uid = job_uid("doomed", namespace)
    kubectl("delete", "trainingjob", "doomed", "-n", namespace, "--wait=true", "--timeout=30s")
    wait_for("doomed's pods gone", lambda: not items("pods", namespace, f"flotilla.dev/job-uid={uid}"), timeout=60)


def test_job_succeeds_when_rank0_exits_zero_and_a_failing_worker_restarts_then_fails(operator, namespace):
    assert apply(job_manifest("quick", exit_after="3s"), namespace).returncode == 0
    # Every generation of this job's workers crashes 3 s after it starts.
    assert apply(job_manifest("broken", exit_after="3s", exit_code="1"), namespace).returncode == 0
    wait_for("quick Succeeded", lambda: phase("quick", namespace) == "Succeeded", timeout=60)
    wait_for("broken Failed", lambda: phase("broken", namespace) == "Failed", timeout=90)
    broken = get("trainingjob", "broken", namespace)["status"]
    # Restarted from its checkpoint 3 times: 3 new worker sets, no reshard (its size and placement never changed).
    assert broken["restarts"] == 3 and broken["workerGeneration"] == 3 and broken.get("reshards", 0) == 0
    assert "failed after 3 restarts" in broken["message"]
    assert events_for(namespace, "broken").count("WorkerFailed") == 4
    ready = [c for c in get("trainingjob", "quick", namespace)["status"]["conditions"] if c["type"] == "Ready"]
    assert [(c["status"], c["reason"]) for c in ready] == [("False", "Succeeded")]


def test_a_job_too_big_for_free_gpus_waits_then_runs_when_a_node_joins(operator, namespace):
    total = sum(int(n["status"].get("allocatable", {}).get("nvidia.com/gpu", 0)) for n in items("nodes", "default"))
    # The job needs the whole cluster once the node joins: earlier tests' pods must be gone first.
    wait_for_gpus_free_outside(namespace)
    # Asks for every GPU of the cluster plus one node's worth: it cannot start until a node joins.
    want = total + 8
    assert apply(job_manifest("big", min_gpus=want, max_gpus=want, per_worker=8), namespace).returncode == 0
    wait_for("big Pending", lambda: phase("big", namespace) == "Pending")
    assert "waiting for" in get("trainingjob", "big", namespace)["status"]["message"]
    extra = f"gpu-node-e2e-{namespace}"
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": extra, "annotations": {"kwok.x-k8s.io/node": "fake"},
                         "labels": {"type": "kwok-e2e", "kubernetes.io/hostname": extra}},
            "status": {"capacity": {"cpu": "96", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"},
                       "allocatable": {"cpu": "96", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"}}}
    kubectl("apply", "-f", "-", stdin=json.dumps(node))
    try:
        # Everything else in the cluster must be idle for this one to fit: other tests' jobs finish or go.
        wait_for("big Admitted", lambda: phase("big", namespace) in ("Admitted", "Running"), timeout=120)
        assert get("trainingjob", "big", namespace)["status"]["gpus"] == want
    finally:
        kubectl("delete", "trainingjob", "big", "-n", namespace, "--wait=true", "--timeout=30s", check=False)
        kubectl("delete", "node", extra, check=False)


def test_restarting_the_operator_mid_way_creates_no_duplicate_pods(log_dir: Path, namespace):
    log = log_dir / "operator-restart.log"
    op = OperatorProcess(log, *OPERATOR_ARGS).start()
    try:
        for i in range(3):
            assert apply(job_manifest(f"r{i}", min_gpus=2, max_gpus=2), namespace).returncode == 0
        # Kill it the moment the first placement is recorded: pods may or may not exist yet.
        wait_for("a placement recorded", lambda: any(
            (get("trainingjob", f"r{i}", namespace) or {}).get("status", {}).get("placement") for i in range(3)),
            interval=0.05)
        op.stop(signal.SIGKILL)
        before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in items("pods", namespace, WORKER)}
        op = OperatorProcess(log, *OPERATOR_ARGS).start()
        for i in range(3):
            wait_for(f"r{i} Running", lambda: phase(f"r{i}", namespace) == "Running", timeout=60)
        pods = items("pods", namespace, WORKER)
        names = [p["metadata"]["name"] for p in pods]
        assert len(names) == len(set(names)) == 6, names
        for i in range(3):
            uid = job_uid(f"r{i}", namespace)
            assert sorted(p["metadata"]["name"] for p in pods_of(uid, namespace)) == [
                pod_name(f"r{i}", uid, 0, 0), pod_name(f"r{i}", uid, 0, 1)]
        # Pods created before the crash are kept, not replaced.
        after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
        assert all(after[n] == uid for n, uid in before.items())
        # And a restart once everything runs changes nothing.
        op.stop()
        op = OperatorProcess(log, *OPERATOR_ARGS).start()
        wait_for("operator up", op.alive)
        time.sleep(5)
        assert {p["metadata"]["uid"] for p in items("pods", namespace, WORKER)} == set(after.values())
        assert all(get("trainingjob", f"r{i}", namespace)["status"].get("reshards", 0) == 0 for i in range(3))
    finally:
        op.stop()
