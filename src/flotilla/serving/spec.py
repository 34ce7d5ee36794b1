"""From a ServingDeployment (a dict, as the API server returns it) to the planner's inputs, and the
plan and observed load as the object carries them. Pure."""

from __future__ import annotations

import json
import math
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
    """The disaggregated plan the operator reports acting on (status mirrors spec.plan, or its first plan
    for spec.workload), if any."""
    if "prefillReplicas" not in status or "decodeReplicas" not in status:
        return None
    return Plan("disaggregated", int(status["prefillReplicas"]), int(status.get("prefillGPUsPerInstance") or 1),
                int(status["decodeReplicas"]), int(status.get("decodeGPUsPerInstance") or 1), 0, 0,
                float(status.get("predictedGoodput") or 0.0), float((status.get("observed") or {}).get(
                    "requestsPerSecond") or 0.0), False, str((status.get("lastPlan") or {}).get("reason", "")))


def plan_from_spec(spec: Mapping[str, Any]) -> Plan | None:
    """The controller's plan in spec.plan (auto mode), if it has made one."""
    p = spec.get("plan") or {}
    if "prefillReplicas" not in p or "decodeReplicas" not in p:
        return None
    return Plan("disaggregated", int(p["prefillReplicas"]),
                int(p.get("prefillGPUsPerInstance") or _pinned(spec, "prefill") or 1),
                int(p["decodeReplicas"]), int(p.get("decodeGPUsPerInstance") or _pinned(spec, "decode") or 1),
                0, 0, float(p.get("predictedGoodput") or 0.0), 0.0, False, str(p.get("reason") or ""))


def plan_field(plan: Plan, reason: str, time: str) -> dict[str, Any]:
    """spec.plan for a disaggregated plan: what the controller server-side applies."""
    return {"prefillReplicas": plan.prefill_replicas, "decodeReplicas": plan.decode_replicas,
            "prefillGPUsPerInstance": plan.prefill_gpus_per_instance,
            "decodeGPUsPerInstance": plan.decode_gpus_per_instance,
            "predictedGoodput": round(plan.predicted_goodput, 3), "reason": reason[:1024], "time": time}


OBSERVED_FIELDS = ("requestsPerSecond", "ttftP90Ms", "tpotP90Ms", "attainment")


def observed_from_annotation(raw: str | None) -> dict[str, float] | None:
    """The observed-load annotation's known fields that are finite numbers >= 0 (attainment <= 1);
    None when it is absent or not a JSON object. Anyone who may patch the object may write it, so
    nothing else of it is trusted."""
    try:
        value = json.loads(raw) if raw else None
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    out = {}
    for key in OBSERVED_FIELDS:
        v = value.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 \
                and (key != "attainment" or v <= 1):
            out[key] = float(v)
    return out
