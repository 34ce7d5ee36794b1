"""The demo's serving step: a ServingDeployment on engine doubles (flotilla.testing.engine, played at its pods'
addresses by flotilla.testing.serving_pods), real completions sent to it at a constant rate; the rate triples,
the controller reads it from the engines' metrics and re-plans (the P:D ratio changes), the pool lends GPUs
from a training job through a resharding checkpoint; the rate falls back and the GPUs go back."""

from __future__ import annotations

import json
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from flotilla.testing.load import ConstantLoad
from flotilla.testing.serving_pods import ServingKubelet
from flotilla.testing.services import free_port

if TYPE_CHECKING:
    from flotilla.commands.demo import Demo

SERVING, TRAINING = "assistant", "finetune"
RATE = 4.0  # requests/s, then three times as many
PROMPT, OUTPUT = 512, 64
INTERVAL = 5  # the planner's interval (s)
# The demo's controller and operator run with these (`flotilla demo` passes them): serving reacts in seconds; and
# half of the 4 nodes may be taken out in 10 minutes (the default 10% is one node: an agent slow to start on a
# loaded machine, taken out for a lost heartbeat, would use what the fault step needs).
CONTROLLER_ARGS = ("--scrape-interval", "2", "--scale-down-after", "10", "--peak-memory", "10",
                   "--taint-budget-fraction", "0.5")
POOL_POLICY = "forecastHeadroom: 0.0\nholdDownSeconds: 10\nborrowGuaranteed: false\n"


def serving_manifest(port: int) -> str:
    pool = lambda n: {"gpusPerInstance": 1, "template": {"spec": {"containers": [  # noqa: E731
        {"name": n, "image": "vllm/vllm-openai", "ports": [{"name": "http", "containerPort": port}]}]}}}
    return json.dumps({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "ServingDeployment", "metadata": {"name": SERVING},
        "spec": {"slo": {"ttftMs": 400, "tpotMs": 100, "attainment": 0.9},
                 "workload": {"requestsPerSecond": RATE, "inputTokens": PROMPT, "outputTokens": OUTPUT},
                 "profile": {"name": "opt-13b-a100"}, "maxGPUs": 8, "endpoint": {"port": port},
                 "planner": {"mode": "auto", "intervalSeconds": INTERVAL},
                 "prefill": pool("prefill"), "decode": pool("decode")}})


def training_manifest(max_gpus: int) -> str:
    """A long fine-tuning job, one GPU per worker. Given every GPU nothing else uses as its maxGPUs, it takes them
    all (the allocator offers a job its maxGPUs even where that count does not tile a node)."""
    return json.dumps({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": TRAINING},
        "spec": {"deadlineSeconds": 30 * 86400, "totalSteps": 5_000_000,
                 "elasticity": {"minGPUs": 2, "maxGPUs": max_gpus, "gpusPerWorker": 1},
                 "throughput": [{"gpus": 1, "stepsPerSecond": 1.0}, {"gpus": 32, "stepsPerSecond": 24.0}],
                 "checkpoint": {"intervalSteps": 1000, "restoreSeconds": 5},
                 "template": {"spec": {"containers": [{"name": "worker", "image": "example-worker"}]}}}})


def ratio(status: dict[str, Any]) -> str:
    return f"{status.get('prefillReplicas', 0)}:{status.get('decodeReplicas', 0)}"


def reduced(r: str) -> Fraction | None:
    p, _, d = r.partition(":")
    return Fraction(int(p), int(d)) if d.isdigit() and int(d) else None


def free_gpus(demo: "Demo") -> int:
    """GPUs on schedulable nodes that no running or pending pod holds."""
    nodes = {n["metadata"]["name"]: int(n["status"].get("allocatable", {}).get("nvidia.com/gpu", 0))
             for n in demo.get("nodes").get("items", []) if not n.get("spec", {}).get("unschedulable")}
    for p in demo.get("pods", "-A").get("items", []):
        node = p["spec"].get("nodeName")
        if node in nodes and p["status"].get("phase") in ("Pending", "Running"):
            nodes[node] -= sum(int((c.get("resources", {}).get("limits") or {}).get("nvidia.com/gpu", 0))
                               for c in p["spec"]["containers"])
    return sum(nodes.values())


