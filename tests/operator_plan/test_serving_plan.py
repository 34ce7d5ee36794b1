import json

import pytest

from flotilla.allocation import policies
from flotilla.operator import serving
from flotilla.operator.actions import ApplyDeployment, ApplyObject, PatchStatus, PostEvent
from flotilla.operator.reconcile import Planner
from flotilla.pool import PoolPolicy
from flotilla.serving import target as target_module
from flotilla.serving.target import target
from tests.operator_plan.builders import T0, node


def sd(mode="fixed", p=1, d=2, max_gpus=12, status=None):
    pool = lambda n: {"gpusPerInstance": 2, "template": {"spec": {"containers": [{"name": n, "image": "vllm"}]}}}  # noqa: E731
    return {"apiVersion": "flotilla.dev/v1alpha1", "kind": "ServingDeployment",
            "metadata": {"name": "chat", "namespace": "ns", "uid": "u1", "generation": 1},
            "spec": {"slo": {"ttftMs": 400, "tpotMs": 50}, "maxGPUs": max_gpus, "prefill": pool("p"),
                     "decode": pool("d"),
                     "planner": {"mode": mode, "prefillReplicas": p, "decodeReplicas": d}},
            "status": status or {}}


def test_fixed_mode_creates_both_deployments_with_gpu_limits():
    actions = serving.plan_serving(sd(), {}, T0)
    deps = {a.manifest["metadata"]["name"]: a.manifest for a in actions if isinstance(a, ApplyDeployment)}
    assert {k: v["spec"]["replicas"] for k, v in deps.items()} == {"chat-prefill": 1, "chat-decode": 2}
    c = deps["chat-decode"]["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert deps["chat-decode"]["spec"]["selector"]["matchLabels"] == {"flotilla.dev/serving": "chat",
                                                                     "flotilla.dev/role": "decode"}
    st = next(a for a in actions if isinstance(a, PatchStatus)).status
    assert st["ratio"] == "1:2" and st["gpus"] == 6 and st["phase"] == "Progressing"


def test_ready_deployments_make_it_ready_and_a_replica_drift_is_reapplied():
    deps = {r: {"spec": {"replicas": n}, "status": {"readyReplicas": n}} for r, n in (("prefill", 1), ("decode", 2))}
    actions = serving.plan_serving(sd(status={"lastPlan": {"time": "t", "reason": "r"}}), deps, T0)
    assert next(a for a in actions if isinstance(a, PatchStatus)).status["phase"] == "Ready"
    assert not [a for a in actions if isinstance(a, ApplyDeployment)]
    deps["decode"]["spec"]["replicas"] = 5  # someone edited the Deployment by hand
    again = serving.plan_serving(sd(status={"lastPlan": {"time": "t", "reason": "r"}}), deps, T0)
    assert [a.manifest["spec"]["replicas"] for a in again if isinstance(a, ApplyDeployment)] == [2]


def test_the_ready_condition_follows_the_phase_and_available_is_told_once():
    def conditions(actions):
        return {c["type"]: (c["status"], c["reason"])
                for c in next(a for a in actions if isinstance(a, PatchStatus)).status["conditions"]}

    first = serving.plan_serving(sd(), {}, T0)
    assert conditions(first)["Ready"] == ("False", "Progressing")
    deps = {r: {"spec": {"replicas": n}, "status": {"readyReplicas": n}} for r, n in (("prefill", 1), ("decode", 2))}
    progressing = {"lastPlan": {"time": "t", "reason": "r"}, "phase": "Progressing"}
    ready = serving.plan_serving(sd(status=progressing), deps, T0)
    assert conditions(ready)["Ready"] == ("True", "Available")
    assert [a.reason for a in ready if isinstance(a, PostEvent)] == ["Available"]
    again = serving.plan_serving(sd(status={**progressing, "phase": "Ready"}), deps, T0)
    assert not [a for a in again if isinstance(a, PostEvent)]


def test_a_plan_over_max_gpus_is_refused():
    actions = serving.plan_serving(sd(p=2, d=4, max_gpus=8), {}, T0)
    assert not [a for a in actions if isinstance(a, ApplyDeployment)]
    st = next(a for a in actions if isinstance(a, PatchStatus)).status
    assert st["phase"] == "Failed" and "12 GPUs" in st["message"]


