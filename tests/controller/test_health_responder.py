"""The health responder: detector decisions become node health, taints, checkpoint requests and history."""

import json

import pytest
from controller_fixtures import NOW, node, training_job

from flotilla.controller.actions import RecordingActions
from flotilla.controller.health import HealthResponder
from flotilla.controller.metrics import ControllerMetrics
from flotilla.controller.mirror import parse_node, parse_training_job
from flotilla.health.budget import TaintBudget, TaintBudgetConfig
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
    # Samples without a job get it from the allocation (j1 holds node a). The XID names no GPU: the node goes.
    responder.accept([Sample(NOW, "a", "xid", 79.0)])
    [health] = calls(responder, "set_node_health")
    assert health[1:3] == ("a", False) and health[5] == "NoExecute" and "79" in health[4]
    [annotate] = calls(responder, "annotate")
    assert annotate[1:4] == ("trainingjobs", "default", "j1")
    request = json.loads(annotate[5])
    assert request["restart"] is True and request["requestedBy"] == "controller" and "node a" in request["reason"]
    recorded = {(r.kind, r.object) for r in store.decisions(limit=50).items}
    assert {("detection", "a"), ("checkpoint-request", "default/j1")} <= recorded
    # The same fault again asks for nothing new: the request is still unacknowledged.
    responder.accept([Sample(NOW + 1, "a", "xid", 79.0)])
    assert len(calls(responder, "annotate")) == 1


def test_a_lost_heartbeat_is_transient_and_clears_by_rule(responder, clock):
    for t in range(3):
        clock.now = NOW + t
        responder.accept([Sample(clock.now, n, "heartbeat", 1.0) for n in ("a", "b")])
    for _ in range(5):  # b falls silent; a keeps beating (a controller that saw nothing for 5 s would have stalled)
        clock.now += 1
        responder.accept([Sample(clock.now, "a", "heartbeat", 1.0)])
    lost = [c for c in calls(responder, "set_node_health") if c[1] == "b"]
    assert lost and lost[0][2] is False and lost[0][5] == "NoSchedule"
    # A silent node cannot be trusted to write a checkpoint: its job restarts from the last one.
    assert json.loads(calls(responder, "annotate")[0][5])["restart"] is True
    for _ in range(40):  # b is back; after clear_after calm evaluations the finding clears
        clock.now += 1
        responder.accept([Sample(clock.now, n, "heartbeat", 1.0) for n in ("a", "b")])
    assert [c[2] for c in calls(responder, "set_node_health") if c[1] == "b"] == [False, True]



# -- a fleet of 20 nodes in two racks, for pipeline faults and the taint budget ----------------------------------

FLEET = [f"g{i:02d}" for i in range(20)]


@pytest.fixture
def fleet(store, clock):
    for i, name in enumerate(FLEET):
        store.upsert_node(parse_node(node(name, labels={"flotilla.dev/rack": "r1" if i < 10 else "r2"})))
    for i in range(0, 20, 2):
        store.upsert_job(parse_training_job(training_job(f"t{i}", placement={FLEET[i]: 4, FLEET[i + 1]: 4})))
    return HealthResponder(store, RecordingActions(), ControllerMetrics(store), clock=clock,
                           budget=TaintBudget(TaintBudgetConfig(window=600.0)), pod=("flotilla", "controller-0"))


def beat(responder, clock, seconds, nodes=FLEET, skew=0.0):
    for _ in range(seconds):
        clock.now += 1
        responder.accept([Sample(clock.now + skew, n, "heartbeat", 1.0) for n in nodes])


def idle(responder, clock, seconds):
    for _ in range(seconds):
        clock.now += 1
        responder.tick()


def metric(responder, name, **labels):
    return responder.metrics.registry.get_sample_value(name, labels or None)


