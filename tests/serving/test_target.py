"""flotilla.serving.target: the one place a ServingDeployment's replica counts are decided."""

from __future__ import annotations

import pytest

from flotilla.serving.planner import plan
from flotilla.serving.spec import plan_request
from flotilla.serving.target import Target, deployed, fit, target

TEMPLATE = {"spec": {"containers": [{"name": "vllm", "image": "vllm"}]}}


def auto_spec(**extra):
    return {"slo": {"ttftMs": 400, "tpotMs": 100, "attainment": 0.9},
            "workload": {"requestsPerSecond": 6, "inputTokens": 512, "outputTokens": 128},
            "profile": {"name": "opt-13b-a100"}, "maxGPUs": 16,
            "prefill": {"template": TEMPLATE}, "decode": {"template": TEMPLATE},
            "planner": {"mode": "auto"}, **extra}


def test_fixed_mode_is_the_specs_counts():
    spec = {**auto_spec(), "planner": {"mode": "fixed", "prefillReplicas": 2, "decodeReplicas": 3},
            "decode": {"template": TEMPLATE, "gpusPerInstance": 2}}
    got = target(spec)
    assert (got.replicas, got.gpus_per_instance, got.gpus, got.ratio) == (
        {"prefill": 2, "decode": 3}, {"prefill": 1, "decode": 2}, 8, "2:3")


def test_auto_mode_is_the_controllers_plan_else_the_planners_first():
    first = plan(plan_request(auto_spec()))
    got = target(auto_spec())
    assert (got.replicas["prefill"], got.replicas["decode"]) == (first.prefill_replicas, first.decode_replicas)
    assert got.reason == first.reason
    replanned = auto_spec(plan={"prefillReplicas": 4, "decodeReplicas": 6, "reason": "scale up", "time": "t"})
    assert target(replanned).replicas == {"prefill": 4, "decode": 6} and target(replanned).reason == "scale up"


def test_a_spec_the_planner_cannot_plan_raises_with_the_field_named():
    with pytest.raises(ValueError, match="profile"):
        target(auto_spec(profile={"name": "no-such-model"}))


def test_deployed_reads_spec_plan_then_status_and_none_before_the_first_plan():
    assert deployed(auto_spec(), {}) is None
    status = {"prefillReplicas": 1, "decodeReplicas": 2, "lastPlan": {"reason": "first"}}
    assert (deployed(auto_spec(), status).prefill_replicas, deployed(auto_spec(), status).decode_replicas) == (1, 2)
    spec = auto_spec(plan={"prefillReplicas": 3, "decodeReplicas": 5})
    assert (deployed(spec, status).prefill_replicas, deployed(spec, status).decode_replicas) == (3, 5)


def test_fit_keeps_the_ratio_within_the_gpus_granted():
    want = Target({"prefill": 2, "decode": 4}, {"prefill": 2, "decode": 2}, "plan")
    assert fit(want, 12) is want
    assert fit(want, 6).replicas == {"prefill": 1, "decode": 2}