def auto_sd(profile="opt-13b-a100", rps=6.0, max_gpus=16, **spec_extra):
    body = sd(mode="auto", max_gpus=max_gpus)
    body["spec"]["planner"] = {"mode": "auto"}
    body["spec"]["workload"] = {"requestsPerSecond": rps, "inputTokens": 512, "outputTokens": 128}
    body["spec"]["slo"] = {"ttftMs": 400, "tpotMs": 100, "attainment": 0.9}
    body["spec"]["profile"] = {"name": profile}
    for role in ("prefill", "decode"):
        body["spec"][role].pop("gpusPerInstance")
    body["spec"].update(spec_extra)
    return body


def test_auto_mode_starts_from_the_pd_planners_plan_for_the_workload_estimate():
    from flotilla.operator.serving import initial_plan

    body = auto_sd()
    expected = initial_plan(body["spec"])
    actions = serving.plan_serving(body, {}, T0)
    deps = {a.manifest["metadata"]["name"]: a.manifest for a in actions if isinstance(a, ApplyDeployment)}
    assert deps["chat-prefill"]["spec"]["replicas"] == expected.prefill_replicas >= 1
    assert deps["chat-decode"]["spec"]["replicas"] == expected.decode_replicas >= 1
    limit = deps["chat-decode"]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    assert limit == str(expected.decode_gpus_per_instance)
    st = next(a for a in actions if isinstance(a, PatchStatus)).status
    assert st["gpus"] == expected.gpus <= 16 and st["predictedGoodput"] >= 6.0
    assert st["lastPlan"]["reason"] == expected.reason and expected.mode == "disaggregated"


def test_auto_mode_without_enough_gpus_says_the_slo_is_at_risk():
    actions = serving.plan_serving(auto_sd(rps=500.0, max_gpus=4), {}, T0)
    st = next(a for a in actions if isinstance(a, PatchStatus)).status
    at_risk = [c for c in st["conditions"] if c["type"] == "SLOAtRisk"]
    assert at_risk and at_risk[0]["status"] == "True" and st["gpus"] <= 4


def test_an_unknown_profile_fails_the_deployment_with_the_field_named():
    actions = serving.plan_serving(auto_sd(profile="no-such-model"), {}, T0)
    assert not [a for a in actions if isinstance(a, ApplyDeployment)]
    st = next(a for a in actions if isinstance(a, PatchStatus)).status
    assert st["phase"] == "Failed" and "profile" in st["message"] and "no-such-model" in st["message"]


