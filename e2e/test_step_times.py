"""Workers' step times reach the controller by the path the chart deploys (issue 16).

The operator makes the worker pods of a 2-stage pipeline job; their spec points each worker at the
agent on its node (FLOTILLA_AGENT_HOST from the downward API `status.hostIP`, FLOTILLA_AGENT_PORT
from the operator's --agent-port) and says its stage (label flotilla.dev/stage, FLOTILLA_ROLE).

KWOK runs no containers, so the test plays the kubelet: it resolves each worker container's env
from the pod the operator made (values, and the fieldRef read from the pod's status) and runs the
example worker (examples/worker/worker.py) with exactly that env, one process per pod. One agent
per node binds the step port on the node's IP. KWOK gives every fake node the same address
(10.0.0.1, its --node-ip), which is not on this machine: the test stands in for each node's
network with a loopback address of its own (127.0.0.x), binds that node's agent there, and puts it
where the kubelet would put the node's IP. That is the one substitution; the datagrams then go
by UDP from the worker's StepReporter to the agent, and from the agent to the controller's
POST /v1/ingest, as in a cluster. The step times must show up in the controller's node evidence
with their job, role and rank, and the node's GPU samples must carry the role the workers reported.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from e2e.kube import (ROOT, FlotillaProcess, apply, controller_api, get, items, training_job, wait_for,
                      wait_for_gpus_free_outside)
from flotilla.testing.services import stop_process


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


AGENT_PORT = _free_udp_port()
OPERATOR_ARGS = ("--policy", "elastic-deadline", "--agent-port", str(AGENT_PORT))
STAGES = 2


@pytest.fixture(scope="module")
def controller(log_dir, tmp_path_factory):
    with controller_api(log_dir, tmp_path_factory.mktemp("controller-steps")) as api:
        yield api


def job_manifest(name: str) -> str:
    # On KWOK nothing runs in the pods (the test runs the worker with each pod's env); on kind they idle.
    return training_job(name, deadlineSeconds=3600, totalSteps=5000,
                        elasticity={"minGPUs": 16, "maxGPUs": 16, "gpusPerWorker": 8},
                        throughput=[{"gpus": 16, "stepsPerSecond": 5.0}], parallelism={"pipelineStages": STAGES})


def kubelet_env(pod: dict, node_network: dict[str, str]) -> dict[str, str]:
    """The env the kubelet would give the pod's first container. `status.hostIP` is the node's IP, which on
    this machine is the node's stand-in loopback address."""
    env = {}
    for e in pod["spec"]["containers"][0]["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
            continue
        path = e["valueFrom"]["fieldRef"]["fieldPath"]
        assert path == "status.hostIP", f"the test's kubelet resolves status.hostIP only, not {path}"
        node = get("node", pod["spec"]["nodeName"], "default")
        node_ips = {a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"}
        assert pod["status"]["hostIP"] in node_ips, "status.hostIP is the node's IP"
        env[e["name"]] = node_network[pod["spec"]["nodeName"]]
    return env


def evidence(api, node: str) -> list[dict]:
    r = api.get(f"/v1/nodes/{node}")
    return r.json()["evidence"]["latestSamples"] if r.status_code == 200 else []


def test_a_workers_step_times_reach_the_controller_through_the_agent_on_its_node(operator, controller, namespace,
                                                                                 log_dir, tmp_path):
    wait_for_gpus_free_outside(namespace)
    name = "piped"
    assert apply(job_manifest(name), namespace).returncode == 0
    pods = wait_for("2 worker pods running with their node's IP", lambda: len(ps := [
        p for p in items("pods", namespace, "flotilla.dev/role=worker")
        if p["status"].get("phase") == "Running" and p["status"].get("hostIP")]) == 2 and ps, timeout=60)
    pods.sort(key=lambda p: int(p["metadata"]["labels"]["flotilla.dev/rank"]))
    nodes = [p["spec"]["nodeName"] for p in pods]
    assert len(set(nodes)) == 2, "8 GPUs per worker: one worker per node"
    assert [p["metadata"]["labels"]["flotilla.dev/stage"] for p in pods] == ["0", "1"]
    node_network = {node: f"127.0.0.{10 + i}" for i, node in enumerate(nodes)}

    token_file = tmp_path / "token"
    token_file.write_text(controller.headers["Authorization"].split()[1])
    agents, workers = [], []
    try:
        for node in nodes:
            agents.append(FlotillaProcess(
                log_dir / f"agent-steps-{node}.log", "agent", "--node", node, "--source", "sim", "--sim-gpus", "1",
                "--controller-url", str(controller.base_url), "--token-file", str(token_file), "--interval", "0.5",
                "--step-port", str(AGENT_PORT), "--step-bind", node_network[node]).start())
        for pod in pods:
            env = kubelet_env(pod, node_network)
            assert env["FLOTILLA_AGENT_PORT"] == str(AGENT_PORT)
            log = open(log_dir / f"worker-steps-{pod['metadata']['name']}.log", "a")
            workers.append(subprocess.Popen(
                [sys.executable, str(ROOT / "examples" / "worker" / "worker.py"), "--checkpoint-dir",
                 str(tmp_path / "ckpt"), "--total-steps", "5000", "--steps-per-second", "5",
                 "--checkpoint-interval", "0"],
                env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1", **env},
                stdout=log, stderr=subprocess.STDOUT))
            log.close()

        job = f"{namespace}/{name}"
        for rank, node in enumerate(nodes):
            role = f"pp{rank}/{STAGES}"

            def arrived():
                got = {s["metric"]: s for s in evidence(controller, node)
                       if s["metric"] in ("step_time", "sync_step_time", "gpu_util")}
                return len(got) == 3 and got["step_time"]["job"] == job and got

            got = wait_for(f"rank {rank}'s step times in {node}'s evidence", arrived, timeout=60)
            for metric in ("step_time", "sync_step_time"):
                assert (got[metric]["job"], got[metric]["role"], got[metric]["rank"]) == (job, role, rank), got[metric]
            # compute time of a 5 steps/s worker, within the step's wall time
            assert 0 < got["step_time"]["value"] <= got["sync_step_time"]["value"] < 5
            # the agent stamped its node's GPU samples with the job and role its worker reported
            assert (got["gpu_util"]["job"], got["gpu_util"]["role"], got["gpu_util"]["rank"]) == (job, role, None)
        for w in workers:
            assert w.poll() is None, "a worker exited"
        for a in agents:
            assert a.alive() and "step report rejected" not in a.log_path.read_text()
    finally:
        for w in workers:
            stop_process(w)
        for a in agents:
            a.stop()
        for node in nodes:   # whatever the detectors made of the short run, the nodes go back to service
            controller.post(f"/v1/nodes/{node}/return-to-service", json={"reason": "e2e: agents stopped"})
