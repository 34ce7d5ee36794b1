"""Serving re-planning in the controller: pushed statistics -> Replanner -> spec.plan (server-side applied)
and history; the operator acts on spec.plan and is the only writer of status."""

import copy
import json

import pytest
from controller_fixtures import ADMIN, AGENT, auth, serving

from flotilla.controller.actions import RecordingActions
from flotilla.controller.metrics import ControllerMetrics
from flotilla.controller.mirror import parse_serving_deployment
from flotilla.controller.replan import ServingReplanner
from flotilla.controller.views import iso
from flotilla.operator import serving as operator_serving
from flotilla.operator.actions import ApplyDeployment, ApplyObject, PatchStatus, PostEvent
from flotilla.resources.names import ANNOTATION_OBSERVED
from flotilla.serving.replan import ObservedWindow, ReplanPolicy
from flotilla.serving.planner import plan
from flotilla.serving.spec import plan_request

TEMPLATE = {"spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]}}


def sd_body(interval=5, mode="auto"):
    """As the operator leaves it after its first plan for spec.workload: no spec.plan yet."""
    spec = {"slo": {"ttftMs": 400, "tpotMs": 100, "attainment": 0.9},
            "workload": {"requestsPerSecond": 6, "inputTokens": 512, "outputTokens": 128},
            "profile": {"name": "opt-13b-a100"}, "maxGPUs": 16,
            "prefill": {"template": TEMPLATE}, "decode": {"template": TEMPLATE},
            "planner": {"mode": mode, "intervalSeconds": interval}}
    first = plan(plan_request(spec))
    status = {"prefillReplicas": first.prefill_replicas, "decodeReplicas": first.decode_replicas,
              "prefillGPUsPerInstance": first.prefill_gpus_per_instance,
              "decodeGPUsPerInstance": first.decode_gpus_per_instance,
              "predictedGoodput": first.predicted_goodput, "lastPlan": {"time": "2027-01-15T07:00:00Z", "reason": "x"}}
    return {"apiVersion": "flotilla.dev/v1alpha1", "kind": "ServingDeployment",
            "metadata": {"name": "chat", "namespace": "default", "uid": "u1", "generation": 1},
            "spec": spec, "status": status}, first


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


def applies(actions):
    return [c[4] for c in actions.calls if c[0] == "apply"]


def land(actions):
    """What the API server does with the last apply: the controller's fields merged into the object
    (the spec.plan it applied replaces the one there; the annotation is set)."""
    [body] = actions.objects["servingdeployments"]
    fields = applies(actions)[-1]
    body["metadata"].setdefault("annotations", {}).update(fields["metadata"]["annotations"])
    if "spec" in fields:
        body["spec"]["plan"] = copy.deepcopy(fields["spec"]["plan"])
        body["metadata"]["generation"] += 1
    return body


def step(replanner, clock, rps, seconds=5):
    clock.now += seconds
    replanner.observe("default/chat", window(clock.now, rps))
    replanner.step()


def test_a_tripled_load_gives_a_bigger_plan_in_spec_plan_recorded_with_its_inputs(setup, store, clock):
    replanner, actions, first = setup
    step(replanner, clock, 6.0, 0)
    steady = applies(actions)[-1]
    assert "spec" not in steady  # steady: only the observation is written, and no plan of its own yet
    assert json.loads(steady["metadata"]["annotations"][ANNOTATION_OBSERVED])["requestsPerSecond"] == 6.0
    land(actions)
    step(replanner, clock, 18.0)
    new = applies(actions)[-1]["spec"]["plan"]
    assert new["prefillReplicas"] + new["decodeReplicas"] > first.prefill_replicas + first.decode_replicas
    assert new["reason"] and new["predictedGoodput"] >= 18.0 and new["time"] == iso(clock.now)
    [record] = [d for d in store.decisions(limit=10).items if d.kind == "plan"]
    assert record.object == "default/chat" and record.inputs["observed"]["requests_per_second"] == 18.0
    assert {c[0] for c in actions.calls} == {"apply"}  # never status


def test_the_controller_writes_only_its_own_fields_and_the_operator_acts_on_them(setup, clock):
    replanner, actions, _ = setup
    for rps in (6.0, 18.0, 18.0):
        step(replanner, clock, rps)
        land(actions)
    for fields in applies(actions):
        assert set(fields) <= {"metadata", "spec"} and set(fields.get("spec", {})) <= {"plan"}
        assert list(fields["metadata"]) == ["annotations"] and list(fields["metadata"]["annotations"]) == [
            ANNOTATION_OBSERVED]
    body = actions.objects["servingdeployments"][0]
    plan_ = body["spec"]["plan"]
    acted = operator_serving.plan_serving(body, {}, clock.now)
    replicas = {a.manifest["metadata"]["name"]: a.manifest["spec"]["replicas"]
                for a in acted if isinstance(a, ApplyDeployment)}
    assert replicas == {"chat-prefill": plan_["prefillReplicas"], "chat-decode": plan_["decodeReplicas"]}
    # The operator writes status only (and the Deployments and endpoint objects it owns), mirroring the plan
    # and the observation it acts on.
    assert all(isinstance(a, (PatchStatus, ApplyDeployment, ApplyObject, PostEvent)) for a in acted)
    [status] = [a.status for a in acted if isinstance(a, PatchStatus)]
    assert (status["prefillReplicas"], status["decodeReplicas"]) == (plan_["prefillReplicas"], plan_["decodeReplicas"])
    assert status["lastPlan"] == {"time": plan_["time"], "reason": plan_["reason"]}
    assert status["observed"]["requestsPerSecond"] == 18.0


def test_an_unchanged_plan_and_observation_write_nothing(setup, clock):
    replanner, actions, _ = setup
    step(replanner, clock, 6.0)
    land(actions)
    step(replanner, clock, 6.0)
    assert len(applies(actions)) == 1


def test_every_write_carries_the_plan_so_server_side_apply_keeps_it(setup, clock):
    """Server-side apply removes a field its manager owned and leaves out: once the controller has a plan, each
    apply (a new observation) carries it, unchanged; a user's edit of another spec field keeps it too."""
    replanner, actions, _ = setup
    step(replanner, clock, 18.0)
    plan_ = land(actions)["spec"]["plan"]
    body = actions.objects["servingdeployments"][0]
    body["spec"]["slo"]["attainment"] = 0.95  # kubectl apply of the user's manifest: spec.plan is not in it
    step(replanner, clock, 12.0)  # well within the plan (17 would now call for more at the stricter SLO)
    assert applies(actions)[-1]["spec"]["plan"] == plan_
    assert operator_serving.target(land(actions)["spec"]).replicas == {"prefill": plan_["prefillReplicas"],
                                                                "decode": plan_["decodeReplicas"]}


def test_a_restarted_controller_resumes_from_spec_plan(setup, store, clock):
    replanner, actions, _ = setup
    step(replanner, clock, 18.0)
    plan_ = land(actions)["spec"]["plan"]
    restarted = ServingReplanner(actions, store, ControllerMetrics(store), ReplanPolicy(scale_down_delay_s=20),
                                 clock=clock)
    step(restarted, clock, 18.0)
    assert applies(actions)[-1]["spec"]["plan"] == plan_  # the same load: the plan it finds holds
    assert len([d for d in store.decisions(limit=10).items if d.kind == "plan"]) == 1


def test_a_re_plan_request_newer_than_spec_plan_forces_an_evaluation(setup, clock):
    replanner, actions, _ = setup
    step(replanner, clock, 18.0)
    plan_ = land(actions)["spec"]["plan"]
    body = actions.objects["servingdeployments"][0]
    body["metadata"]["annotations"]["flotilla.dev/replan-request"] = json.dumps(
        {"generation": 1, "reason": "check", "time": iso(clock.now + 1)})
    step(replanner, clock, 18.0, seconds=2)  # before the interval: only the request makes it due
    forced = applies(actions)[-1]["spec"]["plan"]
    assert forced["reason"].startswith("re-plan requested") and forced["time"] == iso(clock.now)
    assert forced["prefillReplicas"] == plan_["prefillReplicas"]
    land(actions)
    step(replanner, clock, 18.0, seconds=2)  # served: spec.plan.time is past the request
    assert len(applies(actions)) == 2


def test_not_due_before_the_interval_and_nothing_in_fixed_mode(setup, clock):
    replanner, actions, _ = setup
    step(replanner, clock, 6.0, 0)
    step(replanner, clock, 7.0, 2)
    assert len(applies(actions)) == 1
    body, _ = sd_body(mode="fixed")
    actions.objects["servingdeployments"] = [body]
    step(replanner, clock, 18.0, 10)
    assert len(applies(actions)) == 1


def test_a_window_short_of_capacity_is_evaluated_at_once_not_at_the_next_interval(setup, clock):
    replanner, actions, first = setup
    step(replanner, clock, 6.0, 0)
    land(actions)
    step(replanner, clock, 6.5, 1)  # within the plan's headroom: waits for the interval
    assert len(applies(actions)) == 1
    step(replanner, clock, 18.0, 1)  # 2 s after the last evaluation, 3 s before the next one is due
    assert len(applies(actions)) == 2
    new = land(actions)["spec"]["plan"]
    assert new["prefillReplicas"] + new["decodeReplicas"] > first.prefill_replicas + first.decode_replicas
    assert new["time"] == iso(clock.now)
    clock.now += 1
    replanner.step()  # the same window again: not evaluated twice
    assert len(applies(actions)) == 2


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


def test_a_plan_whose_apply_failed_is_applied_on_the_next_pass(setup, clock, monkeypatch):
    from flotilla.controller.actions import ClusterActionError

    replanner, actions, _ = setup

    def timed_out(*_):
        raise ClusterActionError("servingdeployments/default/chat: 504 Gateway Timeout")

    monkeypatch.setattr(actions, "apply", timed_out)
    step(replanner, clock, 18.0)  # the Replanner decides; the write times out (logged, not raised)
    monkeypatch.undo()
    step(replanner, clock, 18.0)  # no new decision: the same load
    [fields] = applies(actions)
    assert fields["spec"]["plan"]["reason"].startswith("scale up")


def test_a_restarted_controller_resumes_the_replanners_hysteresis(setup, store, clock):
    """The memory of a peak (here 120 s) holds a bigger plan through a restart: kept in the database, not lost with
    the process. Forgotten, the same low load shrinks the plan at once: what a restart did before."""
    from flotilla.controller.replan import MEMORY

    replanner, actions, first = setup

    def low_load(r, seconds):
        for _ in range(seconds // 5):
            step(r, clock, 6.0)
            land(actions)
        return actions.objects["servingdeployments"][0]["spec"]["plan"]

    def restart():
        return ServingReplanner(actions, store, ControllerMetrics(store), ReplanPolicy(scale_down_delay_s=20),
                                clock=clock)

    step(replanner, clock, 18.0)
    big = land(actions)["spec"]["plan"]
    assert big["reason"].startswith("scale up")
    assert low_load(replanner, 20) == big  # the peak is remembered: no scale-down yet
    assert set(store.recall(MEMORY)) == {"default/chat"}
    assert low_load(restart(), 40) == big  # restarted: it still remembers the peak of 65 s ago
    store.remember(MEMORY, "default/chat", None)  # what a restart lost before the memory was kept
    shrunk = low_load(restart(), 40)
    assert shrunk["reason"].startswith("scale down")
    assert shrunk["prefillReplicas"] + shrunk["decodeReplicas"] < big["prefillReplicas"] + big["decodeReplicas"]


def test_the_replanner_decides_by_returning_actions(setup, store, clock):
    """_step_one writes nothing: its actions (a memory, a decision, an apply) are what the applier writes."""
    from flotilla.controller.apply import ApplyFields, Record, Remember

    replanner, actions, _ = setup
    [body] = actions.objects["servingdeployments"]
    replanner.step()  # reads what an earlier run remembered (nothing)
    clock.now += 5
    replanner.observe("default/chat", window(clock.now, 18.0))
    acts = replanner._step_one(body, clock.now)
    assert [type(a) for a in acts] == [Remember, Record, ApplyFields]
    assert actions.calls == [] and store.decisions(limit=10).items == [] and store.recall("serving-replan") == {}
    replanner.applier.apply(acts)
    assert [c[0] for c in actions.calls] == ["apply"] and len(store.decisions(limit=10).items) == 1
