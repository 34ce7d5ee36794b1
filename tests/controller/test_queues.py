"""Teams' Queues in the controller: the mirror, loans, reclaims in the decision history, usage over time, the
/v1/queues routes and the per-queue metrics (real SQLite and PostgreSQL)."""

import json

import pytest

from controller_fixtures import NOW, READER, auth, iso, serving, training_job
from flotilla.controller.mirror import parse_serving_deployment, parse_training_job
from flotilla.controller.queues import Loan, loans, parse_queue, queue_spec
from flotilla.controller.reclaims import reclaim_sign
from flotilla.tenancy import QueueSpec, Quota
from test_metrics import scrape


def queue(name, nominal, *, parent=None, used=0, borrowed=0, lent=0, admitted=0, pending=0, guaranteed=0,
          borrowing_limit=None, lending_limit=None, weight=None, namespaces=(), uid="u", conditions=()):
    gpu = {"name": "nvidia.com/gpu", "nominal": nominal}
    if borrowing_limit is not None:
        gpu["borrowingLimit"] = borrowing_limit
    if lending_limit is not None:
        gpu["lendingLimit"] = lending_limit
    spec = {"resources": [gpu, {"name": "cpu", "nominal": 64}], "namespaces": list(namespaces)}
    if parent:
        spec["parent"] = parent
    if weight is not None:
        spec["weight"] = weight
    return {"apiVersion": "flotilla.dev/v1alpha1", "kind": "Queue", "metadata": {"name": name, "uid": uid},
            "spec": spec,
            "status": {"nominal": nominal, "used": used, "borrowed": borrowed, "lent": lent, "admitted": admitted,
                       "pending": pending, "guaranteed": guaranteed, "conditions": list(conditions)}}


def reclaimed(name, queue_name, placement, *, since=NOW - 20, to="team-b", **kw):
    obj = training_job(name, placement=placement, **kw)
    obj["status"]["queue"] = queue_name
    obj["status"]["conditions"].append({"type": "Allocated", "status": "True", "reason": "Reclaimed",
                                        "message": f"giving 4 GPUs back to queue {to}: within its nominal share",
                                        "lastTransitionTime": iso(since)})
    return obj


def in_queue(obj, name):
    obj["status"]["queue"] = name
    return obj


def test_parse_queue_reads_the_gpu_quota_and_names_bad_fields():
    rec = parse_queue(queue("a", 8, borrowing_limit=4, lending_limit=2, weight=2, namespaces=["ns-a"],
                            parent="dept", used=10, borrowed=2))
    assert (rec.nominal, rec.borrowing_limit, rec.lending_limit, rec.weight, rec.parent) == (8, 4, 2, 2.0, "dept")
    assert rec.usage["used"] == 10 and rec.usage["borrowed"] == 2 and rec.namespaces == ("ns-a",)
    assert queue_spec(rec) == QueueSpec("a", {"nvidia.com/gpu": Quota(8, 4, 2)}, 2.0, "dept", ("ns-a",))
    bad = queue("a", 8)
    bad["spec"]["resources"][0]["nominal"] = "eight"
    with pytest.raises(ValueError, match=r"spec.resources\[0\].nominal"):
        parse_queue(bad)
    bad = queue("a", 8)
    bad["status"]["used"] = 1.5
    with pytest.raises(ValueError, match="status.used"):
        parse_queue(bad)
    with pytest.raises(ValueError, match="metadata.name"):
        parse_queue({"metadata": {}, "spec": {"resources": []}})


@pytest.mark.parametrize("queues, expected", [
    # one lender, one borrower: exact
    ([queue("a", 8, used=12, borrowed=4), queue("b", 8, used=4, lent=4)], [Loan("b", "a", 4)]),
    # two lenders: split in proportion to what each lent, summing to what was borrowed
    ([queue("a", 0, used=5, borrowed=5), queue("b", 8, lent=6), queue("c", 4, lent=3)],
     [Loan("b", "a", 3), Loan("c", "a", 2)]),
    # siblings lend first, then the other lenders; no lender gives more than it lent
    ([queue("d1", 8), queue("a", 4, parent="d1", borrowed=5, used=9), queue("b", 4, parent="d1", lent=2),
      queue("d2", 8, lent=8), queue("c", 4, borrowed=5, used=9)],
     [Loan("b", "a", 2), Loan("d2", "a", 3), Loan("d2", "c", 5)]),
    # nothing lent: no loans
    ([queue("a", 8, used=8), queue("b", 8)], []),
])
def test_loans(queues, expected):
    assert loans([parse_queue(q) for q in queues]) == expected


