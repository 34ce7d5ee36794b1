"""The Kubernetes glue without an API server: watch events into the store, and the patches KubeActions sends.
(The e2e suite drives both against a real API server.)"""

from types import SimpleNamespace

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from controller_fixtures import node, training_job
from flotilla.controller.actions import ClusterActionError, ObjectNotFound
from flotilla.controller.kube import KINDS, KubeActions, ServingPlacement, Sync, serving_gpus_by_node
from flotilla.controller.metrics import ControllerMetrics

JOB, NODE = KINDS[0], KINDS[2]


@pytest.mark.parametrize("migrated_db_url", ["sqlite"], indirect=True)
def test_sync_applies_events(store):
    metrics = ControllerMetrics(store)
    sync = Sync(client.ApiClient(), store, metrics)
    assert sync.apply(JOB, "ADDED", training_job("j", placement={"a": 4})) == "default/j"
    assert sync.apply(JOB, "MODIFIED", training_job("j", placement={"a": 8}, reshards=1)) == "default/j"
    assert store.job("default/j")[0].gpus == 8
    assert metrics.registry.get_sample_value("flotilla_reshards_total") == 1
    assert sync.apply(JOB, "MODIFIED", {"metadata": {}}) is None  # malformed: skipped
    assert sync.apply(NODE, "ADDED", node("n1")) == "n1"
    sync.apply(JOB, "DELETED", training_job("j"))
    assert store.job("default/j") is None and store.jobs_on_node("a") == []
    store.keep_only("Node", set())
    assert store.node("n1") is None


class Recorder:
    def __init__(self, node_obj=None, fail=None):
        self.calls, self.node_obj, self.fail = [], node_obj, fail
        self.api_client = client.ApiClient()

    def __getattr__(self, name):
        def call(*args, **kwargs):
            if self.fail is not None:
                raise self.fail
            self.calls.append((name, *args))
            return self.node_obj
        return call


def test_kube_actions_patches():
    actions = KubeActions(client.ApiClient())
    taints = [client.V1Taint(key="other", effect="NoSchedule"),
              client.V1Taint(key="flotilla.dev/unhealthy", value="old", effect="NoSchedule")]
    current = SimpleNamespace(spec=SimpleNamespace(taints=taints), metadata=SimpleNamespace(resource_version="42", uid="u1"))
    actions.core = actions.events.core = Recorder(current)
    actions.custom = Recorder()
    actions.annotate("trainingjobs", "ns", "j", "k", "v")
    assert actions.custom.calls == [("patch_namespaced_custom_object", "flotilla.dev", "v1alpha1", "ns",
                                     "trainingjobs", "j", {"metadata": {"annotations": {"k": "v"}}})]
    actions.set_node_health("n1", False, "Xid 79: fell off the bus", "GPU 3 lost", "NoExecute")
    read, patch, status, event = actions.core.calls
    assert read == ("read_node", "n1")
    assert event[0] == "create_namespaced_event" and event[2]["reason"] == "GPUUnhealthy"
    assert event[2]["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u1"}
    assert patch[2] == {"metadata": {"resourceVersion": "42"}, "spec": {"taints": [
        {"key": "other", "effect": "NoSchedule"},
        {"key": "flotilla.dev/unhealthy", "value": "Xid-79--fell-off-the-bus", "effect": "NoExecute"}]}}
    [condition] = status[2]["status"]["conditions"]
    assert (condition["type"], condition["status"], condition["message"]) == ("FlotillaGPUHealthy", "False",
                                                                              "GPU 3 lost")
    actions.core.calls.clear()
    actions.set_node_health("n1", True, "ReturnedToService", "fixed")
    assert actions.core.calls[1][2]["spec"]["taints"] == [{"key": "other", "effect": "NoSchedule"}]


@pytest.mark.parametrize("status, error", [(404, ObjectNotFound), (409, ClusterActionError)])
def test_kube_actions_errors(status, error):
    actions = KubeActions(client.ApiClient())
    actions.core = Recorder(fail=ApiException(status=status, reason="nope"))
    with pytest.raises(error):
        actions.set_unschedulable("n1", True)


class FakeReviews:
    """AuthenticationV1Api/AuthorizationV1Api stand-ins: answers per token, every request recorded."""

    def __init__(self, answers=None, fail=None, allowed=True):
        self.answers, self.fail, self.allowed, self.requests = answers or {}, fail, allowed, []

    def __call__(self, _api):
        return self

    def create_token_review(self, body, _request_timeout=None):
        self.requests.append((body.spec.token, body.spec.audiences, _request_timeout))
        if self.fail is not None:
            raise self.fail
        user, audiences = self.answers.get(body.spec.token, (None, []))
        return SimpleNamespace(status=SimpleNamespace(authenticated=user is not None, user=user, audiences=audiences))

    def create_subject_access_review(self, body, _request_timeout=None):
        self.requests.append(body.spec)
        if self.fail is not None:
            raise self.fail
        return SimpleNamespace(status=SimpleNamespace(allowed=self.allowed, denied=None))


AGENT_USER = client.V1UserInfo(
    username="system:serviceaccount:flotilla-system:flotilla-agent", uid="sa-uid",
    groups=["system:serviceaccounts", "system:authenticated"],
    extra={"authentication.kubernetes.io/node-name": ["gpu-node-0001"],
           "authentication.kubernetes.io/pod-name": ["agent-x"]})


