"""Who may post samples and serving statistics: the policy, the HTTP routes and the Redis consumer
(--ingest-auth tokenreview), with a fake TokenReview/SubjectAccessReview in place of the API server."""

import logging
import uuid

import pytest
import redis
from fastapi.testclient import TestClient

from controller_fixtures import ADMIN, AGENT, NOW, READER, auth, serving
from flotilla.controller.actions import RecordingActions
from flotilla.controller.api import Controller, create_app
from flotilla.controller.auth import NO_ROLE, Identity, ReviewUnavailable, TokenAuthenticator
from flotilla.controller.ingest import Ingestor, RedisConsumer
from flotilla.controller.ingest_auth import SHARED, TOKENREVIEW, IngestPolicy, StatsAccess, service_account_user
from flotilla.controller.metrics import ControllerMetrics
from flotilla.controller.mirror import parse_serving_deployment
from flotilla.health.samples import FIELD, TOKEN_FIELD, Sample, encode_batch

AGENT_SA = "flotilla-system/flotilla-agent"
AGENT_USER = "system:serviceaccount:flotilla-system:flotilla-agent"
# Kubernetes tokens (what TokenReview would say about them)
ON_A, ON_B, UNBOUND, OTHER_SA, ROUTER = ("sa-token-node-a-0123", "sa-token-node-b-0123", "sa-token-unbound-0123",
                                         "sa-token-other-sa-0123", "sa-token-router-0123")
IDENTITIES = {
    ON_A: Identity(AGENT_USER, NO_ROLE, kubernetes=True, node="a"),
    ON_B: Identity(AGENT_USER, NO_ROLE, kubernetes=True, node="b"),
    UNBOUND: Identity(AGENT_USER, NO_ROLE, kubernetes=True),
    OTHER_SA: Identity("system:serviceaccount:default:curious", NO_ROLE, kubernetes=True, node="a"),
    ROUTER: Identity("system:serviceaccount:serving:router", NO_ROLE, kubernetes=True,
                     groups=("system:serviceaccounts",)),
}


class FakeKubernetes:
    """TokenReview and SubjectAccessReview answers, counted; `down` makes both unavailable."""

    def __init__(self):
        self.down = False
        self.reviews = 0
        self.granted: set[tuple[str, str, str]] = set()  # (username, namespace, name) with update on .../stats

    def review(self, token):
        if self.down:
            raise ReviewUnavailable("TokenReview failed: connection refused")
        self.reviews += 1
        return IDENTITIES.get(token)

    def access(self, who: Identity, access: StatsAccess) -> bool:
        if self.down:
            raise ReviewUnavailable("SubjectAccessReview failed: connection refused")
        assert (access.group, access.resource, access.subresource, access.verb) == (
            "flotilla.dev", "servingdeployments", "stats", "update")
        return (who.name, access.namespace, access.name) in self.granted


class ListSink:
    def __init__(self):
        self.samples = []

    def accept(self, samples):
        self.samples.extend(samples)


def rejected(metrics, transport, reason):
    return metrics.registry.get_sample_value("flotilla_ingest_rejected_total",
                                             {"transport": transport, "reason": reason}) or 0


def heartbeat(node_name, ts=NOW):
    return {"ts": ts, "node": node_name, "metric": "heartbeat", "value": 1.0}


# ---------- the policy ----------

def tokenreview_policy(kube=None):
    return IngestPolicy(TOKENREVIEW, frozenset({AGENT_SA}), (kube or FakeKubernetes()).access)


@pytest.mark.parametrize("who, nodes, reason", [
    (IDENTITIES[ON_A], {"a"}, None),
    (IDENTITIES[ON_A], {"a", "b"}, "node-mismatch"),
    (IDENTITIES[ON_A], {"b"}, "node-mismatch"),
    (IDENTITIES[UNBOUND], {"a"}, "no-node-claim"),
    (IDENTITIES[OTHER_SA], {"a"}, "forbidden"),          # bound to node a, but not an agent
    (Identity("agent-1", "ingest"), {"a"}, "forbidden"),   # the shared tokens-file ingest token
    (Identity("bob", "read"), {"a"}, "forbidden"),
    (Identity("alice", "admin"), {"a", "b"}, None),        # an admin may post for any node
])
def test_tokenreview_samples_only_for_the_bound_node(who, nodes, reason):
    refusal = tokenreview_policy().samples(who, nodes)
    assert (refusal and refusal.reason) == reason
    if refusal is not None:
        assert refusal.status == 403


def test_node_mismatch_names_the_nodes_not_the_token():
    refusal = tokenreview_policy().samples(IDENTITIES[ON_A], {"b", "c"})
    assert refusal.message == ("samples for node b, c refused: the token is bound to node a, an agent speaks only "
                               "for its own node")


def test_shared_mode_is_the_role_check_it_always_was():
    policy = IngestPolicy(SHARED)
    assert policy.samples(Identity("agent-1", "ingest"), {"anything"}) is None
    assert policy.stats(Identity("agent-1", "ingest"), "default", "s1") is None
    assert policy.samples(Identity("bob", "read"), {"a"}).reason == "forbidden"


