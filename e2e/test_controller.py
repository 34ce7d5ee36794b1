"""The controller on a real API server, with real Redis and agent processes.

* Health: agents stream simulated metrics; an uncorrectable ECC error is injected on one node
  of a running job; the node gets its condition, taint and Event; the job reshards through a
  checkpoint onto healthy nodes with its progress kept; the decision is in the history.
* Drain: an admin drains a node through the API; its job moves off through a checkpoint; the
  decision is in /v1/decisions and in /metrics.
"""

from __future__ import annotations

import json

import httpx
import pytest

from e2e.kube import (
    FlotillaProcess,
    SimulatedWorkersProcess,
    apply,
    controller_api,
    get,
    items,
    kubectl,
    training_job,
    wait_for,
    wait_for_gpus_free_outside,
)
from flotilla.testing.services import redis_server

OPERATOR_ARGS = ("--policy", "elastic-deadline")


@pytest.fixture(scope="module")
def redis_url():
    with redis_server() as url:
        yield url


@pytest.fixture(scope="module")
def controller(redis_url, log_dir, tmp_path_factory):
    with controller_api(log_dir, tmp_path_factory.mktemp("controller"), "--redis-url", redis_url) as api:
        yield api


def job_manifest(name: str) -> str:
    return training_job(name, deadlineSeconds=3600, totalSteps=30000,
                        elasticity={"minGPUs": 8, "maxGPUs": 16, "gpusPerWorker": 8},
                        throughput=[{"gpus": 8, "stepsPerSecond": 10.0}, {"gpus": 16, "stepsPerSecond": 18.0}],
                        checkpoint={"intervalSteps": 50, "restoreSeconds": 5})


def status(name: str, ns: str) -> dict:
    return (get("trainingjob", name, ns) or {}).get("status", {})


def start_running_job(name: str, namespace: str, log_dir) -> tuple[FlotillaProcess, dict]:
    wait_for_gpus_free_outside(namespace)
    sim = SimulatedWorkersProcess(log_dir / f"simworkers-{namespace}.log", namespace).start()
    try:
        assert apply(job_manifest(name), namespace).returncode == 0
        first = wait_for(f"{name} running with progress", lambda: (s := status(name, namespace))
                         .get("phase") == "Running" and s.get("progress", {}).get("steps", 0) >= 60 and s, timeout=60)
    except BaseException:
        sim.stop()
        raise
    return sim, first


def decisions(api: httpx.Client, **params) -> list[dict]:
    r = api.get("/v1/decisions", params=params)
    assert r.status_code == 200, r.text
    return r.json()["items"]


def node_health(name: str) -> tuple[str | None, list[dict]]:
    node = get("node", name, "default") or {}
    cond = next((c for c in node.get("status", {}).get("conditions", []) if c["type"] == "FlotillaGPUHealthy"), {})
    taints = [t for t in node.get("spec", {}).get("taints") or [] if t["key"] == "flotilla.dev/unhealthy"]
    return cond.get("status"), taints


def gpus_out(name: str) -> dict:
    annotations = ((get("node", name, "default") or {}).get("metadata") or {}).get("annotations") or {}
    return json.loads(annotations.get("flotilla.dev/unhealthy-gpus") or "{}")