def test_reclaim_sign_from_condition_or_checkpoint_request():
    sign = reclaim_sign(reclaimed("j", "team-a", {"a": 4}))
    assert sign is not None and sign.to_queue == "team-b" and sign.since == NOW - 20
    assert sign.reason.startswith("Reclaimed: giving 4 GPUs back")
    # as the operator asks: the shrink's reason names the reclaim, and the checkpoint request carries it
    request = {"generation": 3, "time": iso(NOW - 5),
               "reason": "reclaim: gives 4 GPUs back to queue 'team-c' through a checkpoint (nominal share needed); "
                         "marginal gain"}
    obj = training_job("j", annotations={"flotilla.dev/checkpoint-request": json.dumps(request)})
    sign = reclaim_sign(obj)
    assert sign is not None and sign.to_queue == "team-c" and sign.since == NOW - 5
    assert sign.signal == "checkpoint-request:3"
    request["reason"] = "drain node a"
    assert reclaim_sign(training_job("j", annotations={"flotilla.dev/checkpoint-request": json.dumps(request)})) is None
    assert reclaim_sign(training_job("j")) is None


def test_queue_mirror_records_usage_and_loans(store, clock):
    store.upsert_queue(parse_queue(queue("team-a", 8)))
    clock.now += 10
    res = store.upsert_queue(parse_queue(queue("team-a", 8, used=12, borrowed=4, admitted=2,
                                               conditions=[{"type": "Ready", "status": "True",
                                                            "reason": "Borrowing", "message": "team-b is idle",
                                                            "lastTransitionTime": iso(NOW)}])))
    assert [(d.kind, d.inputs["field"]) for d in res.decisions] == [("loan", "borrowed")]
    assert res.decisions[0].reason == "borrowed 4 GPUs (now borrowed 4): Borrowing: team-b is idle"
    clock.now += 10
    store.upsert_queue(parse_queue(queue("team-a", 8, used=12, borrowed=4, admitted=2)))  # no change: no point
    clock.now += 10
    res = store.upsert_queue(parse_queue(queue("team-a", 6, used=6, admitted=2)))
    assert {d.kind for d in res.decisions} == {"loan", "quota"}
    points = store.queue_usage("team-a", limit=100).items
    assert [(p.time - NOW, p.used, p.borrowed, p.nominal) for p in points] == [
        (0, 0, 0, 8), (10, 12, 4, 8), (30, 6, 0, 6)]
    store.delete_object("Queue", "team-a")
    assert store.queue("team-a") is None and len(store.queue_usage("team-a", limit=100).items) == 3


def test_reclaim_is_recorded_with_its_reason_and_duration(store, controller, client, clock):
    store.upsert_queue(parse_queue(queue("team-a", 4, used=8, borrowed=4)))
    store.upsert_queue(parse_queue(queue("team-b", 8, lent=4)))
    store.upsert_job(parse_training_job(in_queue(training_job("borrower", placement={"a": 8}), "team-a")))
    clock.now += 3
    res = store.upsert_job(parse_training_job(reclaimed("borrower", "team-a", {"a": 4}, since=NOW - 20)))
    controller.metrics.decided(res.decisions, res.reshard_seconds)
    reclaim = [d for d in res.decisions if d.kind == "reclaim"]
    assert len(reclaim) == 1 and reclaim[0].inputs == {
        "fromQueue": "team-a", "toQueue": "team-b", "gpusFrom": 8, "gpusTo": 4, "gpus": 4, "seconds": 23.0,
        "signal": f"condition:Allocated:{iso(NOW - 20)}"}
    assert "giving 4 GPUs back to queue team-b" in reclaim[0].reason
    # shrinking again under the same (stale) reclaim condition is no second reclaim
    res = store.upsert_job(parse_training_job(reclaimed("borrower", "team-a", {"a": 2}, since=NOW - 20)))
    assert "reclaim" not in {d.kind for d in res.decisions}
    # a job that grows, or shrinks with no reclaim asked, is no reclaim
    store.upsert_job(parse_training_job(in_queue(training_job("other", placement={"a": 8}), "team-a")))
    res = store.upsert_job(parse_training_job(in_queue(training_job("other", placement={"a": 2}), "team-a")))
    assert "reclaim" not in {d.kind for d in res.decisions}
    # a serving deployment giving GPUs back counts too
    store.upsert_serving(parse_serving_deployment(in_queue(serving("s", prefill=2, decode=2), "team-a")))
    shrunk = in_queue(serving("s", prefill=1, decode=1), "team-a")
    shrunk["status"]["conditions"] = [{"type": "Ready", "status": "True", "reason": "QueueReclaim",
                                       "message": "to queue team-b", "lastTransitionTime": iso(NOW)}]
    res = store.upsert_serving(parse_serving_deployment(shrunk))
    controller.metrics.decided(res.decisions)
    assert [d.inputs["gpus"] for d in res.decisions if d.kind == "reclaim"] == [3]
    body = client.get("/v1/queues/team-b", headers=auth(READER)).json()
    assert [r["object"] for r in body["reclaims"]] == ["default/s", "default/borrower"]
    m = scrape(client)
    assert m[("flotilla_queue_reclaims_total", (("from_queue", "team-a"), ("queue", "team-b")))] == 2
    assert m[("flotilla_queue_reclaimed_gpus_total", (("from_queue", "team-a"), ("queue", "team-b")))] == 7
    assert m[("flotilla_queue_reclaim_duration_seconds_sum", (("queue", "team-b"),))] == 23.0 + 3.0


