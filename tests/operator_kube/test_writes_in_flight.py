"""A pass does not wait for its writes: the view shows them while they are on their way, an object is
written by one chain at a time, and the allocator never gives GPUs placed by a write in flight."""

import asyncio
import copy
import time

import pytest

from flotilla.allocation.fifo import FifoGang
from flotilla.operator import handlers
from flotilla.operator.actions import CreatePod, PatchAnnotations, PatchStatus
from flotilla.operator.view import CREATED_TTL_SECONDS, View, merge_patch
from tests.operator_plan.builders import node, pod, trainingjob, wname


def test_merge_patch_is_rfc_7386():
    target = {"phase": "Pending", "placement": [{"node": "a", "gpus": 2}], "checkpoint": {"step": 3, "time": "t"}}
    patch = {"phase": "Admitted", "placement": [{"node": "b", "gpus": 4}], "checkpoint": {"time": None}, "gpus": 4}
    assert merge_patch(target, patch) == {"phase": "Admitted", "placement": [{"node": "b", "gpus": 4}],
                                          "checkpoint": {"step": 3}, "gpus": 4}
    assert target["checkpoint"] == {"step": 3, "time": "t"}  # the view's copy is not changed in place


def with_version(body, version):
    out = copy.deepcopy(body)
    out["metadata"]["resourceVersion"] = str(version)
    return out


def test_patches_in_flight_show_until_answered_and_survive_a_newer_event():
    view = View()
    view.put("jobs", trainingjob("a"))
    view.expect("jobs", "ns/a", [PatchStatus("trainingjobs", "ns", "a", {"phase": "Admitted"}),
                                 PatchAnnotations("trainingjobs", "ns", "a", {"x": "1"})])
    assert view.jobs["ns/a"]["status"]["phase"] == "Admitted"
    assert view.jobs["ns/a"]["metadata"]["annotations"] == {"x": "1"}
    # A watch event from before the patch landed (someone else's change) keeps the patch on top.
    event = with_version(trainingjob("a", annotations={"rank0": "progress"}), 5)
    view.record("jobs", {"type": "MODIFIED", "object": event})
    assert view.jobs["ns/a"]["status"]["phase"] == "Admitted"
    assert view.jobs["ns/a"]["metadata"]["annotations"] == {"rank0": "progress", "x": "1"}
    answer = with_version(trainingjob("a", status={"phase": "Admitted", "gpus": 2}), 6)
    view.settle("jobs", "ns/a", answer)
    assert view.jobs["ns/a"]["status"] == {"phase": "Admitted", "gpus": 2}
    # Events are taken as they come, but what the patches set stays shown over a late one (from before
    # the patch landed) until the watch shows the write.
    view.record("jobs", {"type": "MODIFIED", "object": event})
    assert view.jobs["ns/a"]["status"] == {"phase": "Admitted"}
    assert view.jobs["ns/a"]["metadata"]["annotations"] == {"rank0": "progress", "x": "1"}
    shown = with_version(trainingjob("a", status={"phase": "Admitted", "gpus": 2}, annotations={"x": "1"}), 6)
    view.record("jobs", {"type": "MODIFIED", "object": shown})
    later = with_version(trainingjob("a", status={"phase": "Running"}), 7)  # someone else's write after ours
    view.record("jobs", {"type": "MODIFIED", "object": later})
    assert view.jobs["ns/a"]["status"] == {"phase": "Running"} and not view._written


def test_a_write_the_watch_showed_before_its_answer_came_is_not_shown_over_later_events():
    # A write chain (status patch, then pods) answered after the watch showed its version: the answer's version
    # was seen, so the write is shown, even where the object as stored does not carry every field the patch set
    # (the API server prunes what its schema does not know). Else the patch, checkpoint generation 1 included,
    # would be shown over every later event: the operator consumed the same acknowledgement at every pass.
    view = View()
    view.put("jobs", with_version(trainingjob("a"), 4))
    patch = {"checkpoint": {"generation": 1, "requestedGeneration": 2}, "pruned": True}
    view.expect("jobs", "ns/a", [PatchStatus("trainingjobs", "ns", "a", patch)])
    stored = with_version(trainingjob("a", status={"checkpoint": {"generation": 1, "requestedGeneration": 2}}), 6)
    view.record("jobs", {"type": "MODIFIED", "object": stored})
    view.settle("jobs", "ns/a", stored)
    assert not view._written
    later = with_version(trainingjob("a", status={"checkpoint": {"generation": 2, "requestedGeneration": 2}}), 9)
    view.record("jobs", {"type": "MODIFIED", "object": later})
    assert view.jobs["ns/a"]["status"] == {"checkpoint": {"generation": 2, "requestedGeneration": 2}}