def test_tokenreview_stats_need_the_right_to_that_object():
    kube = FakeKubernetes()
    kube.granted.add(("system:serviceaccount:serving:router", "default", "s1"))
    policy = tokenreview_policy(kube)
    router = IDENTITIES[ROUTER]
    assert policy.stats(router, "default", "s1") is None
    refusal = policy.stats(router, "default", "s2")
    assert (refusal.status, refusal.reason) == (403, "forbidden")
    assert "may not update servingdeployments/stats of default/s2" in refusal.message
    assert policy.stats(Identity("agent-1", "ingest"), "default", "s1").reason == "forbidden"
    assert policy.stats(Identity("alice", "admin"), "default", "s2") is None


def test_policy_arguments_are_checked():
    with pytest.raises(ValueError, match="namespace/name"):
        IngestPolicy(SHARED, frozenset({"flotilla-agent"}))
    with pytest.raises(ValueError, match="SubjectAccessReview"):
        IngestPolicy(TOKENREVIEW)
    with pytest.raises(ValueError, match="one of shared, tokenreview"):
        IngestPolicy("open")
    assert service_account_user("ns/sa") == "system:serviceaccount:ns:sa"


# ---------- HTTP ----------

@pytest.fixture
def kube():
    return FakeKubernetes()


@pytest.fixture
def secured(store, tokens_file, kube):
    """A controller with --ingest-auth tokenreview; -> (client, sink, metrics, posted statistics)."""
    store.upsert_serving(parse_serving_deployment(serving("s1")))
    metrics, sink, windows = ControllerMetrics(store), ListSink(), []
    ctl = Controller(store=store, actions=RecordingActions(), auth=TokenAuthenticator(tokens_file, kube.review),
                     metrics=metrics, ingestor=Ingestor([sink], metrics), ingest_policy=tokenreview_policy(kube),
                     serving_stats=lambda key, window: windows.append(key))
    with TestClient(create_app(ctl), raise_server_exceptions=False) as client:
        yield client, sink, metrics, windows


sqlite_only = pytest.mark.parametrize("migrated_db_url", ["sqlite"], indirect=True)


@sqlite_only
def test_a_sample_for_another_node_is_refused_and_reaches_no_sink(secured, caplog):
    client, sink, metrics, _ = secured
    with caplog.at_level(logging.WARNING):
        r = client.post("/v1/ingest", json={"node": "a", "samples": [heartbeat("a"), heartbeat("b")]},
                        headers=auth(ON_A))
    assert r.status_code == 403 and "bound to node a" in r.json()["error"]["message"]
    # the body names node a, every sample is node b: still refused
    r = client.post("/v1/ingest", json={"node": "a", "samples": [heartbeat("b")]}, headers=auth(ON_A))
    assert r.status_code == 403
    assert sink.samples == []
    assert rejected(metrics, "http", "node-mismatch") == 2
    assert "refused http post from system:serviceaccount:flotilla-system:flotilla-agent (node-mismatch)" in caplog.text
    assert ON_A not in caplog.text and ON_A not in r.text
    # its own node: accepted
    r = client.post("/v1/ingest", json={"node": "a", "samples": [heartbeat("a")]}, headers=auth(ON_A))
    assert r.status_code == 202 and [s.node for s in sink.samples] == ["a"]


@sqlite_only
@pytest.mark.parametrize("token, status, reason", [
    (AGENT, 403, "forbidden"),            # the shared ingest token of the tokens file
    (READER, 403, "forbidden"),
    (OTHER_SA, 403, "forbidden"),
    (UNBOUND, 403, "no-node-claim"),
    ("not-a-token-anybody-knows", 401, "unauthenticated"),
])
def test_samples_from_anyone_but_the_bound_agent_are_refused(secured, token, status, reason):
    client, sink, metrics, _ = secured
    r = client.post("/v1/ingest", json={"node": "a", "samples": [heartbeat("a")]}, headers=auth(token))
    assert r.status_code == status and rejected(metrics, "http", reason) == 1
    assert sink.samples == []


@sqlite_only
def test_a_post_without_a_token_is_counted_as_unauthenticated(secured):
    client, _, metrics, _ = secured
    assert client.post("/v1/ingest", json={"node": "a", "samples": []}).status_code == 401
    assert client.post("/v1/serving/default/s1/stats", json={}).status_code == 401
    assert (rejected(metrics, "http", "unauthenticated"), rejected(metrics, "stats", "unauthenticated")) == (1, 1)


@sqlite_only
def test_admin_may_post_samples_for_any_node(secured):
    client, sink, _, _ = secured
    r = client.post("/v1/ingest", json={"node": "a", "samples": [heartbeat("b")]}, headers=auth(ADMIN))
    assert r.status_code == 202 and [s.node for s in sink.samples] == ["b"]


