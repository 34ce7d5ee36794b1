"""ServingDeployments: from their Target to prefill/decode Deployments and the status. Pure.

The replica counts are decided in `flotilla.serving.target` (fixed by the spec, the controller's `spec.plan` in
auto mode, else the PD planner's first plan for spec.workload); the reconcile pass makes each Target once and
hands it here and to the pool. The operator never writes the plan, and is the one writer of status, where it
mirrors the plan it acts on and the controller's observed-load annotation.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Mapping

from flotilla import API_VERSION
from flotilla.operator import endpoint
from flotilla.operator.actions import Action, ApplyDeployment, ApplyObject, PatchStatus, PostEvent, involved
from flotilla.operator.training import ref, set_condition
from flotilla.resources.parse import rfc3339
from flotilla.resources import names, phases
from flotilla.serving.spec import observed_from_annotation
from flotilla.serving.target import ROLES, Target, fit, initial_plan, target

__all__ = ["Target", "fit", "initial_plan", "target", "plan_serving", "deployment", "ServingGrant"]

Body = Mapping[str, Any]
PLURAL = "servingdeployments"


def deployment_name(sd: str, role: str) -> str:
    return f"{sd}-{role}"


def last_plan(body: Body, want: Target, now: float) -> dict[str, str]:
    """status.lastPlan: the time and reason of the plan acted on (spec.plan's, else kept while the reason
    is the same, else now)."""
    spec, status = body["spec"], body.get("status") or {}
    old = status.get("lastPlan") or {}
    planned = (spec.get("plan") or {}).get("time") if (spec.get("planner") or {}).get("mode", "auto") == "auto" \
        else None
    return {"time": planned or (old.get("time") if old.get("reason") == want.reason else None) or rfc3339(now),
            "reason": want.reason[:1024]}


def deployment(body: Body, role: str, replicas: int, gpus_per_instance: int) -> dict[str, Any]:
    meta, pool = body["metadata"], body["spec"][role]
    template = copy.deepcopy(pool["template"])
    t_meta = template.setdefault("metadata", {})
    selector = {names.LABEL_SERVING: meta["name"], names.LABEL_ROLE: role}
    t_meta["labels"] = {**(t_meta.get("labels") or {}), **selector, **endpoint.pod_labels(role),
                        names.LABEL_MANAGED_BY: names.MANAGED_BY}
    pod_spec = template["spec"]
    pod_spec.setdefault("tolerations", []).append(
        {"key": names.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    env = [{"name": "FLOTILLA_SERVING", "value": meta["name"]}, {"name": "FLOTILLA_ROLE", "value": role}]
    for i, c in enumerate(pod_spec["containers"]):
        c.setdefault("env", []).extend(env)
        if i == 0:
            c.setdefault("resources", {}).setdefault("limits", {})[names.GPU_RESOURCE] = str(gpus_per_instance)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": deployment_name(meta["name"], role),
            "namespace": meta["namespace"],
            "labels": {**selector, names.LABEL_MANAGED_BY: names.MANAGED_BY},
            "annotations": {names.ANNOTATION_PLANNED_REPLICAS: str(replicas)},
            "ownerReferences": [{"apiVersion": API_VERSION, "kind": "ServingDeployment", "name": meta["name"],
                                 "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {"replicas": replicas, "selector": {"matchLabels": selector}, "template": template},
    }


@dataclass(frozen=True)
class ServingGrant:
    """What the unified pool gives one ServingDeployment, and how much of it may be used now."""

    gpus: int  # granted: the planner's demand, or less when short, or more through a hold-down
    budget: int  # GPUs its Deployments may hold now: the grant, or less until training has freed them
    demanded: int
    reason: str
    below_since: float | None
    peak: tuple[int, float]  # the highest demand within the forecast window, and since when
    borrowed: Mapping[str, int] = field(default_factory=dict)  # job key -> GPUs it lent and has not got back

    def status(self) -> dict[str, Any]:
        """status.pool; belowSince null (deleted by the merge patch) when demand is not below holdings."""
        return {"grantedGPUs": self.gpus, "demandedGPUs": self.demanded, "reason": self.reason[:1024],
                "peakGPUs": self.peak[0], "peakAt": rfc3339(self.peak[1]),
                "belowSince": rfc3339(self.below_since) if self.below_since is not None else None}


class _StatusPatch:
    """One ServingDeployment's status patch as it is built: only what differs from status."""

    def __init__(self, body: Body, now: float) -> None:
        self.body, self.now = body, now
        self.meta, self.status = body["metadata"], body.get("status") or {}
        self.patch: dict[str, Any] = {}

    def condition(self, type_: str, state: str, reason: str, message: str) -> None:
        base = {"conditions": self.patch.get("conditions", self.status.get("conditions"))}
        self.patch["conditions"] = set_condition(base, {"type": type_, "status": state, "reason": reason,
                                                        "message": message}, self.now)

    def action(self) -> PatchStatus:
        return PatchStatus(PLURAL, self.meta["namespace"], self.meta["name"], self.patch)


