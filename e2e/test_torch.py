"""A real PyTorch job (examples/torch/train.py, FSDP2 over gloo on CPU) under the operator: this test plays the
kubelet for its pods (e2e/torch_kubelet.py), every rank a real process. A second job arrives that can only make
its deadline with half the cluster now; the operator shrinks the first through a checkpoint (DCP, resharded to
the new world size on load), and both finish by their deadlines."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

pytest.importorskip("torch")

from e2e.kube import apply, get, items, wait_for, wait_for_gpus_free_outside  # noqa: E402
from e2e.torch_kubelet import TorchKubelet  # noqa: E402
from flotilla.testing.torchjob import Run, audit, expected_order  # noqa: E402

OPERATOR_ARGS = ("--policy", "elastic-deadline")
BATCH, SAMPLES = 24, 4096


def job(name: str, total_steps: int, deadline_seconds: int, min_gpus: int, max_gpus: int, curve, ckpt: Path) -> str:
    return json.dumps({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
        "spec": {
            "deadlineSeconds": deadline_seconds, "totalSteps": total_steps,
            "elasticity": {"minGPUs": min_gpus, "maxGPUs": max_gpus, "gpusPerWorker": 8},
            "throughput": [{"gpus": g, "stepsPerSecond": r} for g, r in curve],
            "checkpoint": {"intervalSteps": 20, "restoreSeconds": 5, "uri": f"file://{ckpt}"},
            "template": {"spec": {"containers": [{
                "name": "train", "image": "flotilla-examples/torch:dev",
                "command": ["python", "examples/torch/train.py"],
                "args": ["--total-steps", str(total_steps), "--global-batch", str(BATCH), "--samples", str(SAMPLES),
                         "--ledger", f"{ckpt}/ledger"]}]}},
        },
    })


def status(name: str, ns: str) -> dict:
    return (get("trainingjob", name, ns) or {}).get("status", {})


def reasons(name: str, ns: str) -> list[str]:
    return [e["reason"] for e in items("events", ns) if e["involvedObject"]["name"] == name]


def test_a_real_pytorch_job_is_shrunk_through_a_dcp_checkpoint_for_a_second_job_and_both_finish(
        operator, namespace, log_dir, tmp_path_factory):
    capacity = sum(int(n["status"].get("allocatable", {}).get("nvidia.com/gpu", 0)) for n in items("nodes", "default")
                   if not n["spec"].get("unschedulable"))
    assert capacity == 32, "this scenario is written for the default local cluster: 4 nodes x 8 GPUs"
    wait_for_gpus_free_outside(namespace)
    storage = tmp_path_factory.mktemp(f"torch-{uuid.uuid4().hex[:6]}")
    kubelet = TorchKubelet(namespace, log_dir / f"torch-{namespace}").start()
    try:
        # big: 4 ranks (one a node) on all 32 GPUs, a loose deadline.
        assert apply(job("big", 150, 1800, 16, 32, [(16, 1.0), (32, 2.0)], storage / "big"), namespace).returncode == 0
        wait_for("big Running on 4 ranks, with progress", lambda: (s := status("big", namespace)).get("gpus") == 32
                 and s.get("phase") == "Running" and s.get("progress", {}).get("steps", 0) >= 30, timeout=240)

        # small needs 16 GPUs now to make its deadline: waiting for big to finish would miss it.
        assert apply(job("small", 40, 300, 16, 16, [(16, 0.4)], storage / "small"), namespace).returncode == 0
        wait_for("small Running on 16 GPUs", lambda: status("small", namespace).get("phase") == "Running"
                 and status("small", namespace).get("gpus") == 16, timeout=240)
        shrunk = status("big", namespace)
        assert shrunk["reshards"] >= 1 and shrunk["gpus"] == 16
        assert shrunk["checkpoint"]["generation"] >= 1 and shrunk["checkpoint"]["step"] > 0
        assert {"CheckpointRequested", "CheckpointWritten", "Resharding"} <= set(reasons("big", namespace))
        assert "RestartFromCheckpoint" not in reasons("big", namespace)

        for name, total in (("small", 40), ("big", 150)):
            done = wait_for(f"{name} Succeeded", lambda: (s := status(name, namespace)).get("phase") == "Succeeded"
                            and s, timeout=420)
            assert done["progress"]["steps"] == total
            assert done["deadlineMet"] is True
        # The restore was measured by the new worker set and recorded, for the allocator's cost model.
        assert status("big", namespace)["checkpoint"]["restoreSeconds"] > 0
    finally:
        kubelet.stop()

    failed = {n: c for n, c in kubelet.exit_codes.items() if c not in (0, -15)}
    assert not failed, f"worker processes failed: {failed} (logs in {kubelet.log_dir})"
    # What big trained, from its ranks' ledgers: every sample once, in order, through the resizes.
    run = Run(storage / "big" / "ledger")
    assert [g.world for g in run.generations][:2] == [4, 2]
    stops = {g.generation: g.saves[-1]["step"] for g in run.generations[:-1]}
    assert all(g.restored_step == stops[g.generation - 1] for g in run.generations[1:])
    result = audit(run.trained(stops), expected_order(SAMPLES, BATCH, 0, 150))
    assert result == {"steps_lost": 0, "steps_repeated": 0, "samples_repeated": 0, "samples_skipped": 0,
                      "batches_differing": 0}