def test_a_cleared_finding_does_not_untaint_a_node_that_another_fault_holds(responder, clock):
    for t in range(3):
        clock.now = NOW + t
        responder.accept([Sample(clock.now, n, "heartbeat", 1.0) for n in ("a", "b")])
    for _ in range(5):   # b falls silent: heartbeat-lost, NoSchedule
        clock.now += 1
        responder.accept([Sample(clock.now, "a", "heartbeat", 1.0)])
    clock.now += 1       # b is back, with an XID 74 (NVLink: node-wide): a hardware fault decided although the lost
    # heartbeat is open
    responder.accept([Sample(clock.now, "b", "xid", 74.0, gpu=0), Sample(clock.now, "a", "heartbeat", 1.0)])
    for _ in range(40):  # its heartbeat finding clears by rule; the XID keeps the node out
        clock.now += 1
        responder.accept([Sample(clock.now, n, "heartbeat", 1.0) for n in ("a", "b")])
    health = [c[2:] + (c[5],) for c in calls(responder, "set_node_health") if c[1] == "b"]
    assert [(h[0], h[-1]) for h in health] == [(False, "NoSchedule"), (False, "NoExecute"), (False, "NoExecute")]
    responder.release("b")
    assert responder.monitor.active_on("b") == []


@pytest.mark.parametrize("stall", [5, 60])
def test_a_stalled_pipeline_taints_nothing_and_shows_in_the_condition_metrics_and_an_event(fleet, clock, store, stall):
    beat(fleet, clock, 5)
    idle(fleet, clock, stall)                               # Redis paused: nothing arrives
    assert calls(fleet, "set_node_health") == [] and calls(fleet, "annotate") == []
    [cond] = fleet.conditions()
    assert (cond["type"], cond["status"], cond["reason"]) == ("IngestHealthy", "False", "NoDelivery")
    assert metric(fleet, "flotilla_ingest_pipeline_healthy") == 0
    assert metric(fleet, "flotilla_ingest_pipeline_stalls_total", reason="no-delivery") == 1
    assert metric(fleet, "flotilla_health_actions_suppressed_total", reason="pipeline-fault") == 20
    [event] = calls(fleet, "post_event")
    assert event[1]["name"] == "controller-0" and event[2:4] == ("Warning", "IngestStalled")
    beat(fleet, clock, 40)                                   # delivery resumes
    assert calls(fleet, "set_node_health") == [] and calls(fleet, "annotate") == []
    assert fleet.conditions()[0]["status"] == "True" and metric(fleet, "flotilla_ingest_pipeline_healthy") == 1
    assert [c[3] for c in calls(fleet, "post_event")] == ["IngestStalled", "IngestResumed"]
    kinds = [r.kind for r in store.decisions(limit=50).items]
    assert "pipeline-fault" in kinds and "pipeline-resumed" in kinds and "detection" not in kinds


def test_a_controller_restarted_with_a_backlog_taints_nothing(store, clock):
    for name in FLEET:
        store.upsert_node(parse_node(node(name)))
    responder = HealthResponder(store, RecordingActions(), ControllerMetrics(store), clock=clock)
    backlog = [Sample(clock.now - 20 + t, n, "heartbeat", 1.0) for t in range(20) for n in FLEET]
    backlog.append(Sample(clock.now - 12, "g03", "xid", 74.0, gpu=1))
    for i in range(0, len(backlog), 100):
        responder.accept(backlog[i:i + 100])
    beat(responder, clock, 30)
    assert [c[1] for c in calls(responder, "set_node_health")] == ["g03"]   # the XID in the backlog only


@pytest.mark.parametrize("skew", [30.0, -30.0])
def test_agent_clocks_30_s_off_taint_nothing(fleet, clock, skew):
    beat(fleet, clock, 60, skew=skew)
    assert calls(fleet, "set_node_health") == []
    assert fleet.conditions()[0]["status"] == "True"


