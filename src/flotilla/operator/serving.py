"""ServingDeployments: from the spec (and, later, the PD planner) to prefill/decode Deployments. Pure."""

from __future__ import annotations

import copy
from typing import Any, Mapping

from flotilla import API_VERSION
from flotilla.operator.actions import Action, ApplyDeployment, PatchStatus, PostEvent, involved
from flotilla.operator.training import set_condition
from flotilla.operator.timeutil import rfc3339
from flotilla.resources import names, phases

Body = Mapping[str, Any]
PLURAL = "servingdeployments"
ROLES = (names.ROLE_PREFILL, names.ROLE_DECODE)


def deployment_name(sd: str, role: str) -> str:
    return f"{sd}-{role}"


def desired_replicas(body: Body) -> tuple[dict[str, int], str]:
    """Replica counts per role and why. `fixed` mode: the spec's counts. `auto` mode keeps
    the last plan in status, starting from the spec's counts or one of each."""
    spec, status = body["spec"], body.get("status") or {}
    planner = spec.get("planner") or {}
    if planner.get("mode", "auto") == "fixed":
        return ({names.ROLE_PREFILL: int(planner["prefillReplicas"]),
                 names.ROLE_DECODE: int(planner["decodeReplicas"])}, "fixed by spec.planner")
    if "prefillReplicas" in status and "decodeReplicas" in status:
        return ({names.ROLE_PREFILL: int(status["prefillReplicas"]),
                 names.ROLE_DECODE: int(status["decodeReplicas"])},
                (status.get("lastPlan") or {}).get("reason", "last plan"))
    return ({names.ROLE_PREFILL: int(planner.get("prefillReplicas", 1)),
             names.ROLE_DECODE: int(planner.get("decodeReplicas", 1))}, "initial plan from spec")


def gpus_per_instance(body: Body, role: str) -> int:
    return int(body["spec"][role].get("gpusPerInstance", 1))


def deployment(body: Body, role: str, replicas: int) -> dict[str, Any]:
    meta, pool = body["metadata"], body["spec"][role]
    template = copy.deepcopy(pool["template"])
    t_meta = template.setdefault("metadata", {})
    selector = {names.LABEL_SERVING: meta["name"], names.LABEL_ROLE: role}
    t_meta["labels"] = {**(t_meta.get("labels") or {}), **selector, names.LABEL_MANAGED_BY: names.MANAGED_BY}
    pod_spec = template["spec"]
    pod_spec.setdefault("tolerations", []).append(
        {"key": names.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    env = [{"name": "FLOTILLA_SERVING", "value": meta["name"]}, {"name": "FLOTILLA_ROLE", "value": role}]
    for i, c in enumerate(pod_spec["containers"]):
        c.setdefault("env", []).extend(env)
        if i == 0:
            c.setdefault("resources", {}).setdefault("limits", {})[names.GPU_RESOURCE] = str(
                gpus_per_instance(body, role))
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": deployment_name(meta["name"], role),
            "namespace": meta["namespace"],
            "labels": {**selector, names.LABEL_MANAGED_BY: names.MANAGED_BY},
            "ownerReferences": [{"apiVersion": API_VERSION, "kind": "ServingDeployment", "name": meta["name"],
                                 "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {"replicas": replicas, "selector": {"matchLabels": selector}, "template": template},
    }


def plan_serving(body: Body, deployments: Mapping[str, Body], now: float) -> list[Action]:
    """Actions for one ServingDeployment; `deployments` maps role -> its Deployment (if any)."""
    meta, spec, status = body["metadata"], body["spec"], body.get("status") or {}
    replicas, reason = desired_replicas(body)
    gpus = sum(replicas[r] * gpus_per_instance(body, r) for r in ROLES)
    actions: list[Action] = []
    patch: dict[str, Any] = {}
    if status.get("observedGeneration") != meta.get("generation"):
        patch["observedGeneration"] = meta.get("generation")

    if gpus > int(spec["maxGPUs"]):
        why = f"the plan needs {gpus} GPUs, more than spec.maxGPUs={spec['maxGPUs']}"
        if status.get("message") != why:
            patch.update(phase=phases.FAILED, message=why,
                         conditions=set_condition(status, {"type": names.COND_READY, "status": "False",
                                                           "reason": "OverBudget", "message": why}, now))
            actions.append(PostEvent(involved(body), "Warning", "OverBudget", why))
        return [PatchStatus(PLURAL, meta["namespace"], meta["name"], patch)] if patch else []

    for role in ROLES:
        dep = deployments.get(role)
        if dep is None or (dep.get("spec") or {}).get("replicas") != replicas[role]:
            actions.append(ApplyDeployment(deployment(body, role, replicas[role])))
    ready = {r: int(((deployments.get(r) or {}).get("status") or {}).get("readyReplicas") or 0) for r in ROLES}
    all_ready = all(ready[r] >= replicas[r] for r in ROLES)
    phase = phases.READY if all_ready else phases.PROGRESSING
    ratio = f"{replicas[names.ROLE_PREFILL]}:{replicas[names.ROLE_DECODE]}"
    want = {
        "phase": phase,
        "prefillReplicas": replicas[names.ROLE_PREFILL],
        "decodeReplicas": replicas[names.ROLE_DECODE],
        "readyPrefill": ready[names.ROLE_PREFILL],
        "readyDecode": ready[names.ROLE_DECODE],
        "gpus": gpus,
        "ratio": ratio,
        "message": f"{ready[names.ROLE_PREFILL]}/{replicas[names.ROLE_PREFILL]} prefill, "
                   f"{ready[names.ROLE_DECODE]}/{replicas[names.ROLE_DECODE]} decode ready",
    }
    patch.update({k: v for k, v in want.items() if status.get(k) != v})
    if not status.get("lastPlan"):
        patch["lastPlan"] = {"time": rfc3339(now), "reason": reason}
        actions.append(PostEvent(involved(body), "Normal", names.Reason.SCALED,
                                 f"prefill:decode {ratio} on {gpus} GPUs: {reason}"))
    if status.get("phase") != phase:
        cond = ({"type": names.COND_READY, "status": "True", "reason": names.Reason.AVAILABLE,
                 "message": "all instances ready"} if all_ready else
                {"type": names.COND_READY, "status": "False", "reason": names.Reason.PROGRESSING,
                 "message": want["message"]})
        patch["conditions"] = set_condition(status, cond, now)
        if all_ready:
            actions.append(PostEvent(involved(body), "Normal", names.Reason.AVAILABLE,
                                     f"{ratio} prefill:decode instances ready"))
    if patch:
        actions.insert(0, PatchStatus(PLURAL, meta["namespace"], meta["name"], patch))
    return actions