def test_token_reviewer_asks_for_the_audience_and_reads_the_bound_node(monkeypatch):
    from flotilla.controller import kube

    fake = FakeReviews({"agent": (AGENT_USER, ["flotilla-controller"]),
                        "wrong-audience": (AGENT_USER, ["https://kubernetes.default.svc"]),
                        "admin": (client.V1UserInfo(username="alice"), ["flotilla-controller"])})
    monkeypatch.setattr(kube.client, "AuthenticationV1Api", fake)
    review = kube.token_reviewer(client.ApiClient(), {"alice"}, audience="flotilla-controller", readers=False)
    who = review("agent")
    assert (who.name, who.role, who.kubernetes, who.node) == (AGENT_USER.username, "none", True, "gpu-node-0001")
    assert who.groups == ("system:serviceaccounts", "system:authenticated") and who.uid == "sa-uid"
    assert dict(who.extra)["authentication.kubernetes.io/pod-name"] == ("agent-x",)
    assert fake.requests == [("agent", ["flotilla-controller"], kube.REVIEW_TIMEOUT_S)]
    assert review("agent") == who and len(fake.requests) == 1  # cached by the token's hash
    assert review("wrong-audience") is None  # the answer must name our audience
    assert review("admin").role == "admin" and review("admin").node is None
    assert review("unknown") is None and review("unknown") is None
    assert len([r for r in fake.requests if r[0] == "unknown"]) == 1  # refusals are cached too (briefly)
    readers = kube.token_reviewer(client.ApiClient(), set(), audience="flotilla-controller", readers=True)
    assert readers("agent").role == "read"  # --tokenreview-admins given: every Kubernetes identity may read


@pytest.mark.parametrize("fail", [ApiException(status=500, reason="etcd down"), ApiException(status=403, reason="no"),
                                  ConnectionRefusedError("refused")])
def test_an_unanswered_review_is_unavailable_not_a_refusal(monkeypatch, fail, caplog):
    from flotilla.controller import kube
    from flotilla.controller.auth import Identity, ReviewUnavailable
    from flotilla.controller.ingest_auth import StatsAccess

    monkeypatch.setattr(kube.client, "AuthenticationV1Api", FakeReviews(fail=fail))
    monkeypatch.setattr(kube.client, "AuthorizationV1Api", FakeReviews(fail=fail))
    with pytest.raises(ReviewUnavailable):
        kube.token_reviewer(client.ApiClient(), set(), audience="a", readers=False)("secret-token-value")
    with pytest.raises(ReviewUnavailable):
        kube.access_reviewer(client.ApiClient())(Identity("u", "none", kubernetes=True), StatsAccess("ns", "s"))
    assert "secret-token-value" not in caplog.text


def test_access_reviewer_asks_about_the_stats_subresource_as_the_caller(monkeypatch):
    from flotilla.controller import kube
    from flotilla.controller.auth import Identity
    from flotilla.controller.ingest_auth import StatsAccess

    fake = FakeReviews(allowed=False)
    monkeypatch.setattr(kube.client, "AuthorizationV1Api", fake)
    allowed = kube.access_reviewer(client.ApiClient())
    router = Identity("system:serviceaccount:serving:router", "none", kubernetes=True, groups=("g",), uid="u1",
                      extra=(("authentication.kubernetes.io/pod-name", ("router-0",)),))
    assert allowed(router, StatsAccess("default", "s1")) is False
    assert allowed(router, StatsAccess("default", "s1")) is False and len(fake.requests) == 1  # cached
    [spec] = fake.requests
    assert (spec.user, spec.groups, spec.uid) == (router.name, ["g"], "u1")
    assert spec.extra == {"authentication.kubernetes.io/pod-name": ["router-0"]}
    ra = spec.resource_attributes
    assert (ra.group, ra.resource, ra.subresource, ra.verb, ra.namespace, ra.name) == (
        "flotilla.dev", "servingdeployments", "stats", "update", "default", "s1")


def serving_pod(ns, serving, node, gpus, phase="Running"):
    return {"metadata": {"namespace": ns, "labels": {"flotilla.dev/serving": serving, "flotilla.dev/role": "decode"}},
            "spec": {"nodeName": node, "containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}},
                                                      {"resources": {"limits": None}}]},
            "status": {"phase": phase}}


def test_serving_gpus_by_node_sums_each_deployments_pods():
    pods = [serving_pod("llm", "chat", "a", 2), serving_pod("llm", "chat", "a", 2), serving_pod("llm", "chat", "b", 1),
            serving_pod("ml", "chat", "b", 4), serving_pod("llm", "chat", None, 2),  # not scheduled yet
            serving_pod("llm", "chat", "c", 0)]
    assert serving_gpus_by_node(pods) == {"a": {"llm/chat": 4}, "b": {"llm/chat": 1, "ml/chat": 4}}


def test_serving_placement_lists_once_per_interval_and_keeps_the_last_answer_on_failure(caplog):
    now = [0.0]
    placement = ServingPlacement(client.ApiClient(), ttl_s=2.0, clock=lambda: now[0])
    calls = []

    def list_pods(**kw):
        calls.append(kw)
        if len(calls) == 2:
            raise ApiException(status=503)
        return {"items": [serving_pod("llm", "chat", "a", 2)]}

    placement.core = SimpleNamespace(list_pod_for_all_namespaces=list_pods, api_client=client.ApiClient())
    assert placement() == {"a": {"llm/chat": 2}}
    assert calls[0]["label_selector"] == "flotilla.dev/serving"
    now[0] = 1.0
    assert placement() == {"a": {"llm/chat": 2}} and len(calls) == 1  # within the interval: no list
    now[0] = 3.0
    assert placement() == {"a": {"llm/chat": 2}} and len(calls) == 2  # the list failed: the last answer
    assert "listing serving pods" in caplog.text
