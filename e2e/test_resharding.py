"""The resharding protocol on a real API server: a job leaves a cordoned node through a checkpoint."""

from __future__ import annotations


from e2e.kube import SimulatedWorkersProcess, apply, get, items, kubectl, training_job, wait_for


def test_a_job_moves_off_a_cordoned_node_through_a_checkpoint_and_keeps_its_progress(operator, namespace, log_dir):
    sim = SimulatedWorkersProcess(log_dir / f"simworkers-{namespace}.log", namespace).start()
    job = training_job("mover", deadlineSeconds=3600, totalSteps=400,
                       elasticity={"minGPUs": 2, "maxGPUs": 2, "gpusPerWorker": 1},
                       throughput=[{"gpus": 1, "stepsPerSecond": 10.0}, {"gpus": 2, "stepsPerSecond": 18.0}],
                       checkpoint={"intervalSteps": 50, "restoreSeconds": 5})
    cordoned = None
    try:
        assert apply(job, namespace).returncode == 0

        def status():
            return (get("trainingjob", "mover", namespace) or {}).get("status", {})

        wait_for("progress reported", lambda: status().get("phase") == "Running"
                 and status().get("progress", {}).get("steps", 0) >= 60, timeout=60)
        first = status()
        assert first["checkpoint"]["step"] >= 50  # periodic checkpoints are reported
        cordoned = first["placement"][0]["node"]
        kubectl("cordon", cordoned)

        moved = wait_for("reshard done", lambda: (s := status()).get("reshards") == 1
                         and s.get("phase") in ("Running", "Succeeded") and s, timeout=60)
        assert cordoned not in {p["node"] for p in moved["placement"]}
        assert moved["checkpoint"]["generation"] == 1
        resumed_at = moved["checkpoint"]["step"]
        assert resumed_at >= first["progress"]["steps"], "the checkpoint is taken after the move was asked for"
        reasons = [e["reason"] for e in items("events", namespace) if e["involvedObject"]["name"] == "mover"]
        assert {"CheckpointRequested", "CheckpointWritten", "Resharding"} <= set(reasons)
        assert "RestartFromCheckpoint" not in reasons
        uid = get("trainingjob", "mover", namespace)["metadata"]["uid"]
        pods = items("pods", namespace, f"flotilla.dev/job-uid={uid}")
        assert {p["metadata"]["labels"]["flotilla.dev/generation"] for p in pods} == {"1"}
        assert all(p["spec"]["nodeSelector"]["kubernetes.io/hostname"] != cordoned for p in pods)

        done = wait_for("mover Succeeded", lambda: (s := status()).get("phase") == "Succeeded" and s, timeout=90)
        assert done["progress"]["steps"] == 400 and done["deadlineMet"] is True
    finally:
        if cordoned:
            kubectl("uncordon", cordoned, check=False)
        sim.stop()
