"""Writes fenced by the Lease: refused once it is not certainly ours (a fake monotonic clock stands in for
a SIGSTOP), with timeouts that end before another replica could take it; the elector steps down."""

from __future__ import annotations

import asyncio
import logging

import pytest
import urllib3
from kubernetes import client
from kubernetes.client import rest

from flotilla.kubeapi import ApiClient, NotLeader
from flotilla.operator.actions import PatchStatus
from flotilla.operator.kube import Kube
from flotilla.operator.leader import LeaderElector, LeaseFence, LostLeadership, run_elected
from tests.operator_leader.test_leader import Clock, FakeLeases


def test_the_fence_refuses_after_the_renew_deadline_and_bounds_timeouts_by_the_lease():
    clock = Clock()
    fence = LeaseFence(duration_s=15, renew_deadline_s=10, clock=clock)
    with pytest.raises(NotLeader, match="not held"):
        fence.bound(10)
    fence.renewed(sent_at=0.0)
    clock.t = 2.0
    assert fence.bound(10) == 10
    clock.t = 8.0
    assert fence.bound(10) == 7.0  # a write sent now must be over by 15 s, when the Lease could be taken
    clock.t = 10.0
    with pytest.raises(NotLeader, match=r"lease not renewed for 10.0 s \(renew deadline 10.0 s\)"):
        fence.bound(10)


class Recorder:
    """Stands in for urllib3: records what would have been sent, and the timeout it would have had."""

    def __init__(self):
        self.sent: list[tuple[str, str, object]] = []

    def request(self, method, url, headers=None, body=None, post_params=None, _request_timeout=None):
        self.sent.append((method, url, _request_timeout))
        return rest.RESTResponse(urllib3.HTTPResponse(body=b"{}", status=200, preload_content=False,
                                                      headers={"Content-Type": "application/json"}))

    @property
    def pool_manager(self):
        """urllib3's pool, which `flotilla.kubeapi.send` sends through (the operator's writes)."""
        recorder = self

        class Pool:
            def request(self, method, url, body=None, headers=None, timeout=None, preload_content=True):
                recorder.sent.append((method, url, timeout.total))
                return urllib3.HTTPResponse(body=b"{}", status=200, preload_content=False,
                                            headers={"Content-Type": "application/json"})

        return Pool()


def fenced_client(fence, timeout=10.0):
    api = ApiClient(client.Configuration(host="http://127.0.0.1:1"), timeout=timeout, fence=fence,
                    user_agent="flotilla-operator/op-0_abc")
    api.rest_client = Recorder()
    return api


def test_every_request_has_a_timeout_and_a_paused_leaders_next_write_is_refused_unsent():
    clock = Clock()
    fence = LeaseFence(duration_s=15, renew_deadline_s=10, clock=clock)
    fence.renewed(sent_at=0.0)
    api = fenced_client(fence)
    core = client.CoreV1Api(api)
    core.read_namespaced_pod("p", "ns")
    core.delete_namespaced_pod("p", "ns")
    assert [(m, t) for m, _, t in api.rest_client.sent] == [("GET", 10.0), ("DELETE", 10.0)]
    assert api.user_agent == "flotilla-operator/op-0_abc"
    clock.t = 27.0  # SIGSTOP for 27 s, then SIGCONT: the monotonic clock counts the time stopped
    with pytest.raises(NotLeader):
        core.delete_namespaced_pod("p", "ns")
    core.read_namespaced_pod("p", "ns")  # reads are not fenced
    assert [m for m, _, _ in api.rest_client.sent] == ["GET", "DELETE", "GET"]


def test_the_executor_sends_nothing_once_fenced_and_its_chain_fails():
    clock = Clock()
    fence = LeaseFence(duration_s=15, renew_deadline_s=10, clock=clock)
    fence.renewed(sent_at=0.0)
    api = fenced_client(fence)
    kube = Kube(api, concurrency=2)
    clock.t = 8.0  # the executor's writes (flotilla.kubeapi.send, past the client's machinery) are fenced too:
    bound = fence.bound(10.0)  # sent, with a timeout that ends before the Lease could be taken
    assert bound < 10.0
    patch = PatchStatus("trainingjobs", "ns", "j", {"message": "stale"})
    assert [a for a, _ in asyncio.run(kube.apply([patch]))] == [patch]
    assert [(m, t) for m, _, t in api.rest_client.sent] == [("PATCH", bound)]
    api.rest_client.sent.clear()
    clock.t = 12.0
    patch = PatchStatus("trainingjobs", "ns", "j", {"message": "stale"})
    assert asyncio.run(kube.apply([patch])) == []
    assert api.rest_client.sent == []


def elector(api, clock):
    return LeaderElector(api, "ns", "op", "a", duration_s=15, renew_every_s=0.05, renew_deadline_s=10,
                         retry_every_s=0.01, clock=clock)


def test_a_leader_paused_past_its_deadline_steps_down_without_renewing(caplog):
    api, clock = FakeLeases(), Clock()
    a = elector(api, clock)

    async def scenario():
        async def main():
            clock.t = 30.0  # the process was stopped: no other replica even needed to take the Lease
            await asyncio.sleep(3600)

        return await run_elected(a, main, None)

    with caplog.at_level(logging.ERROR, logger="flotilla.operator.leader"):
        rc = asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert rc == 1
    assert api.version == 1  # acquired once, never renewed after the pause
    assert "lease ns/op not renewed for 30.0 s (renew deadline 10.0 s): refusing writes and stepping down" \
        in caplog.text


def test_lease_calls_of_a_leader_do_not_outlast_its_renew_deadline():
    api, clock = FakeLeases(), Clock()
    a = elector(api, clock)
    assert a.try_once()
    clock.t = 8.5
    api.down = True
    with pytest.raises(client.ApiException):
        a.try_once()
    assert api.timeouts == [10.0, 10.0, 1.5]  # read and create while not leader; a read 1.5 s before the deadline
    with pytest.raises(LostLeadership, match="not renewed"):
        clock.t = 10.0
        a._check_deadline()