def test_a_changed_gpu_limit_on_a_deployment_is_put_back():
    deps = {r: {"spec": {"replicas": n, "template": {"spec": {"containers": [
        {"resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}}, "status": {"readyReplicas": n}}
        for r, n in (("prefill", 1), ("decode", 2))}
    deps["prefill"]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "8"
    actions = serving.plan_serving(sd(status={"lastPlan": {"time": "t", "reason": "r"}}), deps, T0)
    assert [a.manifest["metadata"]["name"] for a in actions if isinstance(a, ApplyDeployment)] == ["chat-prefill"]


def _dep(replicas, gpus, ready=None, planned=None):
    d = {"metadata": {"name": "x", "annotations": {}},
         "spec": {"replicas": replicas, "template": {"spec": {"containers": [
             {"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}},
         "status": {"replicas": replicas, "readyReplicas": replicas if ready is None else ready}}
    if planned is not None:
        d["metadata"]["annotations"]["flotilla.dev/planned-replicas"] = str(planned)
    return d


def test_a_new_plan_shrinks_first_and_grows_only_within_max_gpus():
    # 3 prefill + 1 decode (2 GPUs each) -> 1 prefill + 3 decode on maxGPUs=8: growing decode
    # before prefill has shrunk would hold 12 GPUs.
    status = {"lastPlan": {"time": "t", "reason": "r"}, "ratio": "3:1", "gpus": 8}
    body = sd(p=1, d=3, max_gpus=8, status=status)
    deps = {"prefill": _dep(3, 2, planned=3), "decode": _dep(1, 2, planned=1)}
    actions = serving.plan_serving(body, deps, T0)
    applied = {a.manifest["metadata"]["name"]: a.manifest["spec"]["replicas"]
               for a in actions if isinstance(a, ApplyDeployment)}
    assert applied == {"chat-prefill": 1}
    assert [a.reason for a in actions if isinstance(a, PostEvent)] == ["Scaled"]
    # Once prefill is down to 1 instance, decode may grow.
    deps["prefill"] = _dep(1, 2, planned=1)
    status = {**status, "ratio": "1:3"}
    again = serving.plan_serving(sd(p=1, d=3, max_gpus=8, status=status), deps, T0)
    assert [(a.manifest["metadata"]["name"], a.manifest["spec"]["replicas"])
            for a in again if isinstance(a, ApplyDeployment)] == [("chat-decode", 3)]
    assert not [a for a in again if isinstance(a, PostEvent) and a.reason == "ReplicasReverted"]


def test_a_hand_edit_is_put_back_with_a_warning_that_says_who_owns_the_count():
    status = {"lastPlan": {"time": "t", "reason": "r"}, "ratio": "1:2", "gpus": 6}
    deps = {"prefill": _dep(1, 2, planned=1), "decode": _dep(5, 2, planned=2)}
    actions = serving.plan_serving(sd(status=status), deps, T0)
    assert [a.manifest["spec"]["replicas"] for a in actions if isinstance(a, ApplyDeployment)] == [2]
    [warning] = [a for a in actions if isinstance(a, PostEvent) and a.reason == "ReplicasReverted"]
    assert warning.type == "Warning" and "by hand to 5" in warning.message and "spec.planner" in warning.message


def observed(rps):
    return {"flotilla.dev/observed": json.dumps({"requestsPerSecond": rps, "attainment": 0.8})}


def test_slo_at_risk_follows_the_observed_rate_against_the_plans_goodput():
    base = {"lastPlan": {"time": "t", "reason": "r"}, "ratio": "1:2", "gpus": 6}
    body = sd(mode="auto", status=base)
    body["spec"]["planner"] = {"mode": "auto"}
    body["spec"]["plan"] = {"prefillReplicas": 1, "decodeReplicas": 2, "predictedGoodput": 8.0, "reason": "r"}
    body["metadata"]["annotations"] = observed(12.0)
    actions = serving.plan_serving(body, {}, T0)
    st = next(a for a in actions if isinstance(a, PatchStatus)).status
    [risk] = [c for c in st["conditions"] if c["type"] == "SLOAtRisk"]
    assert risk["status"] == "True" and "12.00 req/s observed" in risk["message"]
    assert [a.type for a in actions if isinstance(a, PostEvent) and a.reason == "SLOAtRisk"] == ["Warning"]
    # The load falls under what the plan serves: the condition goes False, without a new Warning.
    body["status"] = {**base, "conditions": st["conditions"]}
    body["metadata"]["annotations"] = observed(5.0)
    again = serving.plan_serving(body, {}, T0)
    st = next(a for a in again if isinstance(a, PatchStatus)).status
    assert [c["status"] for c in st["conditions"] if c["type"] == "SLOAtRisk"] == ["False"]
    assert not [a for a in again if isinstance(a, PostEvent) and a.reason == "SLOAtRisk"]


def test_auto_mode_deploys_spec_plan_never_status_and_mirrors_it_into_status():
    body = auto_sd()
    body["spec"]["plan"] = {"prefillReplicas": 3, "decodeReplicas": 5, "prefillGPUsPerInstance": 1,
                            "decodeGPUsPerInstance": 2, "predictedGoodput": 20.5, "reason": "scale up: 18 req/s",
                            "time": "2027-01-15T08:00:00Z"}
    # A status that says something else (an older writer's, or a restored backup) is a report, not intent.
    body["status"] = {"prefillReplicas": 9, "decodeReplicas": 9, "lastPlan": {"time": "t", "reason": "old"}}
    actions = serving.plan_serving(body, {}, T0)
    deps = {a.manifest["metadata"]["name"]: a.manifest for a in actions if isinstance(a, ApplyDeployment)}
    assert {k: v["spec"]["replicas"] for k, v in deps.items()} == {"chat-prefill": 3, "chat-decode": 5}
    limit = deps["chat-decode"]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    assert limit == "2"
    st = next(a for a in actions if isinstance(a, PatchStatus)).status
    assert (st["prefillReplicas"], st["decodeReplicas"], st["gpus"], st["predictedGoodput"]) == (3, 5, 13, 20.5)
    assert st["lastPlan"] == {"time": "2027-01-15T08:00:00Z", "reason": "scale up: 18 req/s"}
    # The user changes another spec field (kubectl apply of a manifest without spec.plan): the plan holds.
    body["spec"]["slo"]["attainment"] = 0.95
    assert serving.target(body["spec"]).replicas == {"prefill": 3, "decode": 5}
    # In fixed mode spec.plan is ignored.
    body["spec"]["planner"] = {"mode": "fixed", "prefillReplicas": 1, "decodeReplicas": 1}
    assert serving.target(body["spec"]).replicas == {"prefill": 1, "decode": 1}


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]", json.dumps({"requestsPerSecond": -1, "attainment": 7,
                                                                    "ttftP90Ms": "fast", "extra": 1e9})])
def test_a_malformed_observed_annotation_is_not_mirrored(raw):
    body = auto_sd()
    body["metadata"]["annotations"] = {"flotilla.dev/observed": raw}
    st = next(a for a in serving.plan_serving(body, {}, T0) if isinstance(a, PatchStatus)).status
    assert "observed" not in st


def test_the_observed_mirror_deletes_the_fields_that_went():
    body = auto_sd()
    body["metadata"]["annotations"] = {"flotilla.dev/observed": json.dumps({"requestsPerSecond": 4.0})}
    body["status"] = {"observed": {"requestsPerSecond": 6.0, "ttftP90Ms": 120.0}}
    st = next(a for a in serving.plan_serving(body, {}, T0) if isinstance(a, PatchStatus)).status
    assert st["observed"] == {"requestsPerSecond": 4.0, "ttftP90Ms": None}  # merge patch: null deletes
    body["status"] = {**body["status"], **st, "observed": {"requestsPerSecond": 4.0}}
    again = [a for a in serving.plan_serving(body, {}, T0) if isinstance(a, PatchStatus)]
    assert not again or "observed" not in again[0].status


def test_the_endpoint_is_a_service_per_pool_with_llm_d_role_labels_and_the_pool_when_its_crd_is_there():
    actions = serving.plan_serving(sd(), {}, T0)
    objects = {(a.manifest["kind"], a.manifest["metadata"]["name"]): a.manifest
               for a in actions if isinstance(a, ApplyObject)}
    assert set(objects) == {("Service", "chat-prefill"), ("Service", "chat-decode")}  # no CRD, no InferencePool
    decode = objects["Service", "chat-decode"]
    assert decode["spec"]["selector"] == {"flotilla.dev/serving": "chat", "flotilla.dev/role": "decode"}
    assert decode["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": 8000, "protocol": "TCP"}]
    assert decode["metadata"]["ownerReferences"][0]["uid"] == "u1"
    deps = {a.manifest["metadata"]["name"]: a.manifest for a in actions if isinstance(a, ApplyDeployment)}
    for role in ("prefill", "decode"):
        labels = deps[f"chat-{role}"]["spec"]["template"]["metadata"]["labels"]
        assert labels["llm-d.ai/role"] == role and labels["llm-d.ai/inference-serving"] == "true"
        # the selector stays what it was: a Deployment's selector cannot change
        assert "llm-d.ai/role" not in deps[f"chat-{role}"]["spec"]["selector"]["matchLabels"]
    st = next(a for a in actions if isinstance(a, PatchStatus)).status
    assert st["endpoint"] == "http://chat-decode.ns.svc:8000" and "inferencePool" not in st

    body = sd()
    body["spec"]["endpoint"] = {"port": 9000, "endpointPicker": {"name": "llm-d-epp"}}
    with_pool = serving.plan_serving(body, {}, T0, inference_pools=True)
    [pool] = [a.manifest for a in with_pool if isinstance(a, ApplyObject) and a.manifest["kind"] == "InferencePool"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1" and pool["metadata"]["name"] == "chat"
    assert pool["spec"] == {"selector": {"matchLabels": {"flotilla.dev/serving": "chat",
                                                         "llm-d.ai/inference-serving": "true"}},
                            "targetPorts": [{"number": 9000}],
                            "endpointPickerRef": {"kind": "Service", "name": "llm-d-epp", "port": {"number": 9002}}}
    st = next(a for a in with_pool if isinstance(a, PatchStatus)).status
    assert st["endpoint"] == "http://chat-decode.ns.svc:9000" and st["inferencePool"] == "chat"


def test_service_names_are_dns_labels_for_any_serving_name():
    from flotilla.resources.names import service_name

    assert service_name("chat", "decode") == "chat-decode"
    for odd in ("1chat", "a.b", "x" * 70):
        name = service_name(odd, "prefill")
        assert len(name) <= 63 and name[0].isalpha() and name.endswith("-prefill")
        assert set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")
    assert service_name("a.b", "decode") != service_name("a-b", "decode")


def test_an_endpoint_object_applied_a_moment_ago_is_not_sent_again_until_the_relist_period_passes():
    from flotilla.operator.view import View

    view = View()
    [service, *_] = [a.manifest for a in serving.plan_serving(sd(), {}, T0) if isinstance(a, ApplyObject)]
    assert not view.applied_recently(service, 100.0, ttl=60)
    view.applied(service, 100.0)
    assert view.applied_recently(service, 159.0, ttl=60)
    assert not view.applied_recently(service, 161.0, ttl=60)  # applied again: one deleted by hand comes back
    changed = {**service, "spec": {**service["spec"], "ports": [{"name": "http", "port": 9000}]}}
    assert not view.applied_recently(changed, 101.0, ttl=60)  # a different manifest goes at once


def target_spec(**extra):
    template = {"spec": {"containers": [{"name": "vllm", "image": "vllm"}]}}
    return {"slo": {"ttftMs": 400, "tpotMs": 100, "attainment": 0.9},
            "workload": {"requestsPerSecond": 6, "inputTokens": 512, "outputTokens": 128},
            "profile": {"name": "opt-13b-a100"}, "maxGPUs": 16,
            "prefill": {"template": template}, "decode": {"template": template},
            "planner": {"mode": "auto"}, **extra}


def test_a_pass_makes_each_target_once_per_spec_for_the_pool_and_the_deployments(monkeypatch):
    calls = []
    real = target_module.plan
    monkeypatch.setattr(target_module, "plan", lambda request: calls.append(request) or real(request))
    body = {"apiVersion": "flotilla.dev/v1alpha1", "kind": "ServingDeployment",
            "metadata": {"name": "chat", "namespace": "ns", "uid": "u1", "generation": 1}, "spec": target_spec(),
            "status": {}}
    planner, allocator = Planner(), policies.get("elastic-deadline")
    nodes = {"n0": node("n0", 8), "n1": node("n1", 8)}
    first = planner.plan(T0, allocator, {}, nodes, {}, {"ns/chat": body}, {}, pool=PoolPolicy())
    assert len(calls) == 1  # the arbiter's demand and the Deployments: one Target
    replicas = {a.manifest["metadata"]["name"]: a.manifest["spec"]["replicas"]
                for _, _, acts in first for a in acts if isinstance(a, ApplyDeployment)}
    wanted = target(body["spec"])
    assert replicas == {"chat-prefill": wanted.replicas["prefill"], "chat-decode": wanted.replicas["decode"]}
    calls.clear()
    planner.plan(T0 + 1, allocator, {}, nodes, {}, {"ns/chat": {**body, "status": {"phase": "Progressing"}}}, {},
                 pool=PoolPolicy())
    assert calls == []  # the same spec: the same Target
    changed = {**body, "spec": target_spec(workload={"requestsPerSecond": 12, "inputTokens": 512, "outputTokens": 128})}
    planner.plan(T0 + 2, allocator, {}, nodes, {}, {"ns/chat": changed}, {}, pool=PoolPolicy())
    assert len(calls) == 1
