"""Worker pods belong to the TrainingJob whose UID controls them, never to a job that took their job's name."""

import hashlib
import re

import pytest

from flotilla.allocation import JobDecision, Verdict
from flotilla.allocation.fifo import FifoGang
from flotilla.operator import training
from flotilla.operator.actions import CreatePod, DeletePod, PatchStatus
from flotilla.operator.reconcile import reconcile, training_snapshot
from tests.operator_plan.builders import T0, node, pod, trainingjob, wname

NOW = T0 + 60
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def status_patch(actions, name="reuse") -> dict:
    return next(a.status for a in actions if isinstance(a, PatchStatus) and a.name == name)


def created(actions) -> list[str]:
    return [a.manifest["metadata"]["name"] for a in actions if isinstance(a, CreatePod)]


def test_a_pod_name_carries_a_hash_of_the_jobs_uid():
    h = hashlib.sha256(b"1234-abcd").hexdigest()[:5]
    assert training.pod_name("reuse", "1234-abcd", 3, 1) == f"reuse-{h}-g3-w1"
    assert training.pod_name("reuse", "1234-abcd", 0, 0) != training.pod_name("reuse", "5678-ef01", 0, 0)


@pytest.mark.parametrize("job", ["a" * 253, "x" * 50 + "-" + "y" * 20, "ab." + "c" * 60])
def test_a_long_job_name_is_cut_to_keep_the_pod_name_a_dns_label(job):
    name = training.pod_name(job, "uid", 12, 345)
    assert len(name) <= 63 and DNS_LABEL.match(name.replace(".", "-")) and not re.search(r"[.-]-", name)
    assert name.endswith(f"-{training.uid_hash('uid')}-g12-w345")


def test_worker_pods_are_controlled_by_the_job_uid_and_labelled_with_it():
    body = trainingjob("reuse")
    [p] = training.worker_pods(body, {"n0": 1}, 0)
    meta = p["metadata"]
    assert meta["name"] == wname("reuse", 0, 0)
    assert meta["labels"]["flotilla.dev/job"] == "reuse" and meta["labels"]["flotilla.dev/job-uid"] == "uid-reuse"
    assert meta["labels"]["flotilla.dev/generation"] == "0" and meta["labels"]["flotilla.dev/rank"] == "0"
    assert [(r["kind"], r["uid"], r["controller"]) for r in meta["ownerReferences"]] == [
        ("TrainingJob", "uid-reuse", True)]
    env = {e["name"]: e.get("value") for e in p["spec"]["containers"][0]["env"]}
    assert env["FLOTILLA_JOB_UID"] == "uid-reuse"


def old_jobs_pods(owner_uid):
    """What `kubectl delete tj reuse --cascade=orphan` leaves: the old job's workers, rank 0 Succeeded, rank 1
    still running on n0, labelled for "reuse", named as the old operator named them and as the new one would."""
    return {f"ns/{name}": pod(name, "reuse", 0, phase, node_name="n0", gpus=4, owner_uid=owner_uid)
            for name, phase in (("reuse-g0-w0", "Succeeded"), ("reuse-g0-w1", "Running"),
                                (wname("reuse", 0, 0), "Succeeded"))}


@pytest.mark.parametrize("owner_uid", [None, "uid-reuse-deleted"], ids=["orphaned", "owned-by-the-old-uid"])
def test_a_new_job_with_an_old_name_starts_from_nothing(owner_uid):
    new = trainingjob("reuse", min_gpus=4, max_gpus=4)
    jobs, nodes, pods = {"ns/reuse": new}, {"n0": node("n0"), "n1": node("n1")}, old_jobs_pods(owner_uid)
    actions = reconcile(NOW, FifoGang(), jobs, nodes, pods, {}, {})
    st = status_patch(actions)
    assert st["phase"] == "Admitted"
    assert not [a for a in actions if isinstance(a, DeletePod)]  # not its pods: never its to delete
    assert created(actions) == [wname("reuse", 0, r) for r in range(4)]

    # Its placement recorded, the old rank 0's Succeeded pod (even one of the very name it would create)
    # does not finish it: the missing pods of its own are created.
    placed = trainingjob("reuse", min_gpus=4, max_gpus=4, status={
        "phase": "Admitted", "placement": st["placement"], "gpus": 4, "workers": 4})
    again = reconcile(NOW + 1, FifoGang(), {"ns/reuse": placed}, nodes, pods, {}, {})
    assert "phase" not in status_patch(again) or status_patch(again)["phase"] != "Succeeded"
    assert sorted(created(again)) == sorted(wname("reuse", 0, r) for r in range(4))


def test_an_orphan_holding_gpus_is_foreign_to_the_allocator():
    new = trainingjob("reuse", min_gpus=4, max_gpus=4)
    snap = training_snapshot(NOW, {"ns/reuse": new}, {"n0": node("n0")}, old_jobs_pods(None))
    assert [(n.name, n.foreign_gpus) for n in snap.nodes] == [("n0", 4)]  # rank 1 runs; the Succeeded hold none
    # The same pods controlled by the live job, on its recorded placement, are its own, not foreign.
    placed = trainingjob("reuse", min_gpus=4, max_gpus=4, status={"phase": "Running",
                                                                  "placement": [{"node": "n0", "gpus": 4}]})
    mine = {k: pod(p["metadata"]["name"], "reuse", 0, p["status"]["phase"], node_name="n0", gpus=4)
            for k, p in old_jobs_pods(None).items()}
    assert [n.foreign_gpus for n in training_snapshot(NOW, {"ns/reuse": placed}, {"n0": node("n0")}, mine).nodes] == [0]