def test_the_taint_budget_holds_back_faults_beyond_it_and_frees_after_its_window(fleet, clock, store):
    beat(fleet, clock, 3)
    fleet.accept([Sample(clock.now, n, "xid", 74.0, gpu=0) for n in FLEET[:6]])   # six nodes "fail" at once
    # 10 % of 20 nodes = 2 nodes in 10 minutes
    assert [c[1] for c in calls(fleet, "set_node_health")] == ["g00", "g01"]
    assert len(calls(fleet, "annotate")) == 1              # g00 and g01 hold one job: one request
    held = [r for r in store.decisions(limit=100).items if r.kind == "action-suppressed"]
    assert sorted(r.object for r in held) == ["g02", "g03", "g04", "g05"]
    assert all("taint budget" in r.reason for r in held)
    assert metric(fleet, "flotilla_health_actions_suppressed_total", reason="taint-budget") == 4
    clock.now += 601
    fleet.accept([Sample(clock.now, "g12", "xid", 74.0, gpu=0)])
    assert [c[1] for c in calls(fleet, "set_node_health")] == ["g00", "g01", "g12"]


def test_the_domain_budget_holds_within_one_rack(store, clock):
    for i, name in enumerate(FLEET):
        store.upsert_node(parse_node(node(name, labels={"flotilla.dev/rack": f"r{i // 4}"})))
    responder = HealthResponder(store, RecordingActions(), ControllerMetrics(store), clock=clock,
                                budget=TaintBudget(TaintBudgetConfig(fraction=1.0, domain_fraction=0.5)))
    responder.accept([Sample(clock.now, n, "xid", 74.0, gpu=0) for n in FLEET[:4]])   # all of rack r0
    assert [c[1] for c in calls(responder, "set_node_health")] == ["g00", "g01"]


def test_a_held_back_transient_fault_clears_without_untainting(fleet, clock):
    fleet.budget = TaintBudget(TaintBudgetConfig(fraction=0.05, min_nodes=0))   # 5 % of 20 = 1 node
    beat(fleet, clock, 5)
    beat(fleet, clock, 6, nodes=FLEET[2:])        # g00 and g01 fall silent: one taint, one held back
    assert [c[1:3] for c in calls(fleet, "set_node_health")] == [("g00", False)]
    beat(fleet, clock, 40)                         # both come back and clear by rule
    assert [c[1:3] for c in calls(fleet, "set_node_health")] == [("g00", False), ("g00", True)]


def test_one_job_on_two_failing_nodes_gets_one_restart_request(fleet, clock):
    beat(fleet, clock, 3)
    fleet.accept([Sample(clock.now, "g00", "xid", 79.0)])     # no GPU named: the node goes
    fleet.accept([Sample(clock.now, "g01", "xid", 48.0)])
    assert len(calls(fleet, "set_node_health")) == 2
    assert len(calls(fleet, "annotate")) == 1


def test_the_ingest_condition_is_in_the_cluster_answer(controller, store, clock):
    from fastapi.testclient import TestClient

    from controller_fixtures import READER, auth
    from flotilla.controller.api import create_app

    responder = HealthResponder(store, RecordingActions(), controller.metrics, clock=clock)
    controller.conditions = responder.conditions
    beat(responder, clock, 3, nodes=["a", "b", "c"])
    idle(responder, clock, 5)
    with TestClient(create_app(controller)) as client:
        conditions = client.get("/v1/cluster", headers=auth(READER)).json()["conditions"]
        [cond] = [c for c in conditions if c["type"] == "IngestHealthy"]
        assert (cond["type"], cond["status"], cond["reason"]) == ("IngestHealthy", "False", "NoDelivery")
        assert cond["lastTransitionTime"].endswith("Z") and "3 of 3" in cond["message"]
        text = client.get("/metrics", headers=auth(READER)).text
        assert "flotilla_ingest_pipeline_healthy 0.0" in text


