"""Constants and Kubernetes object builders (dicts as the API server returns them) for the controller tests."""

from typing import Any

from flotilla.controller.views import iso as _iso

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z: the fixed "now" of the tests
ADMIN, READER, AGENT = "admin-token-0123456789", "reader-token-0123456789", "agent-token-0123456789"


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def iso(ts: float) -> str:
    return _iso(ts) or ""


def training_job(name: str, namespace: str = "default", *, phase: str = "Running",
                 placement: dict[str, int] | None = None, deadline: float | None = NOW + 3600,
                 deadline_met: bool | None = True, reshards: int = 0, generation: int = 0,
                 annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    placement = {"node-a": 4} if placement is None else placement
    return {
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": iso(NOW - 600),
                     "annotations": annotations or {}},
        "spec": {"totalSteps": 10_000, "elasticity": {"minGPUs": 2, "maxGPUs": 8, "gpusPerWorker": 1},
                 **({"deadline": iso(deadline)} if deadline is not None else {}), **spec},
        "status": {"phase": phase, "gpus": sum(placement.values()),
                   "placement": [{"node": n, "gpus": g} for n, g in placement.items()],
                   "progress": {"steps": 1200, "stepsPerSecond": 2.5, "updatedAt": iso(NOW)},
                   "estimatedCompletion": iso(NOW + 1800), "deadlineMet": deadline_met,
                   "checkpoint": {"step": 1000, "time": iso(NOW - 60), "generation": generation},
                   "reshards": reshards,
                   "conditions": [{"type": "Allocated", "status": "True", "reason": "Scaled",
                                   "message": "marginal gain", "lastTransitionTime": iso(NOW - 10)}]},
    }


def node(name: str, gpus: int = 8, *, labels: dict[str, str] | None = None, unschedulable: bool = False,
         healthy: bool = True, taint_effect: str | None = None) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True"}]
    if not healthy:
        conditions.append({"type": "FlotillaGPUHealthy", "status": "False", "reason": "XidError",
                           "message": "XID 79 on GPU 3"})
    taints = [{"key": "flotilla.dev/unhealthy", "value": "XidError", "effect": taint_effect}] if taint_effect else []
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels if labels is not None else {"flotilla.dev/rack": "r1"}},
            "spec": {"unschedulable": unschedulable, "taints": taints},
            "status": {"capacity": {"nvidia.com/gpu": str(gpus), "cpu": "64"}, "conditions": conditions}}


def serving(name: str, namespace: str = "default", *, prefill: int = 2, decode: int = 4,
            last_plan: float | None = NOW - 300, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "flotilla.dev/v1alpha1", "kind": "ServingDeployment",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
            "spec": {"slo": {"ttftMs": 400, "tpotMs": 40, "attainment": 0.9},
                     "prefill": {"gpusPerInstance": 1}, "decode": {"gpusPerInstance": 2},
                     "planner": {"mode": "auto"}},
            "status": {"prefillReplicas": prefill, "decodeReplicas": decode,
                       "observed": {"requestsPerSecond": 10.0, "ttftP90Ms": 300, "tpotP90Ms": 35,
                                    "attainment": 0.93},
                       "predictedGoodput": 9.5,
                       **({"lastPlan": {"time": iso(last_plan), "reason": "ratio 1:2 at 10 rps"}}
                          if last_plan is not None else {})}}
