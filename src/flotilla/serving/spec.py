"""From a ServingDeployment spec (a dict, as the API server returns it) to the planner's inputs. Pure."""

from __future__ import annotations

from typing import Any, Mapping

from flotilla.serving.planner import Plan, PlanRequest
from flotilla.serving.profile import resolve_profile
from flotilla.serving.workload import SLO, Workload


def _pinned(spec: Mapping[str, Any], role: str) -> int | None:
    value = (spec.get(role) or {}).get("gpusPerInstance")
    return int(value) if value else None


def plan_request(spec: Mapping[str, Any], workload: Workload | None = None) -> PlanRequest:
    """The planner's request for the spec; `workload` defaults to spec.workload (the initial estimate).
    Colocated plans are ruled out: the operator runs prefill and decode as two Deployments.
    Raises ValueError (ProfileError included) naming the field."""
    if workload is None:
        w = spec["workload"]
        workload = Workload.from_means(float(w["requestsPerSecond"]), float(w["inputTokens"]),
                                       float(w["outputTokens"]))
    slo = spec["slo"]
    return PlanRequest(
        workload=workload,
        slo=SLO(float(slo["ttftMs"]), float(slo["tpotMs"]), float(slo.get("attainment", 0.9))),
        profile=resolve_profile(spec["profile"]),
        min_gpus=int(spec.get("minGPUs", 0)), max_gpus=int(spec["maxGPUs"]),
        allow_colocated=False,
        prefill_gpus=_pinned(spec, "prefill"), decode_gpus=_pinned(spec, "decode"))


def plan_from_status(status: Mapping[str, Any]) -> Plan | None:
    """The disaggregated plan recorded in a ServingDeployment's status, if any."""
    if "prefillReplicas" not in status or "decodeReplicas" not in status:
        return None
    return Plan("disaggregated", int(status["prefillReplicas"]), int(status.get("prefillGPUsPerInstance") or 1),
                int(status["decodeReplicas"]), int(status.get("decodeGPUsPerInstance") or 1), 0, 0,
                float(status.get("predictedGoodput") or 0.0), float((status.get("observed") or {}).get(
                    "requestsPerSecond") or 0.0), False, str((status.get("lastPlan") or {}).get("reason", "")))