def plan_serving(body: Body, deployments: Mapping[str, Body], now: float,
                 grant: ServingGrant | None = None, inference_pools: bool = False,
                 want: Target | ValueError | None = None) -> list[Action]:
    """Actions for one ServingDeployment; `deployments` maps role -> its Deployment (if any); `want`: its
    `target` as the pass made it (or the ValueError it raised), else made here.
    With a `grant` from the unified pool, the Deployments hold at most `grant.budget` GPUs, and are
    not shrunk while the grant keeps more than the plan (the pool's hold-down). The endpoint's objects
    (flotilla.operator.endpoint) are applied on every pass, an InferencePool too when `inference_pools`
    (its CRD is installed): the caller skips those it applied unchanged a moment ago."""
    meta, spec = body["metadata"], body["spec"]
    observed = observed_from_annotation((meta.get("annotations") or {}).get(names.ANNOTATION_OBSERVED)) or None
    out = _StatusPatch(body, now)
    if out.status.get("observedGeneration") != meta.get("generation"):
        out.patch["observedGeneration"] = meta.get("generation")
    if want is None:
        try:
            want = target(spec)
        except ValueError as e:
            want = e
    if isinstance(want, ValueError):
        return _refuse(out, names.Reason.NO_PLAN, f"the planner found no plan: {want}")
    if want.gpus > int(spec["maxGPUs"]):
        return _refuse(out, names.Reason.OVER_BUDGET,
                       f"the plan needs {want.gpus} GPUs, more than spec.maxGPUs={spec['maxGPUs']}")

    actions: list[Action] = [ApplyObject(m) for m in endpoint.objects(body, inference_pools)]
    budget, deploy = int(spec["maxGPUs"]), want
    if grant is not None:
        budget, deploy = min(budget, grant.budget), fit(want, grant.budget)
        actions.extend(_record_grant(out, grant))
    holding = grant is not None and grant.gpus > want.gpus
    actions.extend(_deployment_changes(body, deployments, deploy, out.status, budget, shrink=not holding))
    actions.extend(_plan_change_events(out, want))
    ready = {r: int(((deployments.get(r) or {}).get("status") or {}).get("readyReplicas") or 0) for r in ROLES}
    desired = _desired_status(body, want, deploy, ready, grant, inference_pools, now)
    out.patch.update({k: v for k, v in desired.items() if out.status.get(k) != v})
    _mirror_observed(out, observed)
    actions.extend(_slo_condition(out, want, observed, grant))
    actions.extend(_ready_condition(out, want, desired["phase"], desired["message"]))
    if out.patch:
        actions.insert(0, out.action())
    return actions


def _refuse(out: _StatusPatch, reason: str, why: str) -> list[Action]:
    """No plan to deploy: Failed, with the reason (once)."""
    actions: list[Action] = []
    if out.status.get("message") != why:
        out.patch.update(phase=phases.FAILED, message=why)
        out.condition(names.COND_READY, "False", reason, why)
        actions.append(PostEvent(involved(out.body), "Warning", reason, why))
    return [out.action(), *actions] if out.patch else []


def _record_grant(out: _StatusPatch, grant: ServingGrant) -> list[Action]:
    """status.pool and status.borrowedFrom from the pool's grant; an Event per lender whose loan changed."""
    pool = grant.status()
    if out.status.get("pool") != {k: v for k, v in pool.items() if v is not None}:
        out.patch["pool"] = pool
    if {e["job"]: int(e["gpus"]) for e in out.status.get("borrowedFrom") or []} != dict(grant.borrowed):
        out.patch["borrowedFrom"] = [{"job": k, "gpus": g} for k, g in sorted(grant.borrowed.items())]
        return _loan_events(out.body, grant.borrowed, out.status)
    return []


def _plan_change_events(out: _StatusPatch, want: Target) -> list[Action]:
    """Scaled: the first plan, or a prefill:decode ratio that changed."""
    status = out.status
    if not status.get("lastPlan"):
        return [PostEvent(involved(out.body), "Normal", names.Reason.SCALED,
                          f"prefill:decode {want.ratio} on {want.gpus} GPUs: {want.reason}")]
    if status.get("ratio") not in (None, want.ratio):
        return [PostEvent(involved(out.body), "Normal", names.Reason.SCALED,
                          f"prefill:decode {status.get('ratio')} -> {want.ratio} on {want.gpus} GPUs: "
                          f"{want.reason}")]
    return []


