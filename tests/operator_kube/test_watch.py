"""The operator's own watches: list, watch from the list's version, resume where a watch ended, list
afresh when the version is gone (objects deleted meanwhile are dropped), no wake-up for an event that
changes nothing planning reads."""

import asyncio
import json

import pytest
from kubernetes.client.exceptions import ApiException

from flotilla.operator import watch
from flotilla.operator.view import View
from tests.operator_plan.builders import node, pod


def versioned(body, version):
    return {**body, "metadata": {**body["metadata"], "resourceVersion": version}}


class Stream:
    """A watch response: one JSON line per event."""

    def __init__(self, events):
        self.lines = [json.dumps(e).encode() + b"\n" for e in events]
        self.released = False

    def __iter__(self):
        return iter(self.lines)

    def release_conn(self):
        self.released = True


class Server:
    """Stands in for one list call of the client: answers lists from `objects` and watches from `watches`
    (a list of event lists, or an exception to raise), recording what each request asked for."""

    def __init__(self, objects, version, watches):
        self.objects, self.version, self.watches, self.requests = objects, version, list(watches), []

    def __call__(self, **kw):
        self.requests.append({k: v for k, v in kw.items() if k in ("watch", "resource_version")})
        if not kw.get("watch"):
            body = {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": self.version},
                    "items": [dict(o) for o in self.objects]}
            return type("Response", (), {"data": json.dumps(body).encode()})()
        if not self.watches:
            raise ConnectionRefusedError("the test is over")
        answer = self.watches.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return Stream(answer)


async def run_until(informer, done, timeout=5.0):
    informer.start()
    try:
        async with asyncio.timeout(timeout):
            while not done():
                await asyncio.sleep(0.005)
    finally:
        informer.stop()


@pytest.fixture(autouse=True)
def fast_retry(monkeypatch):
    monkeypatch.setattr(watch, "RETRY_SECONDS", 0.01)


def test_a_watch_resumes_from_the_last_version_it_saw_and_a_gone_version_lists_afresh():
    async def scenario():
        view = View()
        a, b = versioned(pod("a", "j", 0), "10"), versioned(pod("b", "j", 0), "11")
        server = Server([a, b], "11", [
            [{"type": "MODIFIED", "object": versioned({**a, "status": {"phase": "Running"}}, "12")}],  # then it ends
            [{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}}],
            [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}],
        ])
        informer = watch.Informer(view, "pods", None, server, asyncio.get_running_loop(), api_timeout=1.0)
        server.objects = [a]  # b is deleted while the watch is gone: the second list lacks it
        await run_until(informer, lambda: informer.lists == 2 and "ns/b" not in view.pods)
        return view, server, informer

    view, server, informer = asyncio.run(scenario())
    assert informer.synced.is_set()
    assert server.requests[:5] == [{}, {"watch": True, "resource_version": "11"},
                                   {"watch": True, "resource_version": "12"},
                                   {"watch": True, "resource_version": "15"}, {}]
    assert list(view.pods) == ["ns/a"]


def test_a_watch_refused_with_410_lists_afresh():
    async def scenario():
        view = View()
        server = Server([pod("a", "j", 0)], "5", [ApiException(status=410, reason="Gone")])
        informer = watch.Informer(view, "pods", None, server, asyncio.get_running_loop(), api_timeout=1.0)
        await run_until(informer, lambda: informer.lists == 2)
        return server

    assert asyncio.run(scenario()).requests[:3] == [{}, {"watch": True, "resource_version": "5"}, {}]


def test_a_namespaced_list_drops_only_ghosts_of_its_own_namespace():
    view = View()
    other = pod("x", "j", 0)
    other["metadata"]["namespace"] = "elsewhere"
    view.put("pods", other)
    view.put("pods", pod("gone", "j", 0))
    assert view.relisted("pods", [], 1.0, namespace="ns") == ["ns/gone"]
    assert list(view.pods) == ["elsewhere/x"]


def test_a_heartbeat_neither_changes_the_view_nor_wakes_the_loop():
    view = View()
    n = node("n1")
    n["status"]["conditions"] = [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-01-01T00:00:00Z"}]
    assert view.record("nodes", {"type": "ADDED", "object": versioned(n, "1")})
    kept = view.nodes["n1"]
    view.wake.clear()
    beat = versioned(n, "2")
    beat["status"] = {**n["status"], "conditions": [{**n["status"]["conditions"][0],
                                                      "lastHeartbeatTime": "2026-01-01T00:01:00Z"}]}
    assert not view.record("nodes", {"type": "MODIFIED", "object": beat})
    assert view.nodes["n1"] is kept and not view.wake.is_set()
    cordoned = versioned({**n, "spec": {**n.get("spec", {}), "unschedulable": True}}, "3")
    assert view.record("nodes", {"type": "MODIFIED", "object": cordoned})
    assert view.nodes["n1"]["spec"]["unschedulable"] is True and view.wake.is_set()


def test_queues_whose_crd_is_not_installed_are_none_and_do_not_hold_up_the_first_pass(monkeypatch):
    """A chart upgrade does not upgrade CRDs: an operator that watches Queues must still start without them."""
    monkeypatch.setattr(watch, "ABSENT_SECONDS", 0.01)

    class Absent:
        calls = 0

        def __call__(self, **kw):
            Absent.calls += 1
            raise ApiException(status=404, reason="Not Found")

    async def scenario():
        view = View()
        view.queues["stale"] = {"metadata": {"name": "stale"}}
        informer = watch.Informer(view, "queues", None, Absent(), asyncio.get_running_loop(), api_timeout=1.0)
        await run_until(informer, lambda: informer.synced.is_set() and Absent.calls >= 2)
        return view

    assert asyncio.run(scenario()).queues == {}


def test_a_404_of_a_kind_that_must_exist_is_retried_not_taken_for_none():
    async def scenario():
        view = View()
        server = Server([], "1", [])
        calls = []

        def refused(**kw):
            calls.append(kw)
            if len(calls) == 1:
                raise ApiException(status=404, reason="Not Found")
            return server(**kw)

        informer = watch.Informer(view, "pods", None, refused, asyncio.get_running_loop(), api_timeout=1.0)
        await run_until(informer, lambda: informer.synced.is_set())
        return calls

    assert len(asyncio.run(scenario())) >= 2
