"""Queues in the operator's reconcile pass: a borrower gives GPUs back through a checkpoint when the owner
needs them, and says why; a job naming a missing queue waits with a condition; Queue status is written."""

from __future__ import annotations

import json

import pytest

from flotilla.allocation import policies
from flotilla.operator.actions import PatchAnnotations, PatchStatus, PostEvent
from flotilla.operator.reconcile import Planner, reconcile
from flotilla.resources import names
from tests.operator_plan.builders import T0, node, trainingjob
from tests.operator_plan.test_pool_plan import NOW, job, running, workers
from tests.operator_queues.test_glue import qbody

NODES = {n: node(n) for n in ("n0", "n1")}
QUEUES = {"a": qbody("a", 8, ["ns"]), "b": qbody("b", 8)}


def deadline_job(name="b", queue="b"):
    body = trainingjob(name, min_gpus=4, max_gpus=8, deadline_seconds=3600)
    body["spec"]["totalSteps"] = 5000
    body["spec"]["throughput"] = [{"gpus": 1, "stepsPerSecond": 1.0}, {"gpus": 8, "stepsPerSecond": 8.0}]
    body["spec"]["queue"] = queue
    return body


def run(jobs, pods, queues=QUEUES, now=NOW):
    return reconcile(now, policies.get("elastic-deadline"), jobs, NODES, pods, {}, {}, queue_bodies=queues)


def patch_of(actions, name, plural="trainingjobs"):
    return next((a.status for a in actions if isinstance(a, PatchStatus) and a.name == name and a.plural == plural),
                {})


def test_team_a_borrows_b_s_idle_gpus_and_queue_status_says_so():
    alone = job()
    actions = run({"ns/a": alone}, {})
    placed = patch_of(actions, "a")
    assert placed["gpus"] == 16 and placed["queue"] == "a"  # all of it: b lends its 8 while idle
    a, b = patch_of(actions, "a", "queues"), patch_of(actions, "b", "queues")
    assert (a["nominal"], a["used"], a["borrowed"]) == (8, 16, 8)
    assert (b["used"], b["lent"]) == (0, 8)
    assert {c["type"]: c["status"] for c in a["conditions"]} == {"Valid": "True", "Borrowing": "True",
                                                                 "Lending": "False"}


def test_team_b_s_deadline_job_takes_its_nominal_back_through_a_checkpoint_of_the_borrower():
    full = {"n0": 8, "n1": 8}
    actions = run({"ns/a": job(running(full)), "ns/b": deadline_job()}, workers(full))
    ask = next(a for a in actions if isinstance(a, PatchAnnotations) and a.name == "a")
    request = json.loads(ask.annotations["flotilla.dev/checkpoint-request"])
    assert "reclaim" in request["reason"] and "queue 'b'" in request["reason"]
    assert patch_of(actions, "a")["phase"] == "Resharding"
    (event,) = [e for e in actions if isinstance(e, PostEvent) and e.reason == names.Reason.RECLAIMED]
    # What b's own share would give its job (its maxGPUs 8, within b's nominal 8), in one checkpoint.
    assert event.involved["name"] == "a" and "gives 8 GPUs back to queue 'b'" in event.message
    checkpoint = [e for e in actions if isinstance(e, PostEvent) and e.reason == names.Reason.CHECKPOINT_REQUESTED]
    assert checkpoint and "reclaim" in checkpoint[0].message
    # b's job waits for the GPUs being given back, admitted against b's own nominal.
    b = patch_of(actions, "b")
    assert b.get("queue") == "b"
    # ... but is not placed on them while a's workers still run there: no GPU is promised twice.
    assert not b.get("placement") and "waits for GPUs being given back" in b.get("message", "")
    assert patch_of(actions, "b", "queues")["pending"] + patch_of(actions, "b", "queues").get("admitted", 0) >= 1


@pytest.mark.parametrize("interval, reason, says", [
    (None, names.Reason.RECLAIM_STOPS, "loses its progress"),
    (100, names.Reason.RECLAIMED, "gives 16 GPUs back to queue 'b'"),
])
def test_a_borrower_left_with_nothing_is_stopped_only_when_it_has_no_checkpoint(interval, reason, says):
    full = {"n0": 8, "n1": 8}
    borrower = job(running(full))
    if interval:
        borrower["spec"]["checkpoint"] = {"intervalSteps": interval}
    owner = deadline_job()
    owner["spec"]["elasticity"] = {"minGPUs": 16, "maxGPUs": 16, "gpusPerWorker": 1}
    owner["spec"]["throughput"] = [{"gpus": 16, "stepsPerSecond": 16.0}]
    queues = {"a": qbody("a", 0, ["ns"]), "b": qbody("b", 16)}
    actions = run({"ns/a": borrower, "ns/b": owner}, workers(full), queues=queues)
    found = [e for e in actions if isinstance(e, PostEvent) and e.reason == reason]
    assert found and says in found[0].message and found[0].involved["name"] == "a"


def test_a_job_naming_a_missing_queue_waits_with_a_condition_and_disturbs_nothing():
    full = {"n0": 8, "n1": 8}
    actions = run({"ns/a": job(running(full)), "ns/lost": deadline_job("lost", queue="nope")}, workers(full))
    lost = patch_of(actions, "lost")
    cond = next(c for c in lost["conditions"] if c["type"] == names.COND_QUEUE)
    assert (cond["status"], cond["reason"]) == ("False", names.Reason.QUEUE_NOT_FOUND)
    assert "'nope' does not exist" in cond["message"]
    assert lost.get("phase") in (None, "Pending") and not lost.get("gpus")
    assert not any(isinstance(a, PatchAnnotations) and a.name == "a" for a in actions)  # a keeps running


def test_a_job_naming_a_queue_before_any_exists_waits_too():
    actions = run({"ns/lost": deadline_job("lost", queue="nope")}, {}, queues={}, now=T0 + 60)
    lost = patch_of(actions, "lost")
    assert not lost.get("gpus")
    assert any(c["reason"] == names.Reason.QUEUE_NOT_FOUND for c in lost["conditions"])


def test_the_incremental_planner_announces_a_reclaim_once():
    full = {"n0": 8, "n1": 8}
    planner = Planner()
    jobs = {"ns/a": job(running(full)), "ns/b": deadline_job()}
    first = planner.plan(NOW, policies.get("elastic-deadline"), jobs, NODES, workers(full), {}, {},
                         queue_bodies=QUEUES)
    second = planner.plan(NOW + 1, policies.get("elastic-deadline"), jobs, NODES, workers(full), {}, {},
                          queue_bodies=QUEUES)
    count = lambda out: sum(isinstance(a, PostEvent) and a.reason == names.Reason.RECLAIMED  # noqa: E731
                            for _, _, acts in out for a in acts)
    assert (count(first), count(second)) == (1, 0)