def test_a_jobs_old_worker_set_terminating_where_it_no_longer_runs_is_not_given_away():
    # "mover" left n0 for n1 (recorded); its old rank 0 still terminates on n0 with 4 GPUs. A newcomer that
    # needs the other 12 GPUs waits until the old pod is gone.
    mover = trainingjob("mover", min_gpus=4, max_gpus=4, status={
        "phase": "Resharding", "reshards": 1, "placement": [{"node": "n1", "gpus": 4}], "gpus": 4, "workers": 4})
    old = pod(wname("mover", 0, 0), "mover", 0, node_name="n0", gpus=4)
    old["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:59Z"
    new = [pod(wname("mover", 1, r), "mover", 1, "Pending", node_name="n1") for r in range(4)]
    pods = {f"ns/{p['metadata']['name']}": p for p in (old, *new)}
    nodes = {"n0": node("n0"), "n1": node("n1")}
    snap = training_snapshot(NOW, {"ns/mover": mover}, nodes, pods)
    assert {n.name: n.foreign_gpus for n in snap.nodes} == {"n0": 4, "n1": 0}
    newcomer = trainingjob("big", min_gpus=12, max_gpus=12)
    actions = reconcile(NOW, FifoGang(), {"ns/mover": mover, "ns/big": newcomer}, nodes, pods, {}, {})
    assert not status_patch(actions, "big").get("placement")
    del pods[f"ns/{old['metadata']['name']}"]  # gone: n0 is free
    actions = reconcile(NOW, FifoGang(), {"ns/mover": mover, "ns/big": newcomer}, nodes, pods, {}, {})
    assert status_patch(actions, "big")["placement"] == [{"node": "n0", "gpus": 8}, {"node": "n1", "gpus": 4}]


def test_a_foreign_rank0_that_succeeded_does_not_finish_a_running_job():
    # A pod of rank 0's very name (a 5-hex hash collision) that another UID controls, Succeeded.
    running = {"phase": "Running", "placement": [{"node": "n0", "gpus": 2}], "startedAt": "2026-01-01T00:00:10Z"}
    pods = {f"ns/{p['metadata']['name']}": p for p in (
        pod(wname("job", 0, 0), "job", 0, "Succeeded", owner_uid="uid-other"), pod(wname("job", 0, 1), "job", 0))}
    actions = reconcile(NOW, FifoGang(), {"ns/job": trainingjob(status=running)}, {"n0": node("n0")}, pods, {}, {})
    assert not [a for a in actions if isinstance(a, PatchStatus) and a.status.get("phase") == "Succeeded"]
    assert created(actions) == [wname("job", 0, 0)]  # its own rank 0 is missing (the executor checks the 409)


def test_a_new_worker_set_waits_for_the_old_pods_on_its_nodes():
    # Moved from n0 to n0+n1 after a checkpoint: the old rank 0 is still terminating on n0 (it holds its GPU
    # until its containers are gone); the new pod on n1 may start, the one on n0 waits.
    status = {"phase": "Resharding", "reshards": 1, "placement": [{"node": "n0", "gpus": 1}, {"node": "n1", "gpus": 1}],
              "gpus": 2, "workers": 2, "startedAt": "2026-01-01T00:00:10Z"}
    body = trainingjob(status=status)
    decision = JobDecision("ns/job", Verdict.ADMITTED, {"n0": 1, "n1": 1}, "grown")
    terminating = pod(wname("job", 0, 0), "job", 0, node_name="n0")
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:58Z"
    actions = training.plan_job(body, [terminating], decision, NOW, "p")
    assert created(actions) == [wname("job", 1, 1)]
    assert not [a for a in actions if isinstance(a, DeletePod)]  # already terminating: not deleted again
    patch = next(a.status for a in actions if isinstance(a, PatchStatus))
    assert patch["message"] == "waiting for the previous worker set's pods to terminate on n0"
    # Gone (or finished: a Failed or Succeeded pod holds no GPU): the pod on n0 is created.
    for rest in ([], [pod(wname("job", 0, 0), "job", 0, "Failed", node_name="n0")]):
        later = training.plan_job(body, rest, decision, NOW + 5, "p")
        assert created(later) == [wname("job", 1, 0), wname("job", 1, 1)]


def test_old_pods_are_deleted_by_uid_with_their_grace_period():
    running = {"phase": "Running", "placement": [{"node": "n0", "gpus": 1}], "reshards": 1}
    decision = JobDecision("ns/job", Verdict.ADMITTED, {"n0": 1}, "running")
    stale = pod(wname("job", 0, 0), "job", 0, node_name="n1")
    actions = training.plan_job(trainingjob(status=running), [stale], decision, NOW, "p")
    assert [a for a in actions if isinstance(a, DeletePod)] == [DeletePod("ns", wname("job", 0, 0),
                                                                          f"pod-uid-{wname('job', 0, 0)}")]
