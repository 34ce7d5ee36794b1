"""Parsing of Kubernetes objects into records, and record changes into decisions (pure functions)."""

import json
import re

import pytest

from controller_fixtures import NOW, node, serving, training_job
from flotilla.controller.mirror import (
    job_changes,
    node_changes,
    parse_node,
    parse_serving_deployment,
    parse_training_job,
    serving_changes,
)


def test_training_job_fields():
    req = {"generation": 3, "reason": "x", "requestedBy": "operator", "restart": False, "time": "2027-01-15T08:00:00Z"}
    rec = parse_training_job(training_job("llama", "ml", placement={"a": 4, "b": 2}, generation=2,
                                          annotations={"flotilla.dev/checkpoint-request": json.dumps(req)},
                                          priority=5, bestEffort=True))
    assert (rec.key, rec.namespace, rec.name, rec.phase) == ("ml/llama", "ml", "llama", "Running")
    assert rec.placement == {"a": 4, "b": 2} and rec.gpus == 6
    assert (rec.priority, rec.best_effort, rec.min_gpus, rec.max_gpus) == (5, True, 2, 8)
    assert rec.deadline == NOW + 3600 and rec.estimated_completion == NOW + 1800
    assert (rec.steps, rec.total_steps, rec.steps_per_second) == (1200, 10_000, 2.5)
    assert rec.checkpoint_generation == 2 and rec.checkpoint_request == req
    assert rec.last_condition == "Scaled: marginal gain"


def test_relative_deadline_counts_from_creation():
    obj = training_job("j", deadline=None, deadlineSeconds=7200)
    assert parse_training_job(obj).deadline == NOW - 600 + 7200


def test_minimal_job_defaults():
    rec = parse_training_job({"metadata": {"name": "j"}, "spec": {}})
    assert (rec.key, rec.phase, rec.gpus, rec.placement, rec.deadline) == ("default/j", "Pending", 0, {}, None)


@pytest.mark.parametrize("mutate, field", [
    (lambda o: o["metadata"].pop("name"), "metadata.name"),
    (lambda o: o["spec"].update(deadline="tomorrow"), "spec.deadline"),
    (lambda o: o["spec"].update(deadline="2027-01-01T00:00:00"), "spec.deadline"),
    (lambda o: o["spec"].update(priority="high"), "spec.priority"),
    (lambda o: o["status"].update(placement=[{"gpus": 2}]), "status.placement[0].node"),
    (lambda o: o["status"].update(deadlineMet="yes"), "status.deadlineMet"),
    (lambda o: o["status"]["progress"].update(stepsPerSecond="fast"), "status.progress.stepsPerSecond"),
    (lambda o: o["metadata"]["annotations"].update({"flotilla.dev/checkpoint-request": "[1]"}),
     "flotilla.dev/checkpoint-request"),
    (lambda o: o["metadata"]["annotations"].update({"flotilla.dev/checkpoint-request": '{"generation": "2"}'}),
     "integer 'generation'"),
])
def test_malformed_job_names_the_field(mutate, field):
    obj = training_job("j")
    mutate(obj)
    with pytest.raises(ValueError, match=re.escape(field)):
        parse_training_job(obj)


def test_serving_fields():
    rec = parse_serving_deployment(serving("chat", "llm", prefill=3, decode=5))
    assert (rec.key, rec.prefill_replicas, rec.decode_replicas) == ("llm/chat", 3, 5)
    assert (rec.prefill_gpus_per_instance, rec.decode_gpus_per_instance) == (1, 2)
    assert rec.slo == {"ttftMs": 400.0, "tpotMs": 40.0, "attainment": 0.9}
    assert rec.observed["attainment"] == 0.93 and rec.predicted_goodput == 9.5
    assert rec.last_plan_time == NOW - 300 and rec.last_plan_reason == "ratio 1:2 at 10 rps"


@pytest.mark.parametrize("labels, domain", [
    ({"flotilla.dev/nvlink-domain": "nv0", "flotilla.dev/rack": "r1"}, "nv0"),
    ({"flotilla.dev/rack": "r1"}, "r1"),
    ({}, "n1"),
])
def test_node_domain(labels, domain):
    assert parse_node(node("n1", labels=labels)).domain == domain


