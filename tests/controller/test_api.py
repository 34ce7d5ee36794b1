"""Every API route: answers, auth failures, bad input, idempotency (SQLite and PostgreSQL)."""

import json

import pytest

from controller_fixtures import ADMIN, AGENT, NOW, READER, auth, iso, node, serving, training_job
from flotilla.controller.actions import ClusterActionError, ClusterUnavailable, ObjectNotFound
from flotilla.controller.mirror import parse_node, parse_serving_deployment, parse_training_job

ROUTES = [
    ("GET", "/metrics", "read"),
    ("GET", "/v1/cluster", "read"),
    ("GET", "/v1/cluster/domains", "read"),
    ("GET", "/v1/gpumap", "read"),
    ("GET", "/v1/timeline", "read"),
    ("GET", "/v1/whoami", "read"),
    ("GET", "/v1/jobs", "read"),
    ("GET", "/v1/jobs/default/j1", "read"),
    ("GET", "/v1/jobs/default/j1/history", "read"),
    ("POST", "/v1/jobs/default/j1/checkpoint", "admin"),
    ("PATCH", "/v1/jobs/default/j1", "admin"),
    ("GET", "/v1/serving", "read"),
    ("GET", "/v1/serving/default/s1", "read"),
    ("GET", "/v1/serving/default/s1/history", "read"),
    ("POST", "/v1/serving/default/s1/replan", "admin"),
    ("GET", "/v1/nodes", "read"),
    ("GET", "/v1/nodes/a", "read"),
    ("GET", "/v1/nodes/a/history", "read"),
    ("POST", "/v1/nodes/a/drain", "admin"),
    ("POST", "/v1/nodes/a/return-to-service", "admin"),
    ("GET", "/v1/decisions", "read"),
    ("GET", "/v1/queues", "read"),
    ("GET", "/v1/queues/q", "read"),
    ("GET", "/v1/queues/q/usage", "read"),
    ("POST", "/v1/ingest", "ingest"),
    ("POST", "/v1/serving/default/s1/stats", "ingest"),
    ("POST", "/v1/serving/default/s1/stats/prometheus", "ingest"),
]


@pytest.fixture
def cluster(store):
    """Two racks, three nodes; two jobs on node a; one serving deployment."""
    for obj in (node("a", labels={"flotilla.dev/rack": "r1"}), node("b", labels={"flotilla.dev/rack": "r1"}),
                node("c", 4, labels={"flotilla.dev/rack": "r2"}, healthy=False, unschedulable=True,
                     taint_effect="NoExecute")):
        store.upsert_node(parse_node(obj))
    store.upsert_job(parse_training_job(training_job("j1", placement={"a": 4})))
    store.upsert_job(parse_training_job(training_job("j2", "team", placement={"a": 2, "b": 2}, deadline_met=False)))
    store.upsert_job(parse_training_job(training_job("done", placement={}, phase="Succeeded")))
    store.upsert_serving(parse_serving_deployment(serving("s1")))
    return store


STATS = {"windowSeconds": 10, "requestsPerSecond": 4.0, "meanPromptTokens": 512, "meanOutputTokens": 128}


def body_for(path):
    if path == "/v1/ingest":
        return {"node": "a", "samples": []}
    return STATS if path.endswith("/stats") else {}


sqlite_only = pytest.mark.parametrize("migrated_db_url", ["sqlite"], indirect=True)  # auth needs no database twice


@sqlite_only
@pytest.mark.parametrize("method, path, role", ROUTES)
def test_every_route_needs_a_valid_token(client, method, path, role):
    r = client.request(method, path, json=body_for(path))
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    assert "bearer token" in r.json()["error"]["message"]
    r = client.request(method, path, json=body_for(path), headers=auth("not-a-known-token-at-all"))
    assert r.status_code == 401 and "unknown" in r.json()["error"]["message"]
    r = client.request(method, path, json=body_for(path), headers={"Authorization": f"Basic {ADMIN}"})
    assert r.status_code == 401


