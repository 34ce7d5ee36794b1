"""SLO-driven serving on a real API server: the controller re-plans from pushed statistics, the operator follows."""

from __future__ import annotations

import json
import time

import pytest

from e2e.kube import LoadDriver, apply, controller_api, get, items, kubectl, wait_for

INTERVAL = 5
SCALE_DOWN_AFTER = 15


@pytest.fixture(scope="module")
def controller(log_dir, tmp_path_factory):
    with controller_api(log_dir, tmp_path_factory.mktemp("serving-controller"),
                        "--scale-down-after", str(SCALE_DOWN_AFTER), "--peak-memory", str(SCALE_DOWN_AFTER)) as api:
        yield api


def test_the_pd_ratio_follows_the_load_up_fast_and_down_slowly_without_flapping(operator, controller, namespace):
    body = {"apiVersion": "flotilla.dev/v1alpha1", "kind": "ServingDeployment", "metadata": {"name": "chat"},
            "spec": {"slo": {"ttftMs": 400, "tpotMs": 100, "attainment": 0.9},
                     "workload": {"requestsPerSecond": 6, "inputTokens": 512, "outputTokens": 128},
                     "profile": {"name": "opt-13b-a100"}, "maxGPUs": 16,
                     "planner": {"mode": "auto", "intervalSeconds": INTERVAL},
                     "prefill": {"template": {"spec": {"containers": [{"name": "p", "image": "vllm/vllm-openai"}]}}},
                     "decode": {"template": {"spec": {"containers": [{"name": "d", "image": "vllm/vllm-openai"}]}}}}}
    assert apply(json.dumps(body), namespace).returncode == 0

    def status():
        return (get("servingdeployment", "chat", namespace) or {}).get("status", {})

    first = wait_for("chat Ready", lambda: (s := status()).get("phase") == "Ready" and s, timeout=60)
    wait_for("the controller mirrors chat", lambda: controller.get(f"/v1/serving/{namespace}/chat").status_code == 200)
    seen_gpus = []
    with LoadDriver(controller, f"/v1/serving/{namespace}/chat/stats") as load:
        time.sleep(2 * INTERVAL)  # steady load: the plan holds
        assert status().get("ratio") == first["ratio"]
        assert status()["observed"]["requestsPerSecond"] == 6.0

        load.rate = 18.0  # the load triples
        tripled_at = time.monotonic()
        up = wait_for("a bigger plan", lambda: (s := status()).get("gpus", 0) > first["gpus"] and s,
                      timeout=2 * INTERVAL + 5)
        assert time.monotonic() - tripled_at <= 2 * INTERVAL + 5
        assert up["predictedGoodput"] >= 18.0 and up["lastPlan"]["reason"] != first["lastPlan"]["reason"]
        ready_up = wait_for("bigger plan Ready", lambda: (s := status()).get("phase") == "Ready" and s, timeout=60)
        deps = {d["metadata"]["labels"]["flotilla.dev/role"]: d for d in items("deployments", namespace)}
        assert deps["prefill"]["spec"]["replicas"] == ready_up["prefillReplicas"]
        assert deps["decode"]["spec"]["replicas"] == ready_up["decodeReplicas"]
        scaled = [e for e in items("events", namespace) if e["reason"] == "Scaled" and "->" in e["message"]]
        assert scaled and f"-> {ready_up['ratio']}" in scaled[0]["message"]

        load.rate = 6.0  # back down: the plan must hold through the scale-down delay, then shrink once
        fell_at = time.monotonic()
        while time.monotonic() - fell_at < SCALE_DOWN_AFTER - 3:
            seen_gpus.append(status().get("gpus"))
            time.sleep(1)
        assert set(seen_gpus) == {ready_up["gpus"]}, "scaled down before the scale-down delay"
        down = wait_for("scaled back down", lambda: (s := status()).get("gpus", 99) < ready_up["gpus"] and s,
                        timeout=SCALE_DOWN_AFTER + 3 * INTERVAL)
        assert down["gpus"] <= 16
        time.sleep(2 * INTERVAL)  # and stays there
        assert status()["gpus"] == down["gpus"]
    plans = controller.get("/v1/decisions", params={"kind": "plan", "object": f"{namespace}/chat"}).json()["items"]
    made = [p for p in plans if p["actor"] == "controller"]  # the others are the same changes as observed
    assert len(made) == 2, [p["reason"] for p in made]  # one up, one down: no flapping
    assert made[0]["reason"].startswith("scale down") and made[0]["inputs"]["observed"]["requests_per_second"] == 6.0
    _the_plan_has_one_writer_and_a_users_apply_keeps_it(body, namespace)


def _the_plan_has_one_writer_and_a_users_apply_keeps_it(body: dict, namespace: str) -> None:
    sd = get("servingdeployment", "chat", namespace)
    plan = sd["spec"]["plan"]
    assert (plan["prefillReplicas"], plan["decodeReplicas"]) == (sd["status"]["prefillReplicas"],
                                                                 sd["status"]["decodeReplicas"])
    managed = json.loads(kubectl("get", "servingdeployment", "chat", "-n", namespace, "-o", "json",
                                 "--show-managed-fields").stdout)["metadata"]["managedFields"]
    owners = {m["manager"] for m in managed if "f:plan" in (m.get("fieldsV1") or {}).get("f:spec", {})}
    assert owners == {"flotilla-controller"}, managed
    assert not [m for m in managed if m["manager"] == "flotilla-controller" and m.get("subresource") == "status"]
    # The user re-applies the manifest with another SLO: client-side apply (a three-way merge patch from the
    # last-applied annotation, which never held spec.plan) and server-side apply both leave the plan alone.
    edited = {**body, "spec": {**body["spec"], "slo": {**body["spec"]["slo"], "attainment": 0.91}}}
    assert apply(json.dumps(edited), namespace).returncode == 0
    assert get("servingdeployment", "chat", namespace)["spec"]["plan"] == plan
    server_side = kubectl("apply", "--server-side", "--field-manager=user", "-n", namespace, "-f", "-",
                          stdin=json.dumps(edited), check=False)
    assert server_side.returncode == 0, server_side.stderr
    assert get("servingdeployment", "chat", namespace)["spec"]["plan"] == plan
    # Setting spec.plan yourself conflicts with the controller's ownership (unless forced).
    hijack = {**edited, "spec": {**edited["spec"], "plan": {**plan, "decodeReplicas": plan["decodeReplicas"] + 1}}}
    refused = kubectl("apply", "--server-side", "--field-manager=user", "-n", namespace, "-f", "-",
                      stdin=json.dumps(hijack), check=False)
    assert refused.returncode != 0 and "flotilla-controller" in refused.stderr
