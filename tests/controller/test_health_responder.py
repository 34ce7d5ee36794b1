"""The health responder: detector decisions become node health, taints, checkpoint requests and history."""

import json

import pytest
from controller_fixtures import NOW, node, training_job

from flotilla.controller.actions import RecordingActions
from flotilla.controller.health import HealthResponder
from flotilla.controller.metrics import ControllerMetrics
from flotilla.controller.mirror import parse_node, parse_training_job
from flotilla.health.samples import Sample


@pytest.fixture
def responder(store, clock):
    for name in ("a", "b"):
        store.upsert_node(parse_node(node(name)))
    store.upsert_job(parse_training_job(training_job("j1", placement={"a": 4})))
    store.upsert_job(parse_training_job(training_job("j2", placement={"b": 4})))
    return HealthResponder(store, RecordingActions(), ControllerMetrics(store), clock=clock)


def calls(responder, method):
    return [c for c in responder.actions.calls if c[0] == method]


def test_an_xid_that_kills_the_job_taints_the_node_and_restarts_its_jobs(responder, store):
    # Samples without a job get it from the allocation (j1 holds node a).
    responder.accept([Sample(NOW, "a", "xid", 79.0, gpu=3)])
    [health] = calls(responder, "set_node_health")
    assert health[1:3] == ("a", False) and health[5] == "NoExecute" and "79" in health[4]
    [annotate] = calls(responder, "annotate")
    assert annotate[1:4] == ("trainingjobs", "default", "j1")
    request = json.loads(annotate[5])
    assert request["restart"] is True and request["requestedBy"] == "controller" and "node a" in request["reason"]
    recorded = {(r.kind, r.object) for r in store.decisions(limit=50).items}
    assert {("detection", "a"), ("checkpoint-request", "default/j1")} <= recorded
    # The same fault again asks for nothing new: the request is still unacknowledged.
    responder.accept([Sample(NOW + 1, "a", "xid", 79.0, gpu=3)])
    assert len(calls(responder, "annotate")) == 1


def test_a_lost_heartbeat_is_transient_and_clears_by_rule(responder, clock):
    for t in range(3):
        clock.now = NOW + t
        responder.accept([Sample(clock.now, n, "heartbeat", 1.0) for n in ("a", "b")])
    clock.now += 5  # b falls silent; a keeps beating
    responder.accept([Sample(clock.now, "a", "heartbeat", 1.0)])
    lost = [c for c in calls(responder, "set_node_health") if c[1] == "b"]
    assert lost and lost[0][2] is False and lost[0][5] == "NoSchedule"
    # A silent node cannot be trusted to write a checkpoint: its job restarts from the last one.
    assert json.loads(calls(responder, "annotate")[0][5])["restart"] is True
    for _ in range(40):  # b is back; after clear_after calm evaluations the finding clears
        clock.now += 1
        responder.accept([Sample(clock.now, n, "heartbeat", 1.0) for n in ("a", "b")])
    assert [c[2] for c in calls(responder, "set_node_health") if c[1] == "b"] == [False, True]