def test_a_gpu_fault_moves_the_job_off_the_node_through_a_checkpoint(operator, controller, redis_url, namespace,
                                                                     log_dir):
    sim, first = start_running_job("victim", namespace, log_dir)
    nodes = [p["node"] for p in first["placement"]]
    faulty = nodes[0]
    agents = []
    try:
        for n in nodes:
            extra = ["--inject", "ecc_error@4"] if n == faulty else []
            agents.append(FlotillaProcess(log_dir / f"agent-{n}.log", "agent", "--node", n, "--source", "sim",
                                          "--job", f"{namespace}/victim", "--redis-url", redis_url,
                                          "--interval", "0.5", "--step-port", "0", *extra).start())
        # An uncorrectable ECC error is local to its GPU (GPU 0 here): that GPU leaves service, not the node
        # (e2e/test_gpu_fault.py shows the node's other jobs keep running).
        wait_for(f"GPU 0 of {faulty} out of service", lambda: "0" in gpus_out(faulty), timeout=60)
        cond, taints = node_health(faulty)
        assert cond != "False" and taints == [], f"the whole node was marked: {cond!r}, {taints}"
        node_events = [e for e in items("events", "default") if e["involvedObject"]["name"] == faulty]
        assert any(e["reason"] == "GPUOutOfService" and e["type"] == "Warning" for e in node_events)
        for healthy in nodes[1:]:
            cond, taints = node_health(healthy)  # "True" where an earlier test returned the node to service
            assert cond != "False" and taints == [], f"{healthy} has no fault but is marked {cond!r}, {taints}"

        moved = wait_for("victim resharded off the faulty node", lambda: (s := status("victim", namespace))
                         .get("phase") == "Running" and faulty not in {p["node"] for p in s["placement"]} and s,
                         timeout=90)
        assert moved["reshards"] > first.get("reshards", 0)
        assert moved["checkpoint"]["generation"] >= 1
        assert moved["checkpoint"]["step"] >= first["progress"]["steps"], "progress kept at the checkpoint"
        job_events = [e for e in items("events", namespace) if e["involvedObject"]["name"] == "victim"]
        # The controller asks for the checkpoint; the operator, seeing the taint, may ask first: either way
        # one checkpoint is written and the job moves.
        assert {"CheckpointRequested", "CheckpointWritten", "Resharding"} <= {e["reason"] for e in job_events}

        found = decisions(controller, kind="detection")
        assert any(d["object"] == faulty for d in found), found
        # The history shows the move. A checkpoint-request decision is there only when the controller asked
        # before the operator had re-placed the job (the controller asks for the jobs its mirror puts on the node).
        wait_for("the move in the decision history", lambda: any(
            faulty in d["inputs"]["from"] and faulty not in d["inputs"]["to"]
            for d in decisions(controller, kind="allocation", object=f"{namespace}/victim")), timeout=10)
    finally:
        for a in agents:
            a.stop()
        sim.stop()
        # Stopped agents fall silent, which the controller rightly reads as lost heartbeats: every node
        # that had an agent goes back to service explicitly (this also forgets its heartbeat).
        for n in nodes:
            r = controller.post(f"/v1/nodes/{n}/return-to-service", json={"reason": "e2e: agents stopped"})
            assert r.status_code == 200, r.text
    assert wait_for("node back in service", lambda: node_health(faulty) == ("True", []) and not gpus_out(faulty),
                    timeout=30)
    for n in nodes:
        wait_for(f"{n} untainted", lambda: not node_health(n)[1], timeout=30)


def test_draining_a_node_through_the_api_moves_its_job_through_a_checkpoint(operator, controller, namespace,
                                                                          log_dir):
    sim, first = start_running_job("tenant", namespace, log_dir)
    node = first["placement"][0]["node"]
    before = status("tenant", namespace)  # the elastic allocator may already have resized it once
    try:
        r = controller.post(f"/v1/nodes/{node}/drain", json={"reason": "e2e maintenance"},
                            headers={"Idempotency-Key": f"drain-{namespace}"})
        assert r.status_code == 202, r.text
        assert f"{namespace}/tenant" in r.json()["checkpointRequests"]
        again = controller.post(f"/v1/nodes/{node}/drain", json={"reason": "e2e maintenance"},
                                headers={"Idempotency-Key": f"drain-{namespace}"})
        assert again.status_code == 202 and again.headers.get("Idempotent-Replayed") == "true"

        moved = wait_for("tenant moved off the drained node", lambda: (s := status("tenant", namespace))
                         .get("phase") == "Running" and node not in {p["node"] for p in s["placement"]} and s,
                         timeout=90)
        assert moved["reshards"] > before.get("reshards", 0)
        assert moved["checkpoint"]["step"] >= before["progress"]["steps"]
        assert (get("node", node, "default") or {})["spec"].get("unschedulable") is True

        assert any(d["object"] == node for d in decisions(controller, kind="drain"))
        metrics = controller.get("/metrics").text
        assert any(line.startswith('flotilla_decisions_total{kind="drain"}') and float(line.split()[-1]) >= 1
                   for line in metrics.splitlines()), "drain not counted in /metrics"
    finally:
        sim.stop()
        controller.post(f"/v1/nodes/{node}/return-to-service", json={"reason": "e2e done"})
        kubectl("uncordon", node, check=False)