def _desired_status(body: Body, want: Target, deploy: Target, ready: Mapping[str, int], grant: ServingGrant | None,
                    inference_pools: bool, now: float) -> dict[str, Any]:
    """The status fields the plan and the Deployments' readiness determine."""
    all_ready = all(ready[r] >= want.replicas[r] for r in ROLES)
    desired: dict[str, Any] = {
        "phase": phases.READY if all_ready else phases.PROGRESSING,
        "prefillReplicas": want.replicas[names.ROLE_PREFILL],
        "decodeReplicas": want.replicas[names.ROLE_DECODE],
        "prefillGPUsPerInstance": want.gpus_per_instance[names.ROLE_PREFILL],
        "decodeGPUsPerInstance": want.gpus_per_instance[names.ROLE_DECODE],
        "readyPrefill": ready[names.ROLE_PREFILL],
        "readyDecode": ready[names.ROLE_DECODE],
        "gpus": want.gpus,
        "ratio": want.ratio,
        "endpoint": endpoint.url(body),
        "message": f"{ready[names.ROLE_PREFILL]}/{want.replicas[names.ROLE_PREFILL]} prefill, "
                   f"{ready[names.ROLE_DECODE]}/{want.replicas[names.ROLE_DECODE]} decode ready"
                   + (f"; {deploy.gpus} of {want.gpus} GPUs granted now: {grant.reason}"
                      if deploy is not want and grant is not None else ""),
    }
    if inference_pools:
        desired["inferencePool"] = body["metadata"]["name"]
    if want.predicted_goodput is not None:
        desired["predictedGoodput"] = round(float(want.predicted_goodput), 3)
    desired["lastPlan"] = last_plan(body, want, now)
    return desired


def _mirror_observed(out: _StatusPatch, observed: Mapping[str, float] | None) -> None:
    """status.observed: the controller's observed-load annotation, as it is now."""
    if (out.status.get("observed") or None) != observed:
        # a merge patch keeps keys it does not name: name the ones that went (null deletes them)
        out.patch["observed"] = {**{k: None for k in out.status.get("observed") or {}}, **observed} \
            if observed else None


def _slo_condition(out: _StatusPatch, want: Target, observed: Mapping[str, float] | None,
                   grant: ServingGrant | None) -> list[Action]:
    """SLOAtRisk: set when the plan (or the pool's grant) cannot serve the load; cleared once it can."""
    at_risk, why = _slo_at_risk(want, observed)
    if grant is not None and grant.gpus < want.gpus and not at_risk:
        at_risk, why = True, f"the pool grants {grant.gpus} of the {want.gpus} GPUs the plan needs: {grant.reason}"
    was = next((c.get("status") for c in out.status.get("conditions") or []
                if c.get("type") == names.COND_SLO_AT_RISK), None)
    if was == ("True" if at_risk else "False") or not (at_risk or was is not None):
        return []
    out.condition(names.COND_SLO_AT_RISK, "True" if at_risk else "False",
                  names.Reason.SLO_AT_RISK if at_risk else names.Reason.SLO_MET, why)
    return [PostEvent(involved(out.body), "Warning", names.Reason.SLO_AT_RISK, why)] if at_risk else []


def _ready_condition(out: _StatusPatch, want: Target, phase: str, message: str) -> list[Action]:
    """Ready: True (and an Event) when every instance became ready, False while some are not."""
    if out.status.get("phase") == phase:
        return []
    if phase == phases.READY:
        out.condition(names.COND_READY, "True", names.Reason.AVAILABLE, "all instances ready")
        return [PostEvent(involved(out.body), "Normal", names.Reason.AVAILABLE,
                          f"{want.ratio} prefill:decode instances ready")]
    out.condition(names.COND_READY, "False", names.Reason.PROGRESSING, message)
    return []


def _slo_at_risk(want: Target, observed_load: Mapping[str, float] | None) -> tuple[bool, str]:
    """At risk when the plan cannot serve the rate it was made for within maxGPUs: the planner says so
    for the first plan; afterwards, the observed rate exceeds the plan's predicted goodput."""
    observed = float((observed_load or {}).get("requestsPerSecond") or 0.0)
    goodput = float(want.predicted_goodput or 0.0)
    if observed and goodput and observed > goodput:
        return True, (f"the plan within maxGPUs serves {goodput:.2f} req/s within the SLO; "
                      f"{observed:.2f} req/s observed")
    if want.slo_at_risk and not observed:
        return True, want.reason
    return False, f"the plan serves {goodput:.2f} req/s within the SLO" if goodput else "no risk seen"