def test_a_failed_write_leaves_the_object_as_last_seen():
    view = View()
    view.put("jobs", trainingjob("a"))
    view.expect("jobs", "ns/a", [PatchStatus("trainingjobs", "ns", "a", {"phase": "Admitted"})])
    view.record("jobs", {"type": "MODIFIED", "object": with_version(trainingjob("a", annotations={"k": "v"}), 3)})
    view.settle("jobs", "ns/a", None)
    assert view.jobs["ns/a"]["status"] == {}
    assert view.jobs["ns/a"]["metadata"]["annotations"] == {"k": "v"}


def test_an_object_deleted_while_its_write_is_in_flight_stays_deleted():
    view = View()
    view.put("jobs", trainingjob("a"))
    view.expect("jobs", "ns/a", [PatchStatus("trainingjobs", "ns", "a", {"phase": "Admitted"})])
    view.record("jobs", {"type": "DELETED", "object": trainingjob("a")})
    view.settle("jobs", "ns/a", with_version(trainingjob("a", status={"phase": "Admitted"}), 9))
    assert view.jobs == {}


class GatedKube:
    """Answers each object's actions only when the test opens that object's gate."""

    def __init__(self, view: View):
        self.view = view
        self.requests, self.throttled_seconds = 0, 0.0
        self.gates: dict[str, asyncio.Event] = {}
        self.applied: list[list] = []

    async def apply(self, actions):
        first = actions[0]
        name = first.name if isinstance(first, PatchStatus) else first.manifest["metadata"]["labels"]["flotilla.dev/job"]
        gate = self.gates.setdefault(name, asyncio.Event())
        self.applied.append(actions)
        await gate.wait()
        self.requests += len(actions)
        done = []
        for a in actions:
            if isinstance(a, PatchStatus):
                body = self.view.jobs.get(f"ns/{a.name}") or trainingjob(a.name)
                done.append((a, with_version({**body, "status": merge_patch(body.get("status"), a.status)}, 50)))
            else:
                done.append((a, True))
        return done


@pytest.fixture
def operator():
    return handlers.Operator(handlers.Settings(allocator=FifoGang()))


def placed_on(actions):
    return [s["placement"] for a in actions if isinstance(a, PatchStatus) and (s := a.status).get("placement")]


async def one_pass(operator, kube):
    await handlers._reconcile_once(operator, kube)
    await asyncio.sleep(0)  # the writes it handed off start


def test_the_next_pass_plans_with_the_placement_in_flight(operator):
    async def scenario():
        kube = GatedKube(operator.view)
        view = operator.view
        view.put("nodes", node("n0", gpus=8))
        view.put("jobs", trainingjob("late", min_gpus=8, max_gpus=8))
        await one_pass(operator, kube)
        assert [placed_on(a) for a in kube.applied] == [[[{"node": "n0", "gpus": 8}]]]
        assert any(isinstance(a, CreatePod) for a in kube.applied[0])
        # A job the watch delivers now, created earlier: first in FIFO order, so with "late" shown unplaced
        # the allocator would give it n0 while late's pods are being created there.
        early = trainingjob("early", min_gpus=8, max_gpus=8)
        early["metadata"]["creationTimestamp"] = "2025-12-31T00:00:00Z"
        view.put("jobs", early)
        await one_pass(operator, kube)
        assert len(kube.applied) == 2
        assert placed_on(kube.applied[1]) == [] and kube.applied[1][0].status["phase"] == "Pending"
        # While late's write is in flight its actions are not sent again.
        kube.gates["early"].set()
        await asyncio.sleep(0)
        await one_pass(operator, kube)
        assert [a[0].name for a in kube.applied] == ["late", "early"]
        kube.gates["late"].set()
        while operator.in_flight:
            await asyncio.sleep(0)
        assert view.jobs["ns/late"]["metadata"]["resourceVersion"] == "50"
        assert view.wake.is_set()
        # Its pods' watch events are late: the next pass does not create them again...
        await one_pass(operator, kube)
        assert len(kube.applied) == 2
        # ...unless they have not come for CREATED_TTL_SECONDS.
        assert view.has_pod("ns/" + wname("late", 0, 0), time.monotonic())
        assert not view.has_pod("ns/" + wname("late", 0, 0), time.monotonic() + CREATED_TTL_SECONDS + 1)
        # Once its watch event has come, a pass planned on a copy of the view from before does not create it.
        view.put("pods", pod(wname("late", 0, 0), "late", 0, "Pending"))
        assert view.has_pod("ns/" + wname("late", 0, 0), time.monotonic() + CREATED_TTL_SECONDS + 1)

    asyncio.run(scenario())
