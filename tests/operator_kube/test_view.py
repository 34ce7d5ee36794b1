"""The operator's in-memory view: objects trimmed to what planning reads, finished jobs' pods dropped."""

import copy

from flotilla.allocation.fifo import FifoGang
from flotilla.operator import trim
from flotilla.operator.view import View
from flotilla.operator.reconcile import reconcile
from tests.operator_plan.builders import T0, node, pod, trainingjob, wname

NOISE = {"managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}], "selfLink": "x"}


def as_served(body):
    """The object as the API server sends it: managed fields, a spec planning does not read."""
    out = copy.deepcopy(body)
    out["metadata"].update(copy.deepcopy(NOISE))
    out["metadata"].setdefault("annotations", {})["kubectl.kubernetes.io/last-applied-configuration"] = "{...}"
    if out.get("kind") != "TrainingJob":
        out["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
        out["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return out


def test_planning_on_trimmed_objects_is_planning_on_whole_ones():
    jobs = {"ns/new": trainingjob("new"),
            "ns/run": trainingjob("run", status={"phase": "Admitted", "placement": [{"node": "n0", "gpus": 2}]}),
            "ns/failing": trainingjob("failing", status={"phase": "Running", "placement": [{"node": "n1", "gpus": 2}]})}
    pods = {"ns/" + wname("run", 0, 0): pod(wname("run", 0, 0), "run", 0),
            "ns/" + wname("run", 0, 1): pod(wname("run", 0, 1), "run", 0, "Pending"),
            "ns/" + wname("failing", 0, 0): pod(wname("failing", 0, 0), "failing", 0, node_name="n1"),
            "ns/" + wname("failing", 0, 1): pod(wname("failing", 0, 1), "failing", 0, "Failed", node_name="n1"),
            "ns/sd-decode": pod("sd-decode", "sd", 0, node_name="n2", gpus=4, role="decode")}
    nodes = {n: node(n) for n in ("n0", "n1", "n2")}
    served = [{k: as_served(v) for k, v in d.items()} for d in (jobs, nodes, pods)]
    view = View()
    for kind, store in zip(("jobs", "nodes", "pods"), served):
        for obj in store.values():
            view.put(kind, obj)
    assert all("managedFields" not in o["metadata"] for o in [*view.jobs.values(), *view.pods.values()])
    assert set(view.pods["ns/" + wname("run", 0, 0)]["spec"]) == {"nodeName", "containers"}
    whole = reconcile(T0 + 60, FifoGang(), *served, {}, {})
    trimmed = reconcile(T0 + 60, FifoGang(), view.jobs, view.nodes, view.pods, {}, {})
    assert whole and trimmed == whole


def test_a_finished_job_keeps_only_its_identity_and_its_pods_are_pruned():
    view = View()
    view.put("jobs", as_served(trainingjob("done", status={"phase": "Succeeded", "gpus": 0})))
    view.put("jobs", trainingjob("live", status={"phase": "Running"}))
    for name, job in ((wname("done", 0, 0), "done"), (wname("live", 0, 0), "live"),
                      (wname("early", 0, 0), "not-seen-yet")):
        view.put("pods", pod(name, job, 0, "Succeeded"))
    assert view.jobs["ns/done"] == {"apiVersion": "flotilla.dev/v1alpha1", "kind": "TrainingJob",
                                    "metadata": {"name": "done", "namespace": "ns", "uid": "uid-done",
                                                 "resourceVersion": "1"},
                                    "status": {"phase": "Succeeded"}}
    view.prune()
    # A job not seen yet keeps its pods: at start-up pods may be listed before jobs.
    assert sorted(view.pods) == ["ns/" + wname("early", 0, 0), "ns/" + wname("live", 0, 0)]


def test_pruned_pods_stay_out_when_listed_or_patched_again_unless_they_hold_gpus():
    """At 15,000 jobs a re-list sends every finished job's pods again; they must not come back to be trimmed,
    planned with and pruned once more."""
    view = View()
    view.put("jobs", trainingjob("done", status={"phase": "Succeeded"}))
    view.put("jobs", trainingjob("live", status={"phase": "Running"}))
    finished, live = pod(wname("done", 0, 0), "done", 0, "Succeeded"), pod(wname("live", 0, 0), "live", 0, "Succeeded")
    serving = pod("sd-prefill", "sd", 0, "Pending", node_name="", role="prefill")
    for p in (finished, live, serving):
        view.put("pods", p)
    view.prune()
    assert sorted(view.pods) == ["ns/" + wname("live", 0, 0), "ns/sd-prefill"]
    assert not view.record("pods", {"type": "MODIFIED", "object": finished})
    assert view.relisted("pods", [finished, live, serving], requested_at=view.clock()) == []
    assert "ns/" + wname("done", 0, 0) not in view.pods and not view.wake.is_set()
    # One that holds GPUs again (the API server's word, however odd) is planned with.
    assert view.record("pods", {"type": "MODIFIED", "object": pod(wname("done", 0, 0), "done", 0, "Running")})
    assert "ns/" + wname("done", 0, 0) in view.pods
    # A job deleted and made again under the same name has another UID: the old one's pods are no longer
    # pruned, and the garbage collector deletes them.
    view.put("jobs", {**trainingjob("done"), "metadata": {**trainingjob("done")["metadata"], "uid": "uid-again"}})
    view.prune()
    view.record("pods", {"type": "DELETED", "object": finished})
    assert view.record("pods", {"type": "ADDED", "object": finished})


def test_events_are_taken_in_the_order_they_arrive_and_resource_versions_are_opaque():
    view = View()
    first = trainingjob("j", status={"phase": "Admitted"})
    first["metadata"]["resourceVersion"] = "b7f0"  # opaque: not a number (an etcd-less API server's)
    view.put("jobs", first)
    second = trainingjob("j", status={"phase": "Running"})
    second["metadata"]["resourceVersion"] = "a1"  # "smaller" as a string and not a number: still the newer
    view.record("jobs", {"type": "MODIFIED", "object": second})
    assert view.jobs["ns/j"]["status"]["phase"] == "Running"
    view.record("jobs", {"type": "DELETED", "object": trainingjob("j")})
    assert view.jobs == {} and view.wake.is_set()


def test_pod_trim_leaves_out_what_is_not_there():
    assert trim.pod({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": [{"name": "c"}]}}) == {
        "metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": [{"resources": {"limits": {}}}]},
        "status": {}}


def test_prune_goes_by_owner_uid_and_keeps_pods_that_still_hold_gpus():
    view = View()
    view.put("jobs", trainingjob("done", status={"phase": "Failed"}))
    finished = pod(wname("done", 0, 0), "done", 0, "Succeeded")
    terminating = pod(wname("done", 0, 1), "done", 0, "Running")
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    orphan = pod("done-g0-w0", "done", 0, "Succeeded", owner_uid=None)  # an earlier "done", orphaned
    for p in (finished, terminating, orphan):
        view.put("pods", p)
    view.prune()
    # Its terminating worker still holds a GPU: planning must see it until it is gone.
    assert sorted(view.pods) == sorted(["ns/done-g0-w0", "ns/" + wname("done", 0, 1)])
