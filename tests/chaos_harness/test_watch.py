"""The chaos suite's harm sampler (e2e/chaos/watch.py): what it counts, from API objects as data."""

from kubernetes import client

from e2e.chaos.outcome import Outcome
from e2e.chaos.watch import HarmSampler, duplicate_workers, gpus_beyond_allocatable, placements_on_missing_nodes


def pod(name, generation, rank, phase="Running", node="n1", gpus=1, owner="u1", deleting=False):
    meta = {"name": name, "namespace": "ns", "uid": f"pod-{name}",
            "labels": {"flotilla.dev/generation": str(generation), "flotilla.dev/rank": str(rank)},
            "ownerReferences": [{"uid": owner, "controller": True}]}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node, "containers": [
        {"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}, "status": {"phase": phase}}


def tj(name, uid="u1", phase="Running", steps=0, checkpoint=0, placement=(), total=100, ack=None, reshards=0):
    annotations = {}
    if ack is not None:
        annotations["flotilla.dev/checkpoint-ack"] = f'{{"generation":1,"step":{ack}}}'
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid, "annotations": annotations},
            "spec": {"totalSteps": total},
            "status": {"phase": phase, "progress": {"steps": steps}, "checkpoint": {"step": checkpoint},
                       "reshards": reshards,
                       "placement": [{"node": n, "gpus": g} for n, g in placement]}}


def node(name, gpus=8):
    return {"metadata": {"name": name}, "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}}


def test_one_worker_set_is_no_duplicate_and_a_terminating_old_generation_is_on_its_way_out():
    assert duplicate_workers([pod("a0", 0, 0), pod("a1", 0, 1)]) == (0, "")
    assert duplicate_workers([pod("a0", 0, 0, deleting=True), pod("b0", 1, 0), pod("x", 0, 1, "Succeeded")])[0] == 0


def test_two_generations_running_or_two_pods_in_one_slot_are_duplicates():
    excess, what = duplicate_workers([pod("a0", 0, 0), pod("a1", 0, 1), pod("b0", 1, 0), pod("b1", 1, 1)])
    assert excess == 2 and "Running beside generation 1" in what
    excess, what = duplicate_workers([pod("a0", 0, 0), pod("a0-copy", 0, 0, phase="Pending")])
    assert excess == 1 and "same generation and rank" in what


def test_gpus_beyond_allocatable_from_bound_pods_or_from_placements_across_jobs():
    nodes = [node("n1"), node("n2")]
    assert gpus_beyond_allocatable([tj("a", placement=[("n1", 8)])], [pod("a0", 0, 0, gpus=8)], nodes) == []
    over = gpus_beyond_allocatable([tj("a", placement=[("n1", 6)]), tj("b", uid="u2", placement=[("n1", 4)]),
                                    tj("done", uid="u3", phase="Succeeded", placement=[("n1", 8)])], [], nodes)
    assert [(n, x) for n, x, _ in over] == [("n1", 2)]
    terminating = pod("old", 0, 0, gpus=8, deleting=True)
    assert [(n, x) for n, x, _ in gpus_beyond_allocatable([], [terminating, pod("new", 1, 0, gpus=4)], nodes)] == [
        ("n1", 4)]
    # A placement on a node that does not exist is not "twice": it is reported on its own.
    ghost = [tj("a", placement=[("gone", 8)])]
    assert gpus_beyond_allocatable(ghost, [], nodes) == []
    assert placements_on_missing_nodes(ghost, nodes) == {"gone": {"ns/a"}}


class Sampled(HarmSampler):
    """The sampler fed with objects instead of polling an API server."""

    def __init__(self):
        super().__init__("ns", api=client.ApiClient())  # never called: nothing is started

    def sample(self):
        pass  # the last feed is the end state

    def feed(self, jobs, pods=(), nodes=(node("n1"),)):
        self._observe(list(jobs), list(jobs), list(pods), list(nodes))


def test_progress_below_an_acknowledged_checkpoint_is_counted_as_steps_lost():
    s = Sampled()
    s.feed([tj("a", steps=120, checkpoint=100)])
    s.feed([tj("a", steps=120, checkpoint=100, ack=140)])  # acknowledged, not consumed yet: status lags, no loss
    s.feed([tj("a", steps=100, checkpoint=100, ack=140, reshards=1)])  # resumed from 100 though 140 was acked
    s.feed([tj("a", steps=100, phase="Succeeded", total=100, checkpoint=100, ack=140, reshards=1)])
    out = s.fill(Outcome("c"))
    assert out.steps_lost_past_checkpoint == 40 and out.jobs_lost == 0
    assert "40 steps below checkpoint step 140" in out.details


def test_jobs_lost_failed_vanished_unfinished_or_succeeded_short_but_not_one_deleted_on_purpose():
    s = Sampled()
    s.feed([tj("failed", uid="1", phase="Failed"), tj("vanishes", uid="2"), tj("deleted", uid="3"),
            tj("short", uid="4", phase="Succeeded", steps=10), tj("fine", uid="5", phase="Succeeded", steps=100),
            tj("slow", uid="6", steps=50)])
    s.forget("3")
    s.feed([tj("failed", uid="1", phase="Failed"), tj("short", uid="4", phase="Succeeded", steps=10),
            tj("fine", uid="5", phase="Succeeded", steps=100), tj("slow", uid="6", steps=50),
            tj("deleted", uid="7", phase="Succeeded", steps=100)])  # a new job with the deleted one's name
    lost = s.lost_jobs()
    assert [x.split(" ")[0] for x in lost] == ["failed", "vanishes", "short", "slow"]
    assert [x.split(" ")[0] for x in s.lost_jobs(finished=False)] == ["failed", "vanishes", "short"]


def test_pods_are_a_jobs_by_owner_uid_not_by_name():
    s = Sampled()
    old_pods = [pod("reuse-w0", 0, 0, owner="old"), pod("reuse-w1", 0, 1, owner="old")]
    s.feed([tj("reuse", uid="new")], pods=old_pods + [pod("reuse-x-w0", 0, 0, owner="new")])
    assert s.fill(Outcome("c"), finished=False).duplicate_pods == 0
