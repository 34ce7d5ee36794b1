"""Serving re-planning in the controller: pushed statistics -> Replanner -> status patch and history."""

import pytest
from controller_fixtures import ADMIN, AGENT, auth, serving

from flotilla.controller.actions import RecordingActions
from flotilla.controller.metrics import ControllerMetrics
from flotilla.controller.mirror import parse_serving_deployment
from flotilla.controller.replan import ServingReplanner
from flotilla.serving.replan import ObservedWindow, ReplanPolicy
from flotilla.serving.planner import plan
from flotilla.serving.spec import plan_request


def sd_body(prefill=1, decode=1, interval=5, mode="auto"):
    spec = {"slo": {"ttftMs": 400, "tpotMs": 100, "attainment": 0.9},
            "workload": {"requestsPerSecond": 6, "inputTokens": 512, "outputTokens": 128},
            "profile": {"name": "opt-13b-a100"}, "maxGPUs": 16,
            "prefill": {"template": {}}, "decode": {"template": {}},
            "planner": {"mode": mode, "intervalSeconds": interval}}
    first = plan(plan_request(spec))
    status = {"prefillReplicas": first.prefill_replicas, "decodeReplicas": first.decode_replicas,
              "prefillGPUsPerInstance": first.prefill_gpus_per_instance,
              "decodeGPUsPerInstance": first.decode_gpus_per_instance,
              "predictedGoodput": first.predicted_goodput, "lastPlan": {"time": "2027-01-15T07:00:00Z", "reason": "x"}}
    return {"metadata": {"name": "chat", "namespace": "default"}, "spec": spec, "status": status}, first


def window(t, rps):
    return ObservedWindow(time=t, requests_per_second=rps, mean_prompt_tokens=512, mean_output_tokens=128,
                          ttft_p90_ms=150.0, tpot_p90_ms=40.0, attainment=0.99, requests=int(rps * 10))


@pytest.fixture
def setup(store, clock):
    body, first = sd_body()
    actions = RecordingActions(objects={"servingdeployments": [body]})
    replanner = ServingReplanner(actions, store, ControllerMetrics(store), ReplanPolicy(scale_down_delay_s=20),
                                 clock=clock)
    return replanner, actions, first


def patches(actions):
    return [c[4] for c in actions.calls if c[0] == "patch_status"]


def test_a_tripled_load_gives_a_bigger_plan_recorded_with_its_inputs(setup, store, clock):
    replanner, actions, first = setup
    replanner.observe("default/chat", window(clock.now, 6.0))
    replanner.step()
    assert "prefillReplicas" not in patches(actions)[-1]  # steady: only the observation is written
    assert patches(actions)[-1]["observed"]["requestsPerSecond"] == 6.0
    clock.now += 5
    replanner.observe("default/chat", window(clock.now, 18.0))
    replanner.step()
    new = patches(actions)[-1]
    assert new["prefillReplicas"] + new["decodeReplicas"] > first.prefill_replicas + first.decode_replicas
    assert new["lastPlan"]["reason"] and new["predictedGoodput"] >= 18.0
    [record] = [d for d in store.decisions(limit=10).items if d.kind == "plan"]
    assert record.object == "default/chat" and record.inputs["observed"]["requests_per_second"] == 18.0


def test_not_due_before_the_interval_and_nothing_in_fixed_mode(setup, clock):
    replanner, actions, _ = setup
    replanner.observe("default/chat", window(clock.now, 6.0))
    replanner.step()
    clock.now += 2
    replanner.step()
    assert len(patches(actions)) == 1
    body, _ = sd_body(mode="fixed")
    actions.objects["servingdeployments"] = [body]
    clock.now += 10
    replanner.step()
    assert len(patches(actions)) == 1


def test_the_stats_route_feeds_the_replanner(client, controller, store, setup, clock):
    replanner, _, _ = setup
    controller.serving_stats = replanner.observe
    store.upsert_serving(parse_serving_deployment(serving("chat")))
    body = {"windowSeconds": 10, "requestsPerSecond": 3.5, "meanPromptTokens": 512, "meanOutputTokens": 128,
            "ttftP90Ms": 120, "attainment": 0.97, "requests": 35}
    r = client.post("/v1/serving/default/chat/stats", json=body, headers=auth(AGENT))
    assert r.status_code == 202, r.text
    assert replanner._windows["default/chat"].requests_per_second == 3.5
    bad = client.post("/v1/serving/default/chat/stats", json={**body, "attainment": 1.5}, headers=auth(ADMIN))
    assert bad.status_code == 422 and "attainment" in bad.text
    assert client.post("/v1/serving/default/nope/stats", json=body, headers=auth(ADMIN)).status_code == 404


def test_the_prometheus_route_feeds_the_replanner_from_the_second_scrape(client, controller, store, setup, clock):
    from test_vllm import exposition

    replanner, _, _ = setup
    controller.serving_stats = replanner.observe
    store.upsert_serving(parse_serving_deployment(serving("chat")))
    path, headers = "/v1/serving/default/chat/stats/prometheus", {**auth(AGENT), "Content-Type": "text/plain"}
    r = client.post(path, content=exposition(100, 50_000, 20_000, [(0.1, 50), ("+Inf", 100)]), headers=headers)
    assert r.status_code == 202 and r.json() == {"accepted": True, "window": False}
    clock.now += 10
    r = client.post(path, content=exposition(150, 70_000, 27_500, [(0.1, 90), ("+Inf", 150)]), headers=headers)
    assert r.json() == {"accepted": True, "window": True}
    assert replanner._windows["default/chat"].requests_per_second == pytest.approx(5.0)
    bad = client.post(path, content="not { prometheus", headers=headers)
    assert bad.status_code == 422 and "Prometheus" in bad.text