def test_queue_routes(client, store, clock):
    store.upsert_queue(parse_queue(queue("dept", 16, used=12)))
    store.upsert_queue(parse_queue(queue("team-a", 8, parent="dept", used=10, borrowed=2, admitted=2, pending=1,
                                         guaranteed=6, namespaces=["ns-a"])))
    store.upsert_queue(parse_queue(queue("team-b", 8, parent="dept", used=2, lent=2, admitted=1)))
    store.upsert_job(parse_training_job(in_queue(training_job("j1", "ns-a", placement={"a": 6}), "team-a")))
    store.upsert_job(parse_training_job(in_queue(training_job("j2", "ns-a", placement={"b": 4},
                                                              deadline_met=False), "team-a")))
    store.upsert_job(parse_training_job(in_queue(training_job("j3", "ns-b", placement={"c": 2}), "team-b")))
    store.upsert_serving(parse_serving_deployment(in_queue(serving("s", "ns-b"), "team-b")))
    clock.now += 60
    store.upsert_queue(parse_queue(queue("team-a", 8, parent="dept", used=8, admitted=2, guaranteed=6,
                                         namespaces=["ns-a"])))
    store.upsert_queue(parse_queue(queue("team-b", 8, parent="dept", used=2, admitted=1)))

    items = client.get("/v1/queues", headers=auth(READER)).json()["items"]
    assert [q["name"] for q in items] == ["dept", "team-a", "team-b"]
    a = items[1]
    assert a["spec"]["parent"] == "dept" and a["spec"]["resources"][0] == {"name": "nvidia.com/gpu", "nominal": 8}
    assert a["status"]["used"] == 8 and a["status"]["guaranteed"] == 6
    assert a["outlook"]["on-track"] == 1 and a["outlook"]["at-risk"] == 1

    body = client.get("/v1/queues/team-a", headers=auth(READER)).json()
    assert [j["key"] for j in body["jobs"]] == ["ns-a/j1", "ns-a/j2"] and body["serving"] == []
    assert body["jobs"][0]["queue"] == "team-a"
    assert body["loans"] == {"lentTo": [], "borrowedFrom": []}  # it gave back what it borrowed
    assert [h["kind"] for h in body["history"]] == ["loan", "loan"]  # gave back 2, borrowed 2 (newest first)
    assert client.get("/v1/queues/dept", headers=auth(READER)).json()["children"] == ["team-a", "team-b"]
    b = client.get("/v1/queues/team-b", headers=auth(READER)).json()
    assert [s["key"] for s in b["serving"]] == ["ns-b/s"] and [j["key"] for j in b["jobs"]] == ["ns-b/j3"]

    usage = client.get("/v1/queues/team-a/usage", headers=auth(READER)).json()
    assert [(u["time"], u["used"], u["borrowed"]) for u in usage["items"]] == [
        (iso(NOW), 10, 2), (iso(NOW + 60), 8, 0)]
    page = client.get("/v1/queues/team-a/usage", params={"limit": 1}, headers=auth(READER)).json()
    assert len(page["items"]) == 1 and page["nextCursor"] is not None
    rest = client.get("/v1/queues/team-a/usage", params={"cursor": page["nextCursor"]}, headers=auth(READER)).json()
    assert [u["used"] for u in rest["items"]] == [8]
    since = client.get("/v1/queues/team-a/usage", params={"since": iso(NOW + 30)}, headers=auth(READER)).json()
    assert [u["used"] for u in since["items"]] == [8]

    for path in ("/v1/queues/nope", "/v1/queues/nope/usage"):
        r = client.get(path, headers=auth(READER))
        assert r.status_code == 404 and r.json()["error"]["message"] == "Queue 'nope' not found"
    assert client.get("/v1/queues").status_code == 401


def test_queue_metrics(client, store):
    store.upsert_queue(parse_queue(queue("team-a", 8, used=12, borrowed=4, admitted=3, pending=2, guaranteed=6)))
    store.upsert_queue(parse_queue(queue("team-b", 8, lent=4)))
    m = scrape(client)
    assert m[("flotilla_queue_nominal_gpus", (("queue", "team-a"),))] == 8
    assert m[("flotilla_queue_used_gpus", (("queue", "team-a"),))] == 12
    assert m[("flotilla_queue_borrowed_gpus", (("queue", "team-a"),))] == 4
    assert m[("flotilla_queue_lent_gpus", (("queue", "team-b"),))] == 4
    assert m[("flotilla_queue_guaranteed_gpus", (("queue", "team-a"),))] == 6
    assert m[("flotilla_queue_jobs", (("queue", "team-a"), ("state", "admitted")))] == 3
    assert m[("flotilla_queue_jobs", (("queue", "team-a"), ("state", "pending")))] == 2
