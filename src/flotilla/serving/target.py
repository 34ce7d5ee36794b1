"""The replica counts a ServingDeployment runs: the one place they are decided. Pure.

`target(spec)` says which plan applies. In `fixed` mode (spec.planner) it is the spec's counts. In `auto` mode it
is the controller's re-plan in spec.plan, which `flotilla.serving.replan` decides from observed load, else the
PD planner's first plan for spec.workload. `fit` trims a target to the GPUs the unified pool grants now.

The operator makes each ServingDeployment's Target once per pass. Its pool glue (the arbiter's demand) and the
Deployments and status (`flotilla.operator.serving`) read that same Target. The controller's re-planner starts
from `deployed`: the plan the object shows it acts on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from flotilla.resources.names import ROLE_DECODE, ROLE_PREFILL
from flotilla.serving.planner import Plan, plan
from flotilla.serving.spec import plan_from_spec, plan_from_status, plan_request

ROLES = (ROLE_PREFILL, ROLE_DECODE)
Spec = Mapping[str, Any]


@dataclass(frozen=True)
class Target:
    """What the Deployments should be: instances and GPUs per instance per role, and why."""

    replicas: dict[str, int]
    gpus_per_instance: dict[str, int]
    reason: str
    predicted_goodput: float | None = None
    slo_at_risk: bool = False

    @property
    def gpus(self) -> int:
        return sum(self.replicas[r] * self.gpus_per_instance[r] for r in ROLES)

    @property
    def ratio(self) -> str:
        return f"{self.replicas[ROLE_PREFILL]}:{self.replicas[ROLE_DECODE]}"


def _pinned(spec: Spec, role: str) -> int | None:
    value = spec[role].get("gpusPerInstance")
    return int(value) if value else None


def initial_plan(spec: Spec) -> Plan:
    """The PD planner's plan for the spec's workload estimate (auto mode, before any observation).
    Raises ValueError (ProfileError included) with the field named."""
    return plan(plan_request(spec))


def _of_plan(p: Plan, reason: str, goodput: float | None, at_risk: bool = False) -> Target:
    return Target({ROLE_PREFILL: p.prefill_replicas, ROLE_DECODE: p.decode_replicas},
                  {ROLE_PREFILL: p.prefill_gpus_per_instance, ROLE_DECODE: p.decode_gpus_per_instance},
                  reason, goodput, at_risk)


def target(spec: Spec) -> Target:
    """`fixed` mode: the spec's counts. `auto` mode: the controller's plan in spec.plan (re-planned from
    observed load), else the PD planner's plan for spec.workload. Raises ValueError with the field named."""
    planner = spec.get("planner") or {}
    if planner.get("mode", "auto") == "fixed":
        return Target({ROLE_PREFILL: int(planner["prefillReplicas"]), ROLE_DECODE: int(planner["decodeReplicas"])},
                      {r: _pinned(spec, r) or 1 for r in ROLES}, "fixed by spec.planner")
    p = plan_from_spec(spec)
    if p is not None:
        return _of_plan(p, p.reason or "spec.plan", p.predicted_goodput or None)
    p = initial_plan(spec)
    return _of_plan(p, p.reason, p.predicted_goodput, p.slo_at_risk)


def deployed(spec: Spec, status: Mapping[str, Any]) -> Plan | None:
    """The plan the object shows the operator acts on (auto mode): spec.plan, else the first plan the operator
    reports in status; None before the operator made one."""
    return plan_from_spec(spec) or plan_from_status(status)


def fit(want: Target, gpus: int) -> Target:
    """The largest plan within `gpus` that keeps the prefill:decode ratio as close as it can
    (the smaller of the two roles' fractions of the plan first, then the GPUs used)."""
    if want.gpus <= gpus:
        return want
    p, d = want.replicas[ROLE_PREFILL], want.replicas[ROLE_DECODE]
    gp, gd = want.gpus_per_instance[ROLE_PREFILL], want.gpus_per_instance[ROLE_DECODE]

    def score(option: tuple[int, int]) -> tuple[float, int]:
        i, j = option
        return min(i / p if p else 1.0, j / d if d else 1.0), i * gp + j * gd

    i, j = max(((i, min(d, (gpus - i * gp) // gd)) for i in range(p + 1) if i * gp <= gpus), key=score)
    return Target({ROLE_PREFILL: i, ROLE_DECODE: j}, dict(want.gpus_per_instance), want.reason,
                  want.predicted_goodput, want.slo_at_risk)