def _deployment_gpus(dep: Body | None) -> tuple[int, int]:
    """(instances that exist or are wanted, GPUs per instance) of a Deployment as it is now."""
    if dep is None:
        return 0, 0
    spec, status = dep.get("spec") or {}, dep.get("status") or {}
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or [{}]
    limit = ((containers[0].get("resources") or {}).get("limits") or {}).get(names.GPU_RESOURCE, 0)
    return max(int(spec.get("replicas") or 0), int(status.get("replicas") or 0)), int(str(limit))


def _deployment_changes(body: Body, deployments: Mapping[str, Body], want: Target,
                        status: Mapping[str, Any], budget: int, shrink: bool = True) -> list[Action]:
    """Deployment updates that move toward the plan without ever holding more than `budget` GPUs:
    shrinking roles at once (unless `shrink` is off); a growing role only once the pods that exist
    now (a shrinking role's old pods hold their GPUs until they are gone), plus its growth, fit."""
    held = {r: _deployment_gpus(deployments.get(r)) for r in ROLES}
    in_use = sum(n * g for n, g in held.values())
    changes: list[Action] = []
    growing = []
    for role in ROLES:
        dep = deployments.get(role)
        if dep is not None and not _drifted(dep, want.replicas[role], want.gpus_per_instance[role]):
            continue
        after = want.replicas[role] * want.gpus_per_instance[role]
        if after > held[role][0] * held[role][1]:
            growing.append(role)
            continue
        if not shrink and dep is not None and after < held[role][0] * held[role][1]:
            continue
        changes.append(ApplyDeployment(deployment(body, role, want.replicas[role], want.gpus_per_instance[role])))
    for role in growing:
        after = want.replicas[role] * want.gpus_per_instance[role]
        now_role = held[role][0] * held[role][1]
        if in_use - now_role + after <= budget:
            in_use += after - now_role
            changes.append(ApplyDeployment(deployment(body, role, want.replicas[role], want.gpus_per_instance[role])))
    owner = ("spec.planner" if (body["spec"].get("planner") or {}).get("mode") == "fixed"
             else "the planner (auto mode)")
    for role in ROLES:
        dep = deployments.get(role)
        if dep is not None and _edited_by_hand(dep):
            changes.append(PostEvent(involved(body), "Warning", names.Reason.REPLICAS_REVERTED,
                                     f"{dep['metadata']['name']} was scaled by hand to {dep['spec'].get('replicas')}; "
                                     f"putting back {want.replicas[role]}: {owner} owns the replica count"))
    return changes


def _loan_events(body: Body, borrowed: Mapping[str, int], status: Mapping[str, Any]) -> list[Action]:
    """An Event naming each lender whose loan to this ServingDeployment changed."""
    before = {e["job"]: int(e["gpus"]) for e in status.get("borrowedFrom") or []}
    ns = body["metadata"]["namespace"]
    out: list[Action] = []
    for job in sorted(set(before) | set(borrowed)):
        was, now = before.get(job, 0), borrowed.get(job, 0)
        lender = ref("tj", job, ns)
        if now > was:
            out.append(PostEvent(involved(body), "Normal", names.Reason.BORROWED_GPUS,
                                 f"borrowed {now - was} GPUs from {lender} ({now} in all)"))
        elif now < was:
            out.append(PostEvent(involved(body), "Normal", names.Reason.RETURNED_GPUS,
                                 f"returned {was - now} GPUs to {lender}" + (f" ({now} still borrowed)" if now else "")))
    return out


def _edited_by_hand(dep: Body) -> bool:
    planned = ((dep.get("metadata") or {}).get("annotations") or {}).get(names.ANNOTATION_PLANNED_REPLICAS)
    return planned is not None and str((dep.get("spec") or {}).get("replicas")) != planned


def _drifted(dep: Body, replicas: int, gpus_per_instance: int) -> bool:
    """True when the Deployment's replicas or GPU limit differ from the plan (e.g. a manual edit)."""
    if (dep.get("spec") or {}).get("replicas") != replicas:
        return True
    containers = (((dep.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or [{}]
    limit = ((containers[0].get("resources") or {}).get("limits") or {}).get(names.GPU_RESOURCE)
    return limit is not None and str(limit) != str(gpus_per_instance)
