"""The executor's ordering and rate limiting (glue: the API calls are replaced, nothing is sent)."""

import asyncio

import pytest
from kubernetes import client

from flotilla.operator.actions import CreatePod, DeletePod, PatchAnnotations, PatchStatus, PostEvent
from flotilla.operator.kube import Kube, RateLimiter, chains


def patch(name):
    return PatchStatus("trainingjobs", "ns", name, {"phase": "Admitted"})


def create(name):
    return CreatePod({"metadata": {"namespace": "ns", "name": name}})


EVENT = PostEvent({"name": "a", "namespace": "ns"}, "Normal", "X", "m")


@pytest.mark.parametrize("actions, expected", [
    ([], []),
    ([patch("a"), create("a-0"), patch("b"), create("b-0")], [[patch("a"), create("a-0")], [patch("b"), create("b-0")]]),
    # An object's status and annotation patches stay in one chain.
    ([patch("a"), PatchAnnotations("trainingjobs", "ns", "a", {"k": "v"}), create("a-0"), EVENT],
     [[patch("a"), PatchAnnotations("trainingjobs", "ns", "a", {"k": "v"}), create("a-0"), EVENT]]),
    # Actions before any patch: a chain of their own; an object with no patch stays behind the one before it.
    ([DeletePod("ns", "x"), patch("a"), create("a-0"), create("c-0")],
     [[DeletePod("ns", "x")], [patch("a"), create("a-0"), create("c-0")]]),
])
def test_chains_split_at_each_objects_patches(actions, expected):
    assert chains(actions) == expected


def test_rate_limiter_allows_a_burst_then_spaces_requests_at_qps():
    now = [0.0]
    limiter = RateLimiter(qps=10, burst=3, clock=lambda: now[0])
    assert [limiter.delay() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert [round(limiter.delay(), 3) for _ in range(2)] == [0.1, 0.2]  # queued behind each other
    now[0] = 1.0  # the bucket refills at 10/s up to the burst, less what the queued two took
    assert [limiter.delay() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.delay() > 0


def test_no_qps_means_no_limit_and_a_burst_below_one_is_refused():
    assert all(RateLimiter(0, 0).delay() == 0.0 for _ in range(1000))
    with pytest.raises(ValueError, match="burst"):
        RateLimiter(5, 0)


def run_with(fails: set[str], actions):
    kube = Kube(client.ApiClient(), concurrency=4)
    calls = []

    def call(a):
        name = a.name if isinstance(a, PatchStatus) else a.manifest["metadata"]["name"]
        calls.append(name)
        if name in fails:
            raise client.ApiException(status=500, reason="boom")
        return {"name": name}

    kube._call = call
    done = asyncio.run(kube.apply(actions))
    return calls, [r["name"] for _, r in done], kube.requests


def test_a_chain_whose_patch_fails_creates_no_pods_and_other_chains_go_on():
    calls, done, requests = run_with({"a"}, [patch("a"), create("a-0"), patch("b"), create("b-0")])
    assert sorted(calls) == ["a", "b", "b-0"] and sorted(done) == ["b", "b-0"] and requests == 3
    assert calls.index("b") < calls.index("b-0")


@pytest.mark.parametrize("flag, value", [("--concurrency", "0"), ("--qps", "-1"), ("--burst", "0")])
def test_the_operator_refuses_a_bad_knob_naming_it(flag, value):
    import argparse

    from flotilla.commands import operator

    parser = argparse.ArgumentParser()
    operator.add_arguments(parser)
    with pytest.raises(SystemExit, match=f"^{flag} must be at least"):
        operator.run(parser.parse_args([flag, value]))


def test_a_chain_deletes_its_old_pods_before_it_creates_new_ones():
    # An operator killed between the two must not leave two worker sets running side by side.
    kube = Kube(client.ApiClient(), concurrency=4)
    calls = []

    async def slow_delete_first(a):
        if isinstance(a, DeletePod):
            await asyncio.sleep(0.05)  # the delete answers late: the create must still wait for it
        calls.append(a.name if isinstance(a, (PatchStatus, DeletePod)) else getattr(a, "manifest", {"metadata": {
            "name": type(a).__name__}})["metadata"]["name"])
        return {"ok": True}

    kube._run = slow_delete_first
    actions = [patch("a"), create("a-g1-w0"), DeletePod("ns", "a-g0-w0"), EVENT]
    done = asyncio.run(kube.apply(actions))
    assert calls.index("a") < calls.index("a-g0-w0") < calls.index("a-g1-w0")
    assert calls.index("a-g0-w0") < calls.index("PostEvent") and len(done) == 4
