"""The executor's pod writes (glue; the CoreV1Api is a fake that answers as the API server does)."""

import asyncio

from kubernetes import client

from flotilla.operator.actions import CreatePod, DeletePod
from flotilla.operator.kube import Kube
from flotilla.operator.training import worker_pods
from tests.operator_plan.builders import trainingjob


class FakeCore:
    """Pods by name; create answers 409 for a name taken, delete honours a UID precondition. Pod requests come
    as `Kube.wire` sends them, Events as `EventRecorder` makes them."""

    def __init__(self, pods=None):
        self.pods = dict(pods or {})
        self.deletes, self.events = [], []
        self.api_client = client.ApiClient()

    def send(self, method, path, body=None, *, query=None, content_type=None, answer=False):
        _, _, _, namespaces, _, kind, *name = path.split("/")  # /api/v1/namespaces/<ns>/pods[/<name>]
        assert (namespaces, kind) == ("namespaces", "pods"), path
        if method == "GET":
            if name[0] not in self.pods:
                raise client.ApiException(status=404, reason="NotFound")
            return self.pods[name[0]]
        if method == "POST":
            if body["metadata"]["name"] in self.pods:
                raise client.ApiException(status=409, reason="AlreadyExists")
            self.pods[body["metadata"]["name"]] = body
            return True
        assert method == "DELETE", method
        self.deletes.append((name[0], body))
        pod = self.pods.get(name[0])
        if pod is None:
            raise client.ApiException(status=404, reason="NotFound")
        if body is not None and body["preconditions"]["uid"] != pod["metadata"].get("uid"):
            raise client.ApiException(status=409, reason="Conflict")
        del self.pods[name[0]]
        return True

    def create_namespaced_event(self, namespace, body, **_):
        self.events.append(body)
        return body


def run(kube, actions):
    return asyncio.run(kube.apply(actions))


def kube_with(core):
    kube = Kube(client.ApiClient(), concurrency=2)
    kube.wire = kube.events.core = core
    return kube


def manifest(job="reuse", uid="uid-new"):
    body = trainingjob(job)
    body["metadata"]["uid"] = uid
    return worker_pods(body, {"n0": 1}, 0)[0]


def test_a_409_for_the_jobs_own_pod_counts_as_created():
    mine = manifest()
    core = FakeCore({mine["metadata"]["name"]: mine})
    done = run(kube_with(core), [CreatePod(manifest())])
    assert [type(a).__name__ for a, _ in done] == ["CreatePod"] and not core.events


def test_a_409_for_another_owners_pod_is_not_success_and_says_so(caplog):
    ours = manifest(uid="uid-new")
    name = ours["metadata"]["name"]
    theirs = manifest(uid="uid-new")
    theirs["metadata"]["ownerReferences"][0]["uid"] = "uid-old"
    orphan = {**theirs, "metadata": {**theirs["metadata"], "ownerReferences": []}}
    for existing, whose in ((theirs, "uid-old"), (orphan, "no controller")):
        core = FakeCore({name: existing})
        assert run(kube_with(core), [CreatePod(ours)]) == []
        assert core.pods[name] is existing  # left alone
        [event] = core.events
        assert event["reason"] == "PodNameConflict" and event["type"] == "Warning"
        assert event["involvedObject"]["uid"] == "uid-new" and whose in event["message"]
        assert any(r.levelname == "ERROR" and whose in r.getMessage() for r in caplog.records)


def test_delete_uses_the_pods_grace_period_and_a_uid_precondition():
    pod = {"metadata": {"name": "w", "uid": "u1"}}
    core = FakeCore({"w": pod})
    done = run(kube_with(core), [DeletePod("ns", "w", "u1")])
    [(name, options)] = core.deletes
    assert name == "w" and "gracePeriodSeconds" not in options and options["preconditions"] == {"uid": "u1"}
    assert len(done) == 1 and "w" not in core.pods


def test_a_pod_of_the_same_name_but_another_uid_is_not_deleted_and_a_gone_pod_is_no_error():
    core = FakeCore({"w": {"metadata": {"name": "w", "uid": "u2"}}})
    done = run(kube_with(core), [DeletePod("ns", "w", "u1"), DeletePod("ns", "gone", "u3")])
    assert "w" in core.pods and len(done) == 2
