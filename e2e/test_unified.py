"""One GPU pool for training and serving on a real API server.

A TrainingJob runs on most of the cluster; the serving load pushed to the controller triples; the
controller re-plans the ServingDeployment; the operator's pool arbiter lends GPUs from the job's
surplus: the job checkpoints and reshards smaller, then the new serving pods run on the freed GPUs,
and both objects say so (status and Events). The load falls; after the controller's scale-down delay
and the pool's hold-down, serving gives the GPUs back and the job grows again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from e2e.kube import (
    LoadDriver,
    SimulatedWorkersProcess,
    apply,
    controller_api,
    get,
    items,
    wait_for,
    wait_for_gpus_free_outside,
)

OPERATOR_ARGS = ("--pool-policy", str(Path(__file__).with_name("pool-policy.yaml")))
INTERVAL = 5
SCALE_DOWN_AFTER = 10
JOB_MAX = 28  # of the local cluster's 32 GPUs: serving needs 2 to 4 when the load is low
# One GPU per worker: the ReplicaSet, not the arbiter, chooses which serving pods go when serving shrinks,
# and 1-GPU serving pods could otherwise leave nodes with odd free GPUs that 2-GPU workers cannot use.


@pytest.fixture(scope="module")
def controller(log_dir, tmp_path_factory):
    with controller_api(log_dir, tmp_path_factory.mktemp("unified-controller"),
                        "--scale-down-after", str(SCALE_DOWN_AFTER), "--peak-memory", str(SCALE_DOWN_AFTER)) as api:
        yield api


def chat() -> str:
    pool = lambda n: {"gpusPerInstance": 1,  # noqa: E731
                      "template": {"spec": {"containers": [{"name": n, "image": "vllm/vllm-openai"}]}}}
    return json.dumps({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "ServingDeployment", "metadata": {"name": "chat"},
        "spec": {"slo": {"ttftMs": 400, "tpotMs": 100, "attainment": 0.9},
                 "workload": {"requestsPerSecond": 10, "inputTokens": 512, "outputTokens": 128},
                 "profile": {"name": "opt-13b-a100"}, "maxGPUs": 8,
                 "planner": {"mode": "auto", "intervalSeconds": INTERVAL},
                 "prefill": pool("p"), "decode": pool("d")}})


def llama_ft() -> str:
    return json.dumps({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "llama-ft"},
        "spec": {"deadlineSeconds": 86400, "totalSteps": 1_000_000,
                 "elasticity": {"minGPUs": 4, "maxGPUs": JOB_MAX, "gpusPerWorker": 1},
                 "throughput": [{"gpus": 2, "stepsPerSecond": 2.0}, {"gpus": JOB_MAX, "stepsPerSecond": 25.0}],
                 "checkpoint": {"intervalSteps": 20, "restoreSeconds": 5},
                 "template": {"spec": {"containers": [{"name": "w", "image": "busybox:1.36",
                                                       "command": ["sh", "-c", "sleep 3600"]}]}}}})


def test_serving_borrows_from_training_through_a_checkpoint_and_gives_back(operator, controller, namespace, log_dir):
    wait_for_gpus_free_outside(namespace)
    capacity = sum(int(n["status"].get("allocatable", {}).get("nvidia.com/gpu", 0)) for n in items("nodes", "default"))
    assert capacity == 32, "this scenario is written for the default local cluster: 4 nodes x 8 GPUs"

    def sd() -> dict:
        return (get("servingdeployment", "chat", namespace) or {}).get("status", {})

    def tj() -> dict:
        return (get("trainingjob", "llama-ft", namespace) or {}).get("status", {})

    def running_pods(role: str) -> list[dict]:
        return [p for p in items("pods", namespace, f"flotilla.dev/role={role}")
                if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]

    def events(kind: str, name: str, reason: str) -> list[str]:
        return [e["message"] for e in items("events", namespace)
                if e["involvedObject"]["kind"] == kind and e["involvedObject"]["name"] == name
                and e["reason"] == reason]

    assert apply(chat(), namespace).returncode == 0
    first = wait_for("chat Ready on its first plan", lambda: (s := sd()).get("phase") == "Ready" and s, timeout=60)
    # The planner's check finds 1 prefill + 1 decode short of the SLO at 10 req/s (2 + 1 meets it); whatever it
    # picks must fit beside the job's maxGPUs, which the scenario needs to start from.
    assert first["pool"]["grantedGPUs"] == first["gpus"] <= capacity - JOB_MAX
    workers = SimulatedWorkersProcess(log_dir / "simworkers-unified.log", namespace, speed=1.0).start()
    try:
        assert apply(llama_ft(), namespace).returncode == 0
        wait_for(f"llama-ft Running on {JOB_MAX} GPUs", lambda: (s := tj()).get("phase") == "Running" and s["gpus"] == JOB_MAX,
                 timeout=90)
        wait_for("the controller mirrors chat",
                 lambda: controller.get(f"/v1/serving/{namespace}/chat").status_code == 200)

        with LoadDriver(controller, f"/v1/serving/{namespace}/chat/stats", rate=10.0) as load:
            load.rate = 30.0  # the load triples: the plan needs 6 GPUs, only 0 are free
            up = wait_for("a bigger plan", lambda: (s := sd()).get("gpus", 0) > first["gpus"] and s,
                          timeout=3 * INTERVAL + 10)
            wanted = up["gpus"]
            shrunk = wait_for("llama-ft Running smaller",
                              lambda: (s := tj()).get("phase") == "Running" and s["gpus"] < JOB_MAX and s,
                              timeout=90)
            lent = shrunk["lentTo"][0]["gpus"]  # what the free GPUs could not cover
            assert shrunk["lentTo"] == [{"serving": f"{namespace}/chat", "gpus": lent}]
            assert 0 < lent <= wanted - first["gpus"]
            assert shrunk["reshards"] >= 1 and shrunk["checkpoint"]["generation"] >= 1
            ready = wait_for("chat Ready on the bigger plan",
                             lambda: (s := sd()).get("phase") == "Ready" and s.get("readyDecode") == s[
                                 "decodeReplicas"] and s["gpus"] == wanted and s, timeout=90)
            assert ready["borrowedFrom"] == [{"job": f"{namespace}/llama-ft", "gpus": lent}]
            assert len(running_pods("decode")) == ready["decodeReplicas"]
            assert len(running_pods("prefill")) == ready["prefillReplicas"]
            held = sum(int(c["resources"]["limits"]["nvidia.com/gpu"]) for p in running_pods("worker")
                       for c in p["spec"]["containers"][:1])
            assert held == shrunk["gpus"] and held + wanted <= capacity
            assert any("sd/chat" in m for m in events("TrainingJob", "llama-ft", "LentGPUs"))
            # Resharding may last less than a poll here (simulated workers checkpoint at once): its Events stay.
            assert any("lent" in m and "sd/chat" in m for m in events("TrainingJob", "llama-ft", "CheckpointRequested"))
            assert any("sd/chat" in m for m in events("TrainingJob", "llama-ft", "Resharding"))
            assert any("tj/llama-ft" in m for m in events("ServingDeployment", "chat", "BorrowedGPUs"))

            load.rate = 10.0  # the load falls back: after the scale-down delay and the hold-down, the GPUs go back
            wait_for("chat's plan back down", lambda: sd().get("gpus", wanted) < wanted,
                     timeout=SCALE_DOWN_AFTER + 3 * INTERVAL + 10)
            back = wait_for("llama-ft grows back",
                            lambda: (s := tj()).get("phase") == "Running" and s["gpus"] == JOB_MAX and s,
                            timeout=120)
        assert not back.get("lentTo")
        assert wait_for("chat's ledger is clear", lambda: not sd().get("borrowedFrom"), timeout=30) is not None
        assert any("sd/chat" in m for m in events("TrainingJob", "llama-ft", "GotGPUsBack"))
        assert any("tj/llama-ft" in m for m in events("ServingDeployment", "chat", "ReturnedGPUs"))
        assert back["reshards"] >= 2
    finally:
        workers.stop()