def test_the_responder_decides_by_returning_actions(responder, store, clock):
    """_decide writes nothing: the taint, the checkpoint requests and the history are actions the applier writes."""
    from flotilla.controller.apply import CheckpointJobsOn, CountDetection, Record, SetNodeHealth

    with responder._lock:
        [d] = responder.monitor.observe(responder._with_jobs([Sample(NOW, "a", "xid", 79.0)]), clock())
    acts = responder._decide(d)
    assert [type(a) for a in acts] == [CountDetection, Record, SetNodeHealth, CheckpointJobsOn]
    taint, checkpoint = acts[2], acts[3]
    assert (taint.node, taint.healthy, taint.effect) == ("a", False, "NoExecute")
    assert (checkpoint.node, checkpoint.restart) == ("a", True)
    assert responder.actions.calls == [] and store.decisions(limit=10).items == []
    responder.applier.apply(acts)
    assert [c[0] for c in responder.actions.calls] == ["set_node_health", "annotate"]
    assert {r.kind for r in store.decisions(limit=10).items} == {"detection", "checkpoint-request"}


# -- one sick GPU costs one GPU -----------------------------------------------------------------------------------

def on_a(responder):
    from flotilla.controller.actions import GpuHolder

    responder.store.upsert_job(parse_training_job(training_job("j3", placement={"a": 4})))
    responder.actions.holders["a"] = [GpuHolder("default/j1", "j1-w0", 0, (0, 1)),
                                      GpuHolder("default/j1", "j1-w1", 1, (2, 3)),
                                      GpuHolder("default/j3", "j3-w0", 0, (4, 5, 6, 7))]
    return responder


def test_an_xid_79_on_one_gpu_takes_that_gpu_out_and_moves_only_the_job_on_it(responder, store):
    on_a(responder)
    responder.accept([Sample(NOW, "a", "xid", 79.0, gpu=3)])
    assert calls(responder, "set_node_health") == []                     # the node keeps its other seven GPUs
    [out] = calls(responder, "set_gpus_out")
    assert out[1:3] == ("a", {3: "xid-79"}) and "GPU 3" in out[3]
    # j1's rank 1 sits on GPU 3; its rank 0 (GPUs 0-1) writes the checkpoint; j3 (GPUs 4-7) is not asked
    [annotate] = calls(responder, "annotate")
    assert annotate[1:4] == ("trainingjobs", "default", "j1")
    request = json.loads(annotate[5])
    assert request["restart"] is False and "GPU 3 of node a" in request["reason"]
    recorded = {(r.kind, r.object) for r in store.decisions(limit=50).items}
    assert {("detection", "a"), ("gpu-out-of-service", "a"), ("checkpoint-request", "default/j1")} <= recorded
    assert not any(o == "default/j3" for _, o in recorded)
    assert store.node("a")[0].gpus_out == {"3": "xid-79"}


def test_a_job_whose_rank_0_sat_on_the_lost_gpu_restarts_from_its_last_checkpoint(responder):
    on_a(responder)
    responder.accept([Sample(NOW, "a", "xid", 79.0, gpu=1)])
    [annotate] = calls(responder, "annotate")
    assert annotate[3] == "j1" and json.loads(annotate[5])["restart"] is True


def test_a_second_fault_kind_on_the_same_gpu_costs_nothing_more_and_return_to_service_forgets_it(responder, clock):
    on_a(responder)
    responder.accept([Sample(NOW, "a", "xid", 79.0, gpu=3)])
    clock.now = NOW + 1
    responder.accept([Sample(clock.now, "a", "ecc_uncorrected", 2.0, gpu=3)])
    assert [c[2] for c in calls(responder, "set_gpus_out")] == [{3: "xid-79"}, {3: "xid-79"}]
    assert calls(responder, "set_node_health") == []
    responder.release("a")
    assert responder._gpus_out == {} and responder.monitor.active_on("a") == []


def test_the_taint_budget_counts_gpus_for_device_faults(responder, store):
    on_a(responder)
    responder.budget = TaintBudget(TaintBudgetConfig(window=600.0, gpu_fraction=0.1))  # 16 GPUs: 1 may go out
    responder.accept([Sample(NOW, "a", "xid", 79.0, gpu=3), Sample(NOW, "b", "xid", 79.0, gpu=5)])
    assert [c[1] for c in calls(responder, "set_gpus_out")] == ["a"]
    [held] = [r for r in store.decisions(limit=50).items if r.kind == "action-suppressed"]
    assert held.object == "b" and "GPUs" in held.reason
