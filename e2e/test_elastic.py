"""Deadline-aware elastic allocation on a real API server (the default policy, elastic-deadline)."""

from __future__ import annotations


from e2e.kube import SimulatedWorkersProcess, apply, get, items, training_job, wait_for, wait_for_gpus_free_outside

OPERATOR_ARGS = ("--policy", "elastic-deadline")
CURVE = [{"gpus": 4, "stepsPerSecond": 4.0}, {"gpus": 8, "stepsPerSecond": 8.0}, {"gpus": 16, "stepsPerSecond": 15.0}]


def job(name: str, total_steps: int, deadline_seconds: int, min_gpus: int, max_gpus: int) -> str:
    return training_job(name, deadlineSeconds=deadline_seconds, totalSteps=total_steps,
                        elasticity={"minGPUs": min_gpus, "maxGPUs": max_gpus, "gpusPerWorker": 4},
                        throughput=CURVE, checkpoint={"intervalSteps": 100, "restoreSeconds": 5})


def status(name: str, ns: str) -> dict:
    return (get("trainingjob", name, ns) or {}).get("status", {})


def reasons(name: str, ns: str) -> list[str]:
    return [e["reason"] for e in items("events", ns) if e["involvedObject"]["name"] == name]


def test_a_third_job_is_admitted_by_shrinking_one_through_a_checkpoint_and_all_finish(operator, namespace, log_dir):
    capacity = sum(int(n["status"].get("allocatable", {}).get("nvidia.com/gpu", 0)) for n in items("nodes", "default")
                   if not n["spec"].get("unschedulable"))
    assert capacity == 32, "this scenario is written for the default local cluster: 4 nodes x 8 GPUs"
    wait_for_gpus_free_outside(namespace)
    sim = SimulatedWorkersProcess(log_dir / f"simworkers-{namespace}.log", namespace, speed=10).start()
    try:
        # Two jobs with loose deadlines take all 32 GPUs between them.
        for name in ("alpha", "beta"):
            assert apply(job(name, 4000, 3600, 4, 16), namespace).returncode == 0
        # ... and have trained a while, so that the shrink below has progress to checkpoint.
        wait_for("alpha and beta on 16 GPUs each, with progress", lambda: all(
            (s := status(n, namespace)).get("gpus") == 16 and s.get("phase") == "Running"
            and s.get("progress", {}).get("steps", 0) > 0 for n in ("alpha", "beta")), timeout=60)

        # gamma needs 8 GPUs now to make its deadline (at 4 it would take 375 s > 300 s).
        assert apply(job("gamma", 1500, 300, 4, 8), namespace).returncode == 0
        # An impossible one: 100,000 steps in 60 s cannot be done even at maxGPUs.
        assert apply(job("hopeless", 100000, 60, 4, 16), namespace).returncode == 0

        rejected = wait_for("hopeless Rejected", lambda: (s := status("hopeless", namespace)).get("phase") == "Rejected"
                            and s)
        # The Event is the write after the status patch (intent first): it may come a moment after the phase.
        wait_for("hopeless's Rejected Event", lambda: "Rejected" in reasons("hopeless", namespace), timeout=30)
        assert rejected["conditions"][0]["reason"] == "Rejected" and "deadline" in rejected["message"]

        wait_for("gamma Running on 8 GPUs", lambda: status("gamma", namespace).get("phase") == "Running"
                 and status("gamma", namespace).get("gpus") == 8, timeout=90)
        shrunk = [n for n in ("alpha", "beta") if status(n, namespace).get("reshards", 0) >= 1]
        assert shrunk, "one of alpha and beta must have given up GPUs"
        victim = status(shrunk[0], namespace)
        assert victim["checkpoint"]["generation"] >= 1 and victim["checkpoint"]["step"] > 0
        assert {"CheckpointRequested", "CheckpointWritten", "Resharding"} <= set(reasons(shrunk[0], namespace))
        assert "RestartFromCheckpoint" not in reasons(shrunk[0], namespace)
        assert sum(status(n, namespace).get("gpus", 0) for n in ("alpha", "beta", "gamma")) <= capacity

        for name, total in (("alpha", 4000), ("beta", 4000), ("gamma", 1500)):
            done = wait_for(f"{name} Succeeded", lambda: (s := status(name, namespace)).get("phase") == "Succeeded"
                            and s, timeout=120)
            assert done["progress"]["steps"] == total
            assert done["deadlineMet"] is True
    finally:
        sim.stop()