@sqlite_only
@pytest.mark.parametrize("method, path, role", ROUTES)
def test_roles(client, cluster, method, path, role):
    for token, token_role in ((READER, "read"), (AGENT, "ingest"), (ADMIN, "admin")):
        r = client.request(method, path, json=body_for(path), headers=auth(token))
        allowed = token_role == "admin" or token_role == role
        assert (r.status_code != 403) == allowed, (token_role, r.status_code, r.text)
        if not allowed:
            assert f"needs the {role!r} role" in r.json()["error"]["message"]


def test_cluster_after_every_job_finished_counts_no_training_gpus(client, store):
    """As after `make demo`: both jobs Succeeded, their status.placement left as it was."""
    for n in ("a", "b", "c"):
        store.upsert_node(parse_node(node(n, 8)))
    store.upsert_job(parse_training_job(training_job("small", placement={"a": 8}, phase="Succeeded")))
    store.upsert_job(parse_training_job(training_job("big", placement={"b": 8, "c": 8}, phase="Succeeded")))
    capacity = client.get("/v1/cluster", headers=auth(READER)).json()["capacity"]
    assert capacity["trainingGpus"] == 0 and capacity["freeGpus"] == 24
    nodes = client.get("/v1/nodes", headers=auth(READER)).json()["items"]
    assert sum(n["gpus"]["free"] for n in nodes) == capacity["freeGpus"]