def test_node_health_and_taint():
    rec = parse_node(node("n1", 4, unschedulable=True, healthy=False, taint_effect="NoExecute"))
    assert (rec.total_gpus, rec.ready, rec.unschedulable, rec.healthy) == (4, True, True, False)
    assert (rec.health_reason, rec.health_message) == ("XidError", "XID 79 on GPU 3")
    assert rec.taint == {"value": "XidError", "effect": "NoExecute"}
    healthy = parse_node(node("n2"))
    assert healthy.healthy and healthy.health_reason is None and healthy.taint is None


def test_node_with_bad_gpu_capacity():
    obj = node("n1")
    obj["status"]["capacity"]["nvidia.com/gpu"] = "lots"
    with pytest.raises(ValueError, match="nvidia.com/gpu"):
        parse_node(obj)


def test_job_changes():
    old = parse_training_job(training_job("j", placement={"a": 4}, reshards=1))
    new = parse_training_job(training_job("j", placement={"a": 4, "b": 4}, reshards=2, phase="Resharding"))
    changes = {d.kind: d for d in job_changes(old, new, NOW)}
    assert set(changes) == {"allocation", "reshard", "phase"}
    assert changes["allocation"].inputs["from"] == {"a": 4} and changes["allocation"].inputs["to"] == {"a": 4, "b": 4}
    assert changes["allocation"].reason == "Scaled: marginal gain"
    assert changes["phase"].inputs == {"from": "Running", "to": "Resharding"}
    assert job_changes(None, new, NOW) == [] and job_changes(new, new, NOW) == []


def test_serving_and_node_changes():
    old = parse_serving_deployment(serving("s", prefill=2, decode=4))
    new = parse_serving_deployment(serving("s", prefill=3, decode=4))
    [plan] = serving_changes(old, new, NOW)
    assert plan.kind == "plan" and plan.inputs["to"] == {"prefill": 3, "decode": 4}
    assert serving_changes(old, old, NOW) == []
    kinds = [d.kind for d in node_changes(parse_node(node("n")), parse_node(node("n", unschedulable=True,
                                                                                 healthy=False)), NOW)]
    assert kinds == ["cordon", "health"]
    assert [d.kind for d in node_changes(parse_node(node("n", unschedulable=True)), parse_node(node("n")), NOW)] \
        == ["uncordon"]


def test_loans_through_the_pool_are_mirrored_and_recorded():
    job = training_job("j")
    job["status"]["lentTo"] = [{"serving": "llm/chat", "gpus": 4}]
    assert dict(parse_training_job(job).lent_to) == {"llm/chat": 4}
    before = parse_serving_deployment(serving("chat", "llm"))
    assert dict(before.borrowed_from) == {} and before.granted_gpus is None
    lending = serving("chat", "llm")
    lending["status"]["borrowedFrom"] = [{"job": "default/j", "gpus": 4}]
    lending["status"]["pool"] = {"grantedGPUs": 14, "demandedGPUs": 14}
    after = parse_serving_deployment(lending)
    assert dict(after.borrowed_from) == {"default/j": 4} and after.granted_gpus == 14
    [loan] = serving_changes(before, after, NOW)
    assert (loan.kind, loan.object, loan.reason) == ("loan", "llm/chat",
                                                     "borrowed 4 GPUs of training jobs' surplus through the pool")
    assert loan.inputs == {"from": {}, "to": {"default/j": 4}, "grantedGPUs": 14}
    [back] = serving_changes(after, before, NOW)
    assert back.reason.startswith("gave back 4 GPUs")


@pytest.mark.parametrize("status, field", [({"lentTo": {"x": 1}}, "status.lentTo must be a list"),
                                           ({"lentTo": [{"gpus": 1}]}, "status.lentTo[0].serving"),
                                           ({"lentTo": [{"serving": "a/b", "gpus": "2"}]}, "status.lentTo[0].gpus")])
def test_malformed_loans_name_the_field(status, field):
    job = training_job("j")
    job["status"].update(status)
    with pytest.raises(ValueError, match=re.escape(field)):
        parse_training_job(job)
