"""No API call waits forever: a request to a server that never answers times out, and an object whose write
hung is no longer in flight and is planned again on a later pass."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import urllib3
from kubernetes import client

from flotilla.kubeapi import ApiClient, ApiTimeout
from flotilla.operator import handlers
from flotilla.operator.actions import PatchStatus
from flotilla.operator.kube import Kube
from tests.operator_kube.test_writes_in_flight import operator  # noqa: F401 - fixture
from tests.operator_plan.builders import node, trainingjob


@pytest.fixture
def silent_server():
    """Accepts connections and never answers (a hung API server, a half-open connection)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    server.close()


def test_a_request_without_a_timeout_of_its_own_gets_the_clients(silent_server):
    configuration = client.Configuration(host=silent_server)
    configuration.retries = False
    core = client.CoreV1Api(ApiClient(configuration, timeout=0.3))
    for _ in range(2):  # the first call also builds the client's validators: timed is the second
        started = time.monotonic()
        with pytest.raises(ApiTimeout, match=r"GET .*/namespaces/ns/pods/p: no answer within 0.3 s"):
            core.read_namespaced_pod("p", "ns")
    assert time.monotonic() - started < 2


def test_a_hung_write_fails_its_chain_and_the_object_is_planned_again(operator, monkeypatch):  # noqa: F811
    monkeypatch.setattr(Kube, "TIMEOUT_GRACE_SECONDS", 0.05)
    release = threading.Event()
    sent: list[str] = []

    def call(action):
        sent.append(type(action).__name__)
        if len(sent) == 1:
            release.wait(10)  # the first write hangs (its client did not keep its timeout)
            raise urllib3.exceptions.ReadTimeoutError(None, "/", "read timed out")
        if isinstance(action, PatchStatus):
            body = operator.view.jobs["ns/j"]
            return {**body, "status": {**body["status"], **action.status},
                    "metadata": {**body["metadata"], "resourceVersion": "2"}}
        return True

    async def scenario():
        kube = Kube(client.ApiClient(), concurrency=4, timeout=0.05)
        kube._call = call
        operator.view.put("nodes", node("n0", gpus=8))
        operator.view.put("jobs", trainingjob("j", min_gpus=4, max_gpus=4))
        await handlers._reconcile_once(operator, kube)
        assert list(operator.in_flight) == [("jobs", "ns/j")]
        assert operator.view.jobs["ns/j"]["status"]["phase"] == "Admitted"  # shown while on its way
        while operator.in_flight:
            await asyncio.sleep(0.01)
        assert operator.view.jobs["ns/j"]["status"] == {}  # given up: shown as the API server has it
        await handlers._reconcile_once(operator, kube)  # planned again
        while operator.in_flight:
            await asyncio.sleep(0.01)
        assert sent[:2] == ["PatchStatus", "PatchStatus"]
        assert operator.view.jobs["ns/j"]["status"]["phase"] == "Admitted"

    try:
        asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    finally:
        release.set()