def play(demo: "Demo", step: str) -> None:
    from flotilla.commands.demo import say, wait_for

    def sd() -> dict:
        found: dict = demo.get("servingdeployment", SERVING).get("status", {})
        return found

    def jobs() -> dict[str, dict]:
        return {j["metadata"]["name"]: j.get("status", {}) for j in demo.get("trainingjobs").get("items", [])}

    def lenders() -> dict[str, int]:
        return {name: sum(loan["gpus"] for loan in s.get("lentTo") or [] if loan["serving"].endswith(f"/{SERVING}"))
                for name, s in jobs().items() if s.get("lentTo")}

    say(f"{step}: a serving deployment on simulated engines, its load triples: the planner changes its P:D ratio "
        "and borrows GPUs from training through a checkpoint, then gives them back")
    kubelet = demo.kubelet = ServingKubelet("default", demo.state, kubeconfig=demo.kubeconfig, serving=SERVING,
                                            on_change=demo.record_engines).start()
    demo.k("apply", "-f", "-", input=serving_manifest(free_port()), capture_output=True)
    first = wait_for(f"{SERVING} Ready", lambda: (s := sd()).get("phase") == "Ready" and s, timeout=90, demo=demo)
    free = wait_for(f"{SERVING}'s pods bound", lambda: not any(
        not p["spec"].get("nodeName") for p in demo.get("pods", "-l", f"flotilla.dev/serving={SERVING}").get(
            "items", [])) and free_gpus(demo), timeout=60, demo=demo)
    demo.k("apply", "-f", "-", input=training_manifest(max(free, 4)), capture_output=True)
    wait_for(f"{TRAINING} running on every free GPU", lambda: jobs().get(TRAINING, {}).get("phase") == "Running"
             and free_gpus(demo) == 0, timeout=120, demo=demo)
    wait_for(f"{SERVING}'s engines", lambda: len(kubelet.ready("prefill")) >= first["prefillReplicas"]
             and len(kubelet.ready("decode")) >= first["decodeReplicas"], timeout=90, demo=demo)
    load = ConstantLoad(kubelet.url(f"{SERVING}-decode"), RATE, PROMPT, OUTPUT).start()
    try:
        seen = wait_for(f"{SERVING}'s observed rate", lambda: (o := sd().get("observed") or {}).get(
            "requestsPerSecond", 0) >= 0.6 * RATE and o, timeout=90, demo=demo)
        training = {n: s.get("gpus", 0) for n, s in jobs().items() if s.get("phase") == "Running"}
        say(f"  {SERVING}: P:D {ratio(first)} on {first['gpus']} GPUs; the controller reads "
            f"{seen['requestsPerSecond']:.1f} req/s from its engines' metrics; training holds "
            f"{', '.join(f'{n} {g}' for n, g in sorted(training.items()))} GPUs; 0 GPUs free")
        steps_before = {n: s.get("progress", {}).get("steps", 0) for n, s in jobs().items()}
        load.rate = 3 * RATE
        say(f"  the load triples to {load.rate:.0f} req/s")
        up = wait_for("a re-plan for the tripled load", lambda: (s := sd()).get("gpus", 0) > first["gpus"] and s,
                      timeout=90, demo=demo)
        say(f"  the planner re-plans: P:D {ratio(first)} -> {ratio(up)} on {up['gpus']} GPUs "
            f"({'; '.join((up.get('lastPlan') or {}).get('reason', '').split('; ')[:2])})")
        lent = wait_for("a training job lending GPUs", lenders, timeout=120, demo=demo)
        name, gpus = next(iter(lent.items()))
        shrunk = wait_for(f"{name} running smaller", lambda: (s := jobs()[name]).get("phase") == "Running"
                          and s.get("lentTo") and s, timeout=120, demo=demo)
        at = shrunk.get("checkpoint", {}).get("step", 0)
        say(f"  {name} lends {gpus} GPU(s) to {SERVING}: it checkpointed at step {at} and resharded to "
            f"{shrunk['gpus']} GPUs ({max(0, steps_before.get(name, 0) - at)} steps lost)")
        ready = wait_for(f"{SERVING} Ready on borrowed GPUs", lambda: (s := sd()).get("phase") == "Ready"
                         and s.get("borrowedFrom") and s.get("readyDecode") == s.get("decodeReplicas")
                         and s.get("readyPrefill") == s.get("prefillReplicas") and s,
                         timeout=120, demo=demo)
        say(f"  {SERVING} serves at P:D {ratio(ready)} on {ready['gpus']} GPUs, "
            f"{sum(b['gpus'] for b in ready['borrowedFrom'])} borrowed from {name}")
        load.rate = RATE
        say(f"  the load drops back to {load.rate:.0f} req/s")
        down = wait_for(f"{SERVING}'s plan back down", lambda: (s := sd()).get("gpus", 0) < ready["gpus"] and s,
                        timeout=120, demo=demo)
        back = wait_for(f"{name} gets its GPUs back", lambda: (s := jobs()[name]).get("phase") == "Running"
                        and not s.get("lentTo") and s, timeout=150, demo=demo)
        say(f"  {SERVING} back to P:D {ratio(down)} on {down['gpus']} GPUs; {name} got its GPUs back through a "
            f"checkpoint at step {back.get('checkpoint', {}).get('step', 0)}: {back['gpus']} GPUs")
    finally:
        load.stop()
