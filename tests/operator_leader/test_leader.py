"""Leader election: the pure decision, and the elector against an in-memory Lease API with resourceVersions."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes.client.rest import ApiException

from flotilla.operator.leader import LeaderElector, LeaseRecord, LostLeadership, Observed, next_record

NOW = "2026-01-01T00:00:00.000000Z"


@pytest.mark.parametrize("observed, now, want_holder", [
    (None, 0.0, "me"),                                                            # no Lease: create it
    (Observed(LeaseRecord("me", 15), changed_at=0.0, resource_version="1"), 100.0, "me"),  # ours: renew, even late
    (Observed(LeaseRecord("other", 15), changed_at=0.0, resource_version="1"), 14.9, None),  # live: wait
    (Observed(LeaseRecord("other", 15), changed_at=0.0, resource_version="1"), 15.0, "me"),  # expired: take
    (Observed(LeaseRecord("", 1), changed_at=0.0, resource_version="1"), 0.0, "me"),        # released: take at once
])
def test_next_record(observed, now, want_holder):
    got = next_record(observed, "me", 15, now, NOW)
    assert (got.holder if got else None) == want_holder


def test_taking_over_counts_a_transition_and_renewing_does_not():
    other = Observed(LeaseRecord("other", 15, transitions=3), changed_at=0.0, resource_version="1")
    assert next_record(other, "me", 15, 20.0, NOW).transitions == 4
    mine = Observed(LeaseRecord("me", 15, transitions=4, acquire_time="t0"), changed_at=0.0, resource_version="1")
    renewed = next_record(mine, "me", 15, 1.0, NOW)
    assert (renewed.transitions, renewed.acquire_time, renewed.renew_time) == (4, "t0", NOW)


class FakeLeases:
    """The three Lease calls the elector makes, with the API server's optimistic concurrency."""

    class api_client:  # noqa: N801 - mirrors the kubernetes client attribute
        @staticmethod
        def sanitize_for_serialization(obj):
            return obj

    def __init__(self):
        self.lease: dict | None = None
        self.version = 0
        self.down = False
        self.timeouts: list[float] = []

    def _check(self, timeout):
        self.timeouts.append(timeout)
        if self.down:
            raise ApiException(status=503)

    def read_namespaced_lease(self, name, namespace, _request_timeout=None):
        self._check(_request_timeout)
        if self.lease is None:
            raise ApiException(status=404)
        return {"metadata": {"resourceVersion": str(self.version)}, "spec": dict(self.lease["spec"])}

    def create_namespaced_lease(self, namespace, body, _request_timeout=None):
        self._check(_request_timeout)
        if self.lease is not None:
            raise ApiException(status=409)
        self.lease, self.version = body, self.version + 1

    def replace_namespaced_lease(self, name, namespace, body, _request_timeout=None):
        self._check(_request_timeout)
        if body["metadata"]["resourceVersion"] != str(self.version):
            raise ApiException(status=409)
        self.lease, self.version = body, self.version + 1


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def elector(api, name, clock):
    return LeaderElector(api, "ns", "op", name, duration_s=15, renew_every_s=0.01, renew_deadline_s=10,
                         retry_every_s=0.01, clock=clock)


def test_one_leader_then_takeover_after_expiry_then_release():
    api, clock = FakeLeases(), Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a.try_once() and not b.try_once()
    clock.t = 10.0
    assert a.try_once()            # a renews: the record changes
    clock.t = 20.0
    assert not b.try_once()        # b saw the renewal at t=20 (its read), so the lease is live for b
    clock.t = 36.0
    assert b.try_once()            # a stopped renewing 16 s ago on b's clock
    assert api.lease["spec"]["holderIdentity"] == "b" and api.lease["spec"]["leaseTransitions"] == 1
    assert not a.try_once()
    b.release()
    assert api.lease["spec"]["holderIdentity"] == ""
    assert a.try_once()            # released: no waiting


def test_a_stale_write_loses_the_race():
    api, clock = FakeLeases(), Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a.try_once()
    a.release()
    b._observed = a._observed = None
    # Both read the released Lease; only the first replace with that resourceVersion wins.
    observed_a, observed_b = a._read(), b._read()
    a._read = lambda: observed_a
    b._read = lambda: observed_b
    assert a.try_once() and not b.try_once()


def test_hold_gives_up_before_the_lease_could_be_taken():
    api, clock = FakeLeases(), Clock()
    a = elector(api, "a", clock)
    assert a.try_once()
    api.down = True
    clock.t = 10.0
    with pytest.raises(LostLeadership):
        asyncio.run(asyncio.wait_for(a.hold(), timeout=5))


def test_hold_gives_up_at_once_when_another_holds_the_lease():
    api, clock_a, clock_b = FakeLeases(), Clock(), Clock()
    a, b = elector(api, "a", clock_a), elector(api, "b", clock_b)
    assert a.try_once() and not b.try_once()
    clock_a.t, clock_b.t = 5.0, 20.0  # b saw no renewal for 20 s (a partition between a and the API server)
    assert b.try_once()
    with pytest.raises(LostLeadership, match="now held by b"):
        asyncio.run(asyncio.wait_for(a.hold(), timeout=5))


def test_bad_timings_are_refused():
    with pytest.raises(ValueError, match="renew interval < renew deadline < lease duration"):
        LeaderElector(FakeLeases(), "ns", "op", "a", duration_s=5, renew_every_s=5)
