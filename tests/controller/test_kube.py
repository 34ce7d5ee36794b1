"""The Kubernetes glue without an API server: watch events into the store, and the patches KubeActions sends.
(The e2e suite drives both against a real API server.)"""

from types import SimpleNamespace

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from controller_fixtures import node, training_job
from flotilla.controller.actions import ClusterActionError, ObjectNotFound
from flotilla.controller.kube import KINDS, KubeActions, Sync
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