def test_probes(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready", "schema": "0008"}
    assert client.get("/openapi.json").json()["info"]["title"] == "Flotilla controller"


def test_cluster(client, cluster):
    body = client.get("/v1/cluster", headers=auth(READER)).json()
    assert body["capacity"] == {"nodes": 3, "gpus": 20, "schedulableGpus": 16, "trainingGpus": 8,
                                "servingGpus": 10, "freeGpus": 0}
    assert body["outlook"] == {"on-track": 1, "at-risk": 1, "missed": 0, "rejected": 0, "done": 1,
                               "no-deadline": 0}
    assert body["nodes"] == {"total": 3, "unhealthy": 1, "cordoned": 1}
    domains = client.get("/v1/cluster/domains", headers=auth(READER)).json()
    assert domains == {"items": [
        {"domain": "r1", "nodes": 2, "gpus": {"total": 16, "schedulable": 16, "allocated": 8, "free": 8}},
        {"domain": "r2", "nodes": 1, "gpus": {"total": 4, "schedulable": 0, "allocated": 0, "free": 0}}],
        "nextCursor": None}


def test_jobs_list_filters_and_pages(client, cluster):
    get = lambda **q: client.get("/v1/jobs", params=q, headers=auth(READER))  # noqa: E731
    assert [j["key"] for j in get().json()["items"]] == ["default/done", "default/j1", "team/j2"]
    assert [j["key"] for j in get(namespace="team").json()["items"]] == ["team/j2"]
    assert [j["key"] for j in get(phase="Succeeded").json()["items"]] == ["default/done"]
    assert [j["key"] for j in get(outlook="at-risk").json()["items"]] == ["team/j2"]
    assert [j["key"] for j in get(node="b").json()["items"]] == ["team/j2"]
    first = get(limit=2).json()
    assert first["nextCursor"] == "default/j1"
    assert [j["key"] for j in get(limit=2, cursor=first["nextCursor"]).json()["items"]] == ["team/j2"]
    for bad in ({"limit": 0}, {"limit": 5000}, {"limit": "ten"}, {"outlook": "doomed"}):
        r = get(**bad)
        assert r.status_code == 422 and list(bad)[0] in r.json()["error"]["message"]


def test_job_detail_and_history(client, cluster, store, clock):
    clock.now += 30
    store.upsert_job(parse_training_job(training_job("j1", placement={"a": 4, "b": 4}, reshards=1)))
    body = client.get("/v1/jobs/default/j1", headers=auth(READER)).json()
    assert body["placement"] == [{"node": "a", "gpus": 4}, {"node": "b", "gpus": 4}]
    assert body["outlook"] == "on-track" and body["deadline"] == iso(NOW + 3600)
    assert [h["kind"] for h in body["history"]] == ["reshard", "allocation"]  # newest first
    hist = client.get("/v1/jobs/default/j1/history", params={"limit": 1}, headers=auth(READER)).json()
    assert len(hist["items"]) == 1 and hist["nextCursor"] is not None
    r = client.get("/v1/jobs/default/nope", headers=auth(READER))
    assert r.status_code == 404 and r.json()["error"]["message"] == "TrainingJob default/nope not found"
    assert client.get("/v1/jobs/default/nope/history", headers=auth(READER)).status_code == 404


def test_checkpoint_request_is_idempotent(client, cluster, controller, store):
    url = "/v1/jobs/default/j1/checkpoint"
    r = client.post(url, json={"reason": "test"}, headers=auth(ADMIN))
    assert r.status_code == 202 and r.json()["created"] is True
    req = r.json()["request"]
    assert (req["generation"], req["reason"], req["requestedBy"], req["restart"]) == (1, "test", "admin", False)
    [call] = controller.actions.calls
    assert call[:5] == ("annotate", "trainingjobs", "default", "j1", "flotilla.dev/checkpoint-request")
    assert json.loads(call[5]) == req
    # The same request again while unacknowledged: the pending request, no second action.
    r = client.post(url, json={"reason": "again"}, headers=auth(ADMIN))
    assert r.status_code == 200 and r.json() == {"created": False, "request": req}
    assert len(controller.actions.calls) == 1
    # The operator acknowledges (status.checkpoint.generation = 1): a new request gets generation 2.
    store.upsert_job(parse_training_job(training_job("j1", generation=1, annotations={
        "flotilla.dev/checkpoint-request": json.dumps(req)})))
    r = client.post(url, headers=auth(ADMIN))
    assert r.status_code == 202 and r.json()["request"]["generation"] == 2
    decisions = client.get("/v1/decisions", params={"kind": "checkpoint-request"}, headers=auth(READER)).json()
    assert [(d["actor"], d["inputs"]["generation"]) for d in decisions["items"]] == [("alice", 2), ("alice", 1)]


def test_idempotency_key_replays_and_refuses_reuse(client, cluster, controller, store):
    headers = {**auth(ADMIN), "Idempotency-Key": "k-1"}
    first = client.post("/v1/jobs/default/j1/checkpoint", json={"reason": "r"}, headers=headers)
    store.set_job_fields("default/j1", checkpoint_generation=1)  # acknowledged: a new request would act
    again = client.post("/v1/jobs/default/j1/checkpoint", json={"reason": "r"}, headers=headers)
    assert again.status_code == first.status_code == 202 and again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true" and len(controller.actions.calls) == 1
    other = client.post("/v1/jobs/default/j1/checkpoint", json={"reason": "different"}, headers=headers)
    assert other.status_code == 409 and "Idempotency-Key" in other.json()["error"]["message"]


def test_checkpoint_bad_input(client, cluster):
    url = "/v1/jobs/default/j1/checkpoint"
    r = client.post(url, json={"restart": "yes"}, headers=auth(ADMIN))
    assert r.status_code == 422 and "body.restart" in r.json()["error"]["message"]
    r = client.post(url, json={"reason": "x", "force": True}, headers=auth(ADMIN))
    assert r.status_code == 422 and "body.force" in r.json()["error"]["message"]
    r = client.post(url, content=b"{not json", headers={**auth(ADMIN), "Content-Type": "application/json"})
    assert r.status_code == 422
    assert client.post("/v1/jobs/default/nope/checkpoint", headers=auth(ADMIN)).status_code == 404
    r = client.post("/v1/jobs/default/done/checkpoint", headers=auth(ADMIN))
    assert r.status_code == 409 and "Succeeded" in r.json()["error"]["message"]


def test_patch_job_within_policy(client, cluster, controller):
    url = "/v1/jobs/default/j1"
    r = client.patch(url, json={"priority": 7, "deadline": iso(NOW + 7200)}, headers=auth(ADMIN))
    assert r.status_code == 200 and r.json()["changed"] is True
    assert r.json()["job"]["priority"] == 7 and r.json()["job"]["deadline"] == iso(NOW + 7200)
    assert controller.actions.calls == [("patch_spec", "trainingjobs", "default", "j1", {
        "priority": 7, "deadline": iso(NOW + 7200), "deadlineSeconds": None})]
    r = client.patch(url, json={"priority": 7}, headers=auth(ADMIN))
    assert r.status_code == 200 and r.json()["changed"] is False and len(controller.actions.calls) == 1
    kinds = [d["kind"] for d in client.get("/v1/jobs/default/j1", headers=auth(READER)).json()["history"]]
    assert kinds[:2] == ["deadline", "priority"]
    for bad, field in (({"priority": 1000}, "priority"), ({"priority": "5"}, "body.priority"),
                       ({"priority": 1.5}, "body.priority"), ({"deadline": iso(NOW - 1)}, "future"),
                       ({"deadline": iso(NOW + 400 * 86400)}, "days"),
                       ({"deadline": "2027-02-01T00:00:00"}, "body.deadline"), ({"gpus": 8}, "body.gpus")):
        r = client.patch(url, json=bad, headers=auth(ADMIN))
        assert r.status_code == 422 and field in r.json()["error"]["message"], (bad, r.text)
    assert client.patch("/v1/jobs/default/done", json={"priority": 1}, headers=auth(ADMIN)).status_code == 409


def test_serving_routes_and_replan(client, cluster, controller, store, clock):
    items = client.get("/v1/serving", headers=auth(READER)).json()["items"]
    assert [s["key"] for s in items] == ["default/s1"]
    body = client.get("/v1/serving/default/s1", headers=auth(READER)).json()
    assert body["plan"]["prefillReplicas"] == 2 and body["plan"]["gpus"] == 10
    assert body["observed"]["attainment"] == 0.93 and body["slo"]["ttftMs"] == 400
    r = client.post("/v1/serving/default/s1/replan", json={"reason": "traffic spike"}, headers=auth(ADMIN))
    assert r.status_code == 202 and r.json()["request"]["generation"] == 1
    r = client.post("/v1/serving/default/s1/replan", json={"reason": "traffic spike"}, headers=auth(ADMIN))
    assert r.status_code == 200 and r.json()["created"] is False and len(controller.actions.calls) == 1
    # The planner re-plans (lastPlan after the request): the next request acts again.
    clock.now += 60
    annotation = {"flotilla.dev/replan-request": json.dumps(r.json()["request"])}
    store.upsert_serving(parse_serving_deployment(serving("s1", prefill=3, last_plan=clock.now,
                                                          annotations=annotation)))
    r = client.post("/v1/serving/default/s1/replan", headers=auth(ADMIN))
    assert r.status_code == 202 and r.json()["request"]["generation"] == 2
    hist = client.get("/v1/serving/default/s1/history", headers=auth(READER)).json()["items"]
    assert [h["kind"] for h in hist] == ["replan-request", "plan", "replan-request"]
    assert client.get("/v1/serving/default/x", headers=auth(READER)).status_code == 404
    assert client.post("/v1/serving/default/x/replan", headers=auth(ADMIN)).status_code == 404


def test_nodes_list_and_detail(client, cluster, store):
    get = lambda **q: client.get("/v1/nodes", params=q, headers=auth(READER))  # noqa: E731
    assert [n["name"] for n in get().json()["items"]] == ["a", "b", "c"]
    assert [n["name"] for n in get(healthy="false").json()["items"]] == ["c"]
    assert [n["name"] for n in get(schedulable="true", domain="r1").json()["items"]] == ["a", "b"]
    assert get(healthy="maybe").status_code == 422
    a = get(limit=1).json()["items"][0]
    assert a["gpus"] == {"total": 8, "allocated": 6, "free": 2, "inService": 8, "outOfService": []}
    from flotilla.health.samples import Sample
    store.add_samples([Sample(NOW, "c", "xid", 79.0, gpu=3)])
    c = client.get("/v1/nodes/c", headers=auth(READER)).json()
    assert c["health"] == {"reason": "XidError", "message": "XID 79 on GPU 3"}
    assert c["taint"] == {"value": "XidError", "effect": "NoExecute"}
    assert [(s["metric"], s["value"], s["gpu"]) for s in c["evidence"]["latestSamples"]] == [("xid", 79.0, 3)]
    assert client.get("/v1/nodes/a", headers=auth(READER)).json()["jobs"] == ["default/j1", "team/j2"]
    assert client.get("/v1/nodes/zz", headers=auth(READER)).status_code == 404
    assert client.get("/v1/nodes/zz/history", headers=auth(READER)).status_code == 404


def test_drain_cordons_and_checkpoints_once(client, cluster, controller):
    r = client.post("/v1/nodes/a/drain", json={"reason": "bad fan"}, headers=auth(ADMIN))
    assert r.status_code == 202
    assert r.json()["checkpointRequests"] == {"default/j1": 1, "team/j2": 1}
    calls = controller.actions.calls
    assert calls[0] == ("set_unschedulable", "a", True)
    assert {(c[2], c[3]) for c in calls[1:]} == {("default", "j1"), ("team", "j2")}
    assert all(json.loads(c[5])["reason"] == "drain node a: bad fan" for c in calls[1:])
    r = client.post("/v1/nodes/a/drain", json={"reason": "bad fan"}, headers=auth(ADMIN))
    assert r.status_code == 200 and r.json()["changed"] is False and len(controller.actions.calls) == 3
    assert client.get("/v1/nodes/a", headers=auth(READER)).json()["unschedulable"] is True
    hist = client.get("/v1/nodes/a/history", headers=auth(READER)).json()["items"]
    assert [(h["kind"], h["actor"]) for h in hist] == [("drain", "alice")]
    assert client.post("/v1/nodes/zz/drain", headers=auth(ADMIN)).status_code == 404


def test_return_to_service(client, cluster, controller):
    r = client.post("/v1/nodes/c/return-to-service", json={"reason": "GPU replaced"}, headers=auth(ADMIN))
    assert r.status_code == 200 and r.json()["changed"] is True
    assert controller.actions.calls == [("set_node_health", "c", True, "ReturnedToService", "GPU replaced",
                                         "NoSchedule"), ("set_unschedulable", "c", False)]
    c = client.get("/v1/nodes/c", headers=auth(READER)).json()
    assert (c["healthy"], c["unschedulable"], c["taint"]) == (True, False, None)
    r = client.post("/v1/nodes/c/return-to-service", headers=auth(ADMIN))
    assert r.json()["changed"] is False and len(controller.actions.calls) == 2


def test_a_gpu_out_of_service_shows_on_the_node_and_the_map_and_return_to_service_gives_it_back(
        client, cluster, controller, store):
    sick = node("b", labels={"flotilla.dev/rack": "r1"})
    sick["metadata"]["annotations"] = {"flotilla.dev/unhealthy-gpus": json.dumps({"5": "xid-79"})}
    store.upsert_node(parse_node(sick))
    b = client.get("/v1/nodes/b", headers=auth(READER)).json()
    assert b["healthy"] is True and b["gpus"]["inService"] == 7 and b["gpus"]["free"] == 7 - b["gpus"]["allocated"]
    assert b["gpus"]["outOfService"] == [{"gpu": 5, "reason": "xid-79"}]
    [on_map] = [n for n in client.get("/v1/gpumap", headers=auth(READER)).json()["nodes"] if n["name"] == "b"]
    assert on_map["gpusOut"] == [{"gpu": 5, "reason": "xid-79"}] and on_map["state"] == "ok"
    r = client.post("/v1/nodes/b/return-to-service", json={"reason": "GPU replaced"}, headers=auth(ADMIN))
    assert r.status_code == 200 and r.json()["changed"] is True
    assert ("set_gpus_out", "b", {}, "GPU replaced") in controller.actions.calls
    assert client.get("/v1/nodes/b", headers=auth(READER)).json()["gpus"]["inService"] == 8


@pytest.mark.parametrize("failure, status", [
    (ObjectNotFound("default/j1"), 404), (ClusterUnavailable("offline"), 503), (ClusterActionError("boom"), 502)])
def test_cluster_action_failures(client, cluster, controller, failure, status):
    controller.actions.fail = failure
    r = client.post("/v1/jobs/default/j1/checkpoint", headers=auth(ADMIN))
    assert r.status_code == status and r.json()["error"]["message"]
    assert client.get("/v1/decisions", headers=auth(READER)).json()["items"] == []  # nothing acted, nothing recorded


def test_decisions_filters(client, cluster, store, clock):
    clock.now += 100
    store.upsert_node(parse_node(node("b", unschedulable=True, labels={"flotilla.dev/rack": "r1"})))
    clock.now += 100
    store.upsert_job(parse_training_job(training_job("j1", placement={"a": 8})))
    get = lambda **q: client.get("/v1/decisions", params=q, headers=auth(READER))  # noqa: E731
    assert [d["kind"] for d in get().json()["items"]] == ["allocation", "cordon"]
    assert [d["kind"] for d in get(objectKind="Node").json()["items"]] == ["cordon"]
    assert [d["kind"] for d in get(object="default/j1").json()["items"]] == ["allocation"]
    assert [d["kind"] for d in get(since=iso(NOW + 150)).json()["items"]] == ["allocation"]
    assert [d["kind"] for d in get(until=iso(NOW + 150)).json()["items"]] == ["cordon"]
    page = get(limit=1).json()
    assert [d["kind"] for d in get(limit=1, cursor=page["nextCursor"]).json()["items"]] == ["cordon"]
    for bad in ({"cursor": "abc"}, {"since": "yesterday"}, {"since": "2027-01-01T00:00:00"}):
        r = get(**bad)
        assert r.status_code == 422 and list(bad)[0] in r.json()["error"]["message"], r.text


def test_http_ingest(client, store):
    samples = [{"ts": NOW, "node": "a", "metric": "gpu_util", "value": 97, "gpu": 0, "job": "default/j1"},
               {"ts": NOW + 1, "node": "a", "metric": "xid", "value": 0.0},
               {"ts": NOW, "node": "a", "metric": "step_time", "value": 0.9, "gpu": 1, "job": "default/j1",
                "role": "pp1/4", "rank": 9}]
    r = client.post("/v1/ingest", json={"node": "a", "samples": samples}, headers=auth(AGENT))
    assert r.status_code == 202 and r.json() == {"accepted": 3, "deadLettered": 0}
    assert max(s.ts for s in store.latest_samples("a")) == NOW + 1
    from flotilla.controller import views
    step = [views.sample(s) for s in store.latest_samples("a") if s.metric == "step_time"]
    assert [(s["role"], s["rank"], s["job"], s["gpu"]) for s in step] == [("pp1/4", 9, "default/j1", 1)]
    for bad, field in (({"node": "a", "samples": [{**samples[0], "value": "97"}]}, "samples.0.value"),
                       ({"node": "a", "samples": [{**samples[0], "gpu": True}]}, "samples.0.gpu"),
                       # beyond any database's integer column: refused, never a 500 (found by test_fuzz)
                       ({"node": "a", "samples": [{**samples[0], "gpu": 2 ** 70}]}, "samples.0.gpu"),
                       ({"node": "a", "samples": [{**samples[0], "gpu": -1}]}, "samples.0.gpu"),
                       ({"node": "a", "samples": [{**samples[2], "rank": 2 ** 40}]}, "samples.0.rank"),
                       ({"node": "a", "samples": [{**samples[2], "role": ""}]}, "samples.0.role"),
                       ({"node": "a", "samples": [{**samples[2], "role": "x" * 64}]}, "samples.0.role"),
                       ({"node": "a", "samples": [{"ts": NOW, "node": "a", "value": 1}]}, "samples.0.metric"),
                       ({"node": "", "samples": []}, "body.node"), ({"samples": []}, "body.node")):
        r = client.post("/v1/ingest", json=bad, headers=auth(AGENT))
        assert r.status_code == 422 and field in r.json()["error"]["message"], (bad, r.text)
    r = client.post("/v1/ingest", content=b'{"node": "a", "samples": [{"ts": NaN, "node": "a", "metric": "m", '
                    b'"value": 1}]}', headers={**auth(AGENT), "Content-Type": "application/json"})
    assert r.status_code == 422


def test_body_size_limits(client):
    big = {"node": "a", "samples": [{"ts": NOW, "node": "a", "metric": "gpu_util", "value": 1.0}] * 2000}
    r = client.post("/v1/ingest", json=big, headers=auth(AGENT))
    assert r.status_code == 413 and "65536 bytes" in r.json()["error"]["message"]
    r = client.post("/v1/nodes/a/drain", json={"reason": "x" * 5000}, headers=auth(ADMIN))
    assert r.status_code == 413 and "4096 bytes" in r.json()["error"]["message"]

    def chunks():  # no Content-Length: the limit is counted as the body streams in
        for _ in range(100):
            yield b"x" * 1000
    r = client.post("/v1/ingest", content=chunks(), headers={**auth(AGENT), "Content-Type": "application/json"})
    assert r.status_code == 413


def test_unknown_route_and_method_are_json(client):
    r = client.get("/v1/nothing", headers=auth(READER))
    assert r.status_code == 404 and r.json()["error"]["status"] == 404
    r = client.delete("/v1/jobs", headers=auth(ADMIN))
    assert r.status_code == 405 and r.json()["error"]["message"] == "Method Not Allowed"


def test_cors_is_off_by_default(client):
    r = client.get("/v1/cluster", headers={**auth(READER), "Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in r.headers


# ---------- the console's data and assets ----------

def test_gpumap_lists_every_node_with_its_holders_and_state(client, cluster, controller):
    controller.serving_placement = lambda: {"b": {"default/s1": 3}}
    r = client.get("/v1/gpumap", headers=auth(READER))
    assert r.status_code == 200, r.text
    body = r.json()
    by_name = {n["name"]: n for n in body["nodes"]}
    assert list(by_name) == ["a", "b", "c"]
    holders = {name: {(body["training"] if k == "t" else body["serving"])[i]: g for k, i, g in n["holders"]}
               for name, n in by_name.items()}
    assert holders == {"a": {"default/j1": 4, "team/j2": 2}, "b": {"team/j2": 2, "default/s1": 3}, "c": {}}
    assert [(n["rack"], n["gpus"], n["state"], n["tainted"]) for n in body["nodes"]] == [
        ("r1", 8, "ok", False), ("r1", 8, "ok", False), ("r2", 4, "unhealthy", True)]
    assert "default/done" not in body["training"]  # a finished job holds nothing


def test_gpumap_states_cordoned_and_not_ready(client, store):
    store.upsert_node(parse_node(node("x", unschedulable=True)))
    down = node("y")
    down["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    store.upsert_node(parse_node(down))
    states = {n["name"]: n["state"] for n in client.get("/v1/gpumap", headers=auth(READER)).json()["nodes"]}
    assert states == {"x": "cordoned", "y": "notready"}


def test_timeline_lists_admitted_jobs_with_deadlines_ahead(client, cluster, store):
    store.upsert_job(parse_training_job(training_job("late", placement={}, phase="Running", deadline=NOW - 60)))
    store.upsert_job(parse_training_job(training_job("waiting", placement={}, phase="Pending")))
    store.upsert_job(parse_training_job(training_job("far", placement={"b": 2}, deadline=NOW + 7200)))
    body = client.get("/v1/timeline", headers=auth(READER)).json()
    assert [(j["key"], j["guaranteedGPUs"], j["deadline"]) for j in body["jobs"]] == [
        ("default/far", 2, iso(NOW + 7200)), ("default/j1", 2, iso(NOW + 3600)), ("team/j2", 2, iso(NOW + 3600))]
    assert body["schedulableGpus"] == 16  # c is unhealthy and cordoned
    assert body["servingGpus"] == 2 * 1 + 4 * 2


def test_whoami_names_the_tokens_role(client):
    assert client.get("/v1/whoami", headers=auth(READER)).json() == {"name": "bob", "role": "read"}
    assert client.get("/v1/whoami", headers=auth(ADMIN)).json() == {"name": "alice", "role": "admin"}


def test_console_assets_are_served_without_a_token_and_with_a_strict_csp(client):
    r = client.get("/ui", follow_redirects=False)
    assert r.status_code == 308 and r.headers["location"] == "/ui/"
    page = client.get("/ui/")
    assert page.status_code == 200 and "<title>Flotilla console</title>" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"
    script = client.get("/ui/app.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert "sessionStorage" in script.text and "localStorage" not in script.text
    assert client.get("/ui/app.css").status_code == 200
    assert client.get("/ui/missing.js").status_code == 404
    assert client.get("/ui/../controller/api.py").status_code == 404
