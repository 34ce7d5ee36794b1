"""The view reconciled with full lists: objects deleted while the watch was not looking (ghosts) go,
news that arrived after the list was requested stays, and our answered writes stay shown over late events."""

import asyncio
import copy

import pytest

from flotilla.operator import relist
from flotilla.operator.actions import PatchStatus
from flotilla.operator.relist import Relister
from flotilla.operator.view import View
from tests.operator_plan.builders import node, pod, trainingjob


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def versioned(body, version):
    out = copy.deepcopy(body)
    out["metadata"]["resourceVersion"] = version
    return out


def test_a_relist_drops_ghosts_refreshes_the_listed_and_keeps_newer_news():
    clock = Clock()
    view = View(clock=clock)
    for name in ("w0", "w1", "w2"):
        view.record("pods", {"type": "ADDED", "object": pod(f"j-g0-{name}", "j", 0)})
    view.record("nodes", {"type": "ADDED", "object": node("gone")})
    view.created("ns/j-g0-w9", now=clock.t)  # created by us, its watch event never came, and it is gone
    clock.t = 110.0
    requested_at = clock.t
    clock.t = 111.0
    # While the list is on its way: a pod the watch shows as created, and one it shows as deleted.
    view.record("pods", {"type": "ADDED", "object": pod("j-g0-w3", "j", 0)})
    view.record("pods", {"type": "DELETED", "object": pod("j-g0-w1", "j", 0)})
    listed = [pod("j-g0-w0", "j", 0, "Failed"), pod("j-g0-w1", "j", 0)]  # w2 was deleted in a watch gap
    assert view.relisted("pods", listed, requested_at) == ["ns/j-g0-w2"]
    assert sorted(view.pods) == ["ns/j-g0-w0", "ns/j-g0-w3"]     # w1 stays deleted, w3 stays
    assert view.pods["ns/j-g0-w0"]["status"]["phase"] == "Failed"  # refreshed from the list
    assert not view.has_pod("ns/j-g0-w9", clock.t)                 # recreated on the next pass
    # A node deleted in a watch gap receives no placement: it is not in the view any more.
    assert view.relisted("nodes", [node("n0")], requested_at) == ["gone"]
    assert list(view.nodes) == ["n0"]


def test_a_late_event_does_not_undo_an_answered_write_until_the_watch_shows_it():
    clock = Clock()
    view = View(clock=clock)
    view.record("jobs", {"type": "ADDED", "object": versioned(trainingjob("a"), "x1")})
    placed = {"phase": "Admitted", "placement": [{"node": "n0", "gpus": 4}]}
    view.expect("jobs", "ns/a", [PatchStatus("trainingjobs", "ns", "a", placed)])
    view.settle("jobs", "ns/a", versioned(trainingjob("a", status=placed), "x3"))
    # A watch event from before the patch, late (say, a rank-0 progress annotation): the placement stays.
    late = versioned(trainingjob("a", annotations={"flotilla.dev/progress": "{}"}), "x2")
    view.record("jobs", {"type": "MODIFIED", "object": late})
    assert view.jobs["ns/a"]["status"] == placed
    assert view.jobs["ns/a"]["metadata"]["annotations"] == {"flotilla.dev/progress": "{}"}
    # The event of our own write (its resourceVersion equals the answer's) ends the overlay.
    view.record("jobs", {"type": "MODIFIED", "object": versioned(trainingjob("a", status=placed), "x3")})
    assert not view._written
    cleared = {"phase": "Pending"}
    view.record("jobs", {"type": "MODIFIED", "object": versioned(trainingjob("a", status=cleared), "x4")})
    assert view.jobs["ns/a"]["status"] == cleared


def test_a_batched_away_event_or_a_relist_also_ends_the_overlay():
    clock = Clock()
    view = View(clock=clock)
    view.put("jobs", trainingjob("a"))
    placed = {"phase": "Admitted"}
    view.expect("jobs", "ns/a", [PatchStatus("trainingjobs", "ns", "a", placed)])
    view.settle("jobs", "ns/a", versioned(trainingjob("a", status=placed), "5"))
    # kopf may deliver only the latest of a burst: an event carrying our write, another resourceVersion.
    view.record("jobs", {"type": "MODIFIED", "object": versioned(trainingjob("a", status=placed, annotations={"k": "v"}), "6")})
    assert not view._written
    view.expect("jobs", "ns/a", [PatchStatus("trainingjobs", "ns", "a", {"phase": "Running"})])
    view.settle("jobs", "ns/a", versioned(trainingjob("a", status={"phase": "Running"}), "7"))
    clock.t += 1
    # Our write was then overwritten by someone else, and the watch restarted: a list requested after the
    # answer is newer than it.
    view.relisted("jobs", [versioned(trainingjob("a", status={"phase": "Failed"}), "9")], clock.t)
    assert view.jobs["ns/a"]["status"] == {"phase": "Failed"} and not view._written


