"""The scenario `flotilla demo` plays: what Flotilla does that other schedulers do not, one announced step at a
time, each visible in the console as it happens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import httpx

from flotilla.operator.pods import gpu_indices
from flotilla.resources import names

if TYPE_CHECKING:
    from flotilla.commands.demo import Demo

UNHEALTHY_GPUS = "flotilla.dev/unhealthy-gpus"
EXAMPLE_JOBS = ("llama-ft", "resnet50")  # examples/' TrainingJobs
FINISHED = ("Succeeded", "Failed", "Rejected")


def _gpus(demo: "Demo", job: str) -> list[tuple[str, int]]:
    """(node, GPU index) of each GPU the operator gave `job`'s live worker pods (their flotilla.dev/gpu-indices)."""
    pods = demo.get("pods", "-l", f"{names.LABEL_JOB}={job},{names.LABEL_ROLE}={names.ROLE_WORKER}").get("items", [])
    return [(p["spec"]["nodeName"], i) for p in pods
            if (p.get("spec") or {}).get("nodeName") and not p["metadata"].get("deletionTimestamp")
            for i in gpu_indices(p)]


def _first_gpu(demo: "Demo", job: str, node: str) -> int:
    """The first GPU index the operator gave `job`'s worker on `node` (0 when the pod names none)."""
    return next((i for n, i in _gpus(demo, job) if n == node), 0)


def _where(gpus: list[tuple[str, int]]) -> str:
    """'gpu-node-0003 (GPUs 4, 5, 6, 7)' for each node, in order."""
    nodes = sorted({n for n, _ in gpus})
    return ", ".join(f"{n} (GPUs {', '.join(str(i) for m, i in sorted(gpus) if m == n)})" for n in nodes)


def _job(name: str, deadline_s: int, steps: int, min_gpus: int, max_gpus: int, per_worker: int = 8,
         curve: tuple[tuple[int, float], ...] = ((8, 2.0), (16, 3.6)), interval_steps: int = 2000) -> str:
    return json.dumps({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
        "spec": {"deadlineSeconds": deadline_s, "totalSteps": steps,
                 "elasticity": {"minGPUs": min_gpus, "maxGPUs": max_gpus, "gpusPerWorker": per_worker},
                 "throughput": [{"gpus": g, "stepsPerSecond": r} for g, r in curve],
                 "checkpoint": {"intervalSteps": interval_steps, "restoreSeconds": 30},
                 "template": {"spec": {"containers": [{"name": "worker", "image": "example-worker"}]}}}})


def play(demo: "Demo", agent_token: Path, admin_token: str, start_agent: Callable[..., None]) -> None:
    from flotilla.commands.demo import say, wait_for

    def status(name: str) -> dict:
        found: dict = demo.get("trainingjob", name).get("status", {})
        return found

    say("step 1/3: a job whose deadline cannot be met is refused, with the reason")
    demo.k("apply", "-f", "-", input=_job("too-late", 600, 500_000, 8, 16), capture_output=True)
    refused = wait_for("too-late refused", lambda: (s := status("too-late")).get("phase") == "Rejected" and s,
                       timeout=60, demo=demo)
    say(f"  too-late: Rejected — {refused.get('message', '').removeprefix('rejected: ')}")

    say("step 2/3: a GPU fault on a node that runs a job: that GPU leaves service, not the node; the job on it "
        "moves through a checkpoint")
    # One 4-GPU worker: with one GPU out it still fits on its node's other GPUs, or on another node's.
    demo.k("apply", "-f", "-", input=_job("pretrain", 30 * 86400, 1_000_000, 4, 4, per_worker=4, curve=((4, 1.2),),
                                          interval_steps=500), capture_output=True)
    # Once the examples' jobs are done (simulated time runs --speed times faster): their GPUs are where a job
    # leaving a faulty node can go, and nothing ending mid-step changes what the next step shows.
    wait_for("the examples' jobs to finish", lambda: all(
        status(name).get("phase") in FINISHED for name in EXAMPLE_JOBS), timeout=240, demo=demo)
    running = wait_for("pretrain running", lambda: (s := status("pretrain")).get("phase") == "Running"
                       and s.get("placement") and s.get("progress", {}).get("steps", 0) > 0 and s,
                       timeout=120, demo=demo)
    node = running["placement"][0]["node"]
    before = status("pretrain").get("progress", {}).get("steps", 0)
    gpu = _first_gpu(demo, "pretrain", node)
    say(f"  pretrain runs on {_where(_gpus(demo, 'pretrain'))} at step {before}; "
        f"{node}'s agent now reports an uncorrectable ECC error on GPU {gpu}, one of pretrain's")
    demo.stop_one(f"agent-{node}")
    start_agent(demo, node, agent_token, "--inject", f"ecc_error@1#{gpu}")
    out = wait_for(f"GPU {gpu} of {node} out of service", lambda: json.loads(
        (demo.get("node", node).get("metadata", {}).get("annotations") or {}).get(UNHEALTHY_GPUS) or "{}"),
                   timeout=90, demo=demo)
    say(f"  {node} GPU {', '.join(out)} out of service ({', '.join(out.values())}): the controller found the fault; "
        f"the node keeps its other GPUs (annotation {UNHEALTHY_GPUS}, not tainted)")
    # The job is placed afresh without the sick GPU: on another node, or on the same node's other GPUs.
    moved = wait_for("pretrain moved off the sick GPU", lambda: (s := status("pretrain")).get("phase") == "Running"
                     and s.get("workerGeneration", 0) > running.get("workerGeneration", 0)
                     and (on := _gpus(demo, "pretrain")) and (node, gpu) not in on and s, timeout=120, demo=demo)
    at = moved.get("checkpoint", {}).get("step", 0)
    say(f"  pretrain moved to {_where(_gpus(demo, 'pretrain'))} through its checkpoint at step {at} "
        f"(it was at step {before} when the fault struck): {max(0, before - at)} steps lost")
    demo.stop_one(f"agent-{node}")
    start_agent(demo, node, agent_token)
    r = httpx.post(f"{demo.url}/v1/nodes/{node}/return-to-service", json={"reason": "demo: GPU replaced"},
                   headers={"Authorization": f"Bearer {admin_token}"}, timeout=10)
    r.raise_for_status()
    say(f"  {node}'s GPU replaced (a healthy agent again) and returned to service through the API")

    from flotilla.commands import demo_serving

    demo_serving.play(demo, "step 3/3")