@sqlite_only
def test_stats_need_update_on_the_servingdeployments_stats_subresource(secured, kube):
    client, _, metrics, windows = secured
    body = {"windowSeconds": 10, "requestsPerSecond": 4.0, "meanPromptTokens": 512, "meanOutputTokens": 128}
    r = client.post("/v1/serving/default/s1/stats", json=body, headers=auth(ROUTER))
    assert r.status_code == 403 and "may not update servingdeployments/stats of default/s1" in r.text
    r = client.post("/v1/serving/default/s1/stats/prometheus", content=b"", headers=auth(ROUTER))
    assert r.status_code == 403
    r = client.post("/v1/serving/default/s1/stats", json=body, headers=auth(AGENT))  # shared ingest token
    assert r.status_code == 403
    assert windows == [] and rejected(metrics, "stats", "forbidden") == 3
    kube.granted.add(("system:serviceaccount:serving:router", "default", "s1"))
    assert client.post("/v1/serving/default/s1/stats", json=body, headers=auth(ROUTER)).status_code == 202
    assert client.post("/v1/serving/default/s1/stats", json=body, headers=auth(ADMIN)).status_code == 202
    assert windows == ["default/s1", "default/s1"]


@sqlite_only
def test_an_unanswered_review_is_a_503_to_retry_never_an_acceptance(secured, kube):
    client, sink, _, windows = secured
    kube.down = True
    r = client.post("/v1/ingest", json={"node": "a", "samples": [heartbeat("a")]}, headers=auth(ON_A))
    assert r.status_code == 503 and r.headers["Retry-After"] == "5"
    assert ADMIN not in r.text
    # a tokens-file admin needs no review
    r = client.post("/v1/serving/default/s1/stats", headers=auth(ADMIN),
                    json={"windowSeconds": 10, "requestsPerSecond": 4.0, "meanPromptTokens": 5, "meanOutputTokens": 5})
    assert r.status_code == 202
    assert sink.samples == [] and windows == ["default/s1"]


# ---------- Redis ----------

@pytest.fixture
def stream():
    return f"test:metrics:{uuid.uuid4().hex[:8]}"


def entry(node_name, token=None):
    fields = {FIELD: encode_batch([Sample(NOW, node_name, "xid", 79.0, gpu=3)])}
    if token is not None:
        fields[TOKEN_FIELD] = token
    return fields


@pytest.mark.redis
@sqlite_only
def test_a_stream_entry_with_a_forged_or_missing_token_is_dropped_and_counted(redis_url, stream, store, tokens_file,
                                                                              kube):
    r = redis.Redis.from_url(redis_url)
    metrics, sink = ControllerMetrics(store), ListSink()
    c = RedisConsumer(redis_url, Ingestor([sink], metrics), "c1", stream=stream, block_ms=100,
                      auth=TokenAuthenticator(tokens_file, kube.review), policy=tokenreview_policy(kube))
    c.ensure_group()
    r.xadd(stream, entry("b", ON_A))     # node a's agent claims XID 79 on node b
    r.xadd(stream, entry("b"))           # no token at all
    r.xadd(stream, entry("b", AGENT))    # the shared ingest token
    r.xadd(stream, entry("b", ON_B))     # node b's own agent: accepted
    assert c.poll() == 1
    assert [s.node for s in sink.samples] == ["b"] and c.pending() == 0
    assert (rejected(metrics, "redis", "node-mismatch"), rejected(metrics, "redis", "unauthenticated"),
            rejected(metrics, "redis", "forbidden")) == (1, 1, 1)


@pytest.mark.redis
@sqlite_only
def test_entries_wait_while_tokens_cannot_be_reviewed(redis_url, stream, store, tokens_file, kube):
    r = redis.Redis.from_url(redis_url)
    sink = ListSink()
    c = RedisConsumer(redis_url, Ingestor([sink]), "c1", stream=stream, block_ms=100,
                      auth=TokenAuthenticator(tokens_file, kube.review), policy=tokenreview_policy(kube))
    c.ensure_group()
    r.xadd(stream, entry("a", ON_A))
    r.xadd(stream, entry("b", ON_B))
    kube.down = True
    with pytest.raises(ReviewUnavailable):
        c.poll()
    assert sink.samples == [] and c.pending() == 2  # neither dropped nor accepted
    kube.down = False
    assert c.poll() == 2  # our own pending entries are read again first
    assert [s.node for s in sink.samples] == ["a", "b"] and c.pending() == 0
    r.xadd(stream, entry("a", ON_A))
    assert c.poll() == 0 and c.poll() == 1  # back to new entries once none of ours is left


@pytest.mark.redis
@sqlite_only
def test_shared_mode_consumer_takes_entries_without_tokens(redis_url, stream, store):
    r = redis.Redis.from_url(redis_url)
    sink = ListSink()
    c = RedisConsumer(redis_url, Ingestor([sink]), "c1", stream=stream, block_ms=100)
    c.ensure_group()
    r.xadd(stream, entry("b"))
    assert c.poll() == 1 and [s.node for s in sink.samples] == ["b"]