class FlakyLister:
    """Fails while the API server is 'down', then lists what is there."""

    def __init__(self, objects):
        self.objects, self.down, self.calls = objects, True, []

    def list(self, kind):
        self.calls.append(kind)
        if self.down:
            raise ConnectionRefusedError("connection refused")
        return [copy.deepcopy(o) for o in self.objects.get(kind, [])]


def test_a_pod_deleted_during_an_outage_goes_at_the_first_list_after_it(monkeypatch):
    monkeypatch.setattr(relist, "RETRY_SECONDS", 0.01)

    async def scenario():
        view = View()
        view.put("pods", pod("j-g0-w0", "j", 0))
        view.put("pods", pod("j-g0-w1", "j", 0))
        lister = FlakyLister({"pods": [pod("j-g0-w0", "j", 0)]})
        relister = Relister(view, lister, every_s=3600)
        task = asyncio.create_task(relister.run())
        view.relist_wake.set()  # a list now, while the API server is still down
        while len(lister.calls) < 2 * len(relist.KINDS):
            await asyncio.sleep(0.005)
        assert "ns/j-g0-w1" in view.pods
        lister.down = False
        while "ns/j-g0-w1" in view.pods:
            await asyncio.sleep(0.005)
        task.cancel()
        assert list(view.pods) == ["ns/j-g0-w0"] and set(lister.calls) == set(relist.KINDS)

    asyncio.run(asyncio.wait_for(scenario(), timeout=5))


def test_a_slow_full_list_stretches_the_period_and_a_quick_one_keeps_it():
    relister = Relister(View(), FlakyLister({}), every_s=60)
    assert relister.period(0.2) == 60
    assert relister.period(3.0) == 60
    assert relister.period(6.0) == pytest.approx(114)  # at most RELIST_SHARE (5 %) of the time listing


class Pages:
    """Stands in for urllib3's pool behind the real client: answers lists page by page, recording the URLs and
    the total timeout of each request."""

    def __init__(self, pages):
        self.pages, self.urls = list(pages), []

    def request(self, method, url, body=None, headers=None, timeout=None, preload_content=True):
        import json

        import urllib3

        self.urls.append((method, url, timeout.total))
        return urllib3.HTTPResponse(body=json.dumps(self.pages.pop(0)).encode(), status=200,
                                    headers={"Content-Type": "application/json"}, preload_content=False)


def test_the_lister_pages_through_with_the_watch_selector_and_names_each_items_kind():
    from kubernetes import client

    from flotilla.kubeapi import ApiClient
    from flotilla.operator.relist import Lister

    api = ApiClient(client.Configuration(host="http://127.0.0.1:1"), timeout=7)
    pages = api.rest_client.pool_manager = Pages([
        {"apiVersion": "v1", "kind": "PodList", "metadata": {"continue": "tok"},
         "items": [{"metadata": {"name": "a", "namespace": "ns"}}]},
        {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [{"metadata": {"name": "b", "namespace": "ns"}}]},
        {"apiVersion": "flotilla.dev/v1alpha1", "kind": "TrainingJobList", "metadata": {},
         "items": [{"metadata": {"name": "j", "namespace": "team"}}]},
    ])
    lister = Lister(api, ["team"], "app.kubernetes.io/managed-by=flotilla")
    pods = lister.list("pods")
    assert [(p["kind"], p["apiVersion"], p["metadata"]["name"]) for p in pods] == [("Pod", "v1", "a"), ("Pod", "v1", "b")]
    assert [j["kind"] for j in lister.list("jobs")] == ["TrainingJob"]
    first, second, jobs = pages.urls
    assert "/api/v1/namespaces/team/pods?" in first[1] and "labelSelector=app.kubernetes.io" in first[1]
    assert "limit=500" in first[1] and "continue=" not in first[1] and "continue=tok" in second[1]
    assert "/apis/flotilla.dev/v1alpha1/namespaces/team/trainingjobs?" in jobs[1]
    assert {t for _, _, t in pages.urls} == {7}
