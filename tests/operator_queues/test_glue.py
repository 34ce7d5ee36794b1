"""The operator's queue glue without the decision: which queue each object is in, what one whose queue is
missing gets, the status it writes on objects and on Queues."""

from __future__ import annotations

from flotilla.allocation import Verdict
from flotilla.operator import queues, training
from flotilla.operator.actions import PatchStatus
from flotilla.resources import names
from flotilla.tenancy import QueueProblem, QueueUsage
from tests.operator_plan.builders import T0, trainingjob

NOW = T0 + 60


def qbody(name, nominal, namespaces=(), status=None, **spec):
    return {"apiVersion": "flotilla.dev/v1alpha1", "kind": "Queue",
            "metadata": {"name": name, "uid": f"q-{name}", "generation": 1},
            "spec": {"resources": [{"name": "nvidia.com/gpu", "nominal": nominal}],
                     "namespaces": list(namespaces), **spec},
            "status": status or {}}


def job(name="j", queue=None, status=None, namespace="ns"):
    body = trainingjob(name, status=status)
    body["metadata"]["namespace"] = namespace
    if queue is not None:
        body["spec"]["queue"] = queue
    return body


def tenancy(*bodies):
    return queues.read({b["metadata"]["name"]: b for b in bodies}, named=False)


def test_no_queues_and_no_job_naming_one_is_no_tenancy():
    assert queues.read({}, named=False) is None
    assert queues.names_a_queue([job()]) is False
    assert queues.names_a_queue([job(queue="a")]) is True
    assert queues.read({}, named=True) is not None


def test_a_job_is_in_the_queue_it_names_else_its_namespaces_else_none():
    t = tenancy(qbody("a", 4, ["ns"]), qbody("b", 4))
    assert queues.place(t, job()) == queues.Placed("a")
    assert queues.place(t, job(queue="b")) == queues.Placed("b")
    assert queues.place(t, job(namespace="other")) == queues.Placed("")


def test_a_job_naming_a_missing_or_malformed_queue_is_told_so():
    broken = qbody("bad", 4)
    broken["spec"]["resources"] = [{"name": "nvidia.com/gpu", "nominal": "four"}]
    t = tenancy(qbody("a", 4), broken)
    missing = queues.place(t, job(queue="nope"))
    assert (missing.queue, missing.reason) == ("nope", names.Reason.QUEUE_NOT_FOUND)
    assert "spec.queue" in missing.problem and "'nope' does not exist" in missing.problem
    bad = queues.place(t, job(queue="bad"))
    assert bad.reason == names.Reason.QUEUE_INVALID and "spec.resources[0].nominal" in bad.problem


def test_the_object_status_names_its_queue_and_a_condition_once():
    t = tenancy(qbody("a", 4, ["ns"]))
    body = job()
    patch = queues.object_status(body, queues.place(t, body), NOW)
    assert patch["queue"] == "a"
    (cond,) = patch["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == (names.COND_QUEUE, "True", "QueueResolved")
    written = job(status={"queue": "a", "conditions": patch["conditions"]})
    assert queues.object_status(written, queues.place(t, written), NOW + 5) == {}


def test_no_queue_writes_nothing_on_a_job_that_never_had_one():
    t = tenancy(qbody("a", 4, ["elsewhere"]))
    body = job()
    assert queues.object_status(body, queues.place(t, body), NOW) == {}


def test_missing_queue_condition_merges_into_the_plans_own_status_patch():
    t = tenancy(qbody("a", 4))
    body = job(queue="nope")
    plan_patch = PatchStatus(training.PLURAL, "ns", "j", {"phase": "Pending", "conditions": [
        {"type": "Admitted", "status": "False", "reason": "Pending", "message": "", "lastTransitionTime": "x"}]})
    mine = queues.object_status(body, queues.place(t, body), NOW)
    (merged,) = queues.merge_status([plan_patch], training.PLURAL, body, mine, NOW)
    assert merged.status["phase"] == "Pending" and merged.status["queue"] == "nope"
    types = {c["type"]: c for c in merged.status["conditions"]}
    assert types["Admitted"]["reason"] == "Pending"
    assert types[names.COND_QUEUE]["status"] == "False"
    assert types[names.COND_QUEUE]["reason"] == names.Reason.QUEUE_NOT_FOUND


def _state(body):
    return training.job_state(body)


def test_a_job_with_a_missing_queue_waits_and_a_running_one_goes_to_the_decision():
    t = tenancy(qbody("a", 4))
    waiting = job("w", queue="nope")
    running = job("r", queue="nope", status={"phase": "Running", "placement": [{"node": "n0", "gpus": 2}],
                                             "gpus": 2, "guaranteedShare": 2})
    fine = job("f", queue="a")
    fine["spec"]["priority"] = 7
    bodies = {training.key_of(b): b for b in (waiting, running, fine)}
    out = queues.assign(t, [_state(b) for b in bodies.values()], [], bodies, {})
    assert [(j.key, j.queue) for j in out.jobs] == [("ns/r", "nope"), ("ns/f", "a")]
    assert out.jobs[1].priority == 7
    assert list(out.waiting) == ["ns/w"] and out.waiting["ns/w"].verdict is Verdict.PENDING
    assert not out.waiting["ns/w"].placement and "does not exist" in out.waiting["ns/w"].reason


def test_queue_status_from_the_decision_and_the_problem_named_by_its_crd_field():
    t = tenancy(qbody("a", 4), qbody("b", 4))
    usage = {"a": QueueUsage(nominal=4, used=6, borrowed=2, lent=0, admitted=1, pending=0, guaranteed=2),
             "b": QueueUsage(nominal=4, used=2, borrowed=0, lent=2, admitted=1, pending=1, guaranteed=2)}
    problem = QueueProblem("b", "spec.quotas[nvidia.com/gpu].lendingLimit", "lendingLimit (5) must be <= nominal (4)")
    out = dict((key, acts) for _, key, acts in queues.queue_status(t, usage, [problem], NOW))
    (a,) = out["a"]
    assert a.plural == "queues" and a.namespace == ""
    assert {k: a.status[k] for k in queues.USAGE_FIELDS} == {"nominal": 4, "used": 6, "borrowed": 2, "lent": 0,
                                                             "admitted": 1, "pending": 0, "guaranteed": 2}
    conds = {c["type"]: c for c in a.status["conditions"]}
    assert conds["Valid"]["status"] == "True" and conds["Borrowing"]["status"] == "True"
    b = {c["type"]: c for c in out["b"][0].status["conditions"]}
    assert b["Valid"]["status"] == "False"
    assert "spec.resources[nvidia.com/gpu].lendingLimit" in b["Valid"]["message"]
    assert b["Lending"]["status"] == "True"
    # Written once: a queue that already shows it gets no patch.
    shown = qbody("a", 4, status=a.status)
    assert queues.queue_status(tenancy(shown, qbody("b", 4, status=out["b"][0].status)), usage, [problem],
                               NOW + 10) == []
