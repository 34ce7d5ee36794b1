"""The unified pool in the operator's reconcile pass: serving borrows training's surplus through the
resharding protocol, grows only into GPUs that are really free, and gives back after the hold-down."""

from __future__ import annotations

import copy
import json

import pytest

from flotilla.allocation import policies
from flotilla.operator import serving
from flotilla.operator.actions import ApplyDeployment, CreatePod, DeletePod, PatchAnnotations, PatchStatus, PostEvent
from flotilla.operator.pool import arbitrate
from flotilla.operator.reconcile import reconcile
from flotilla.operator.timeutil import rfc3339
from flotilla.pool import PoolPolicy
from tests.operator_plan.builders import T0, node, pod, trainingjob, wname

NOW = T0 + 60
POLICY = PoolPolicy(forecast_headroom=0.0, hold_down_seconds=300)


def job(status=None, min_gpus=2, deadline_seconds=36000):
    body = trainingjob("a", min_gpus=min_gpus, max_gpus=16, status=status, deadline_seconds=deadline_seconds)
    body["spec"]["totalSteps"] = 100_000
    body["spec"]["throughput"] = [{"gpus": 1, "stepsPerSecond": 1.0}, {"gpus": 16, "stepsPerSecond": 15.0}]
    return body


def running(placement: dict[str, int], generation: int = 0, **extra):
    # Rank 0 has reported its rate (the curve's) on this worker set.
    progress = {"steps": 2000, "stepsPerSecond": round(1.0 + 14.0 * (sum(placement.values()) - 1) / 15, 3),
                "updatedAt": rfc3339(T0 + 30)}
    return {"phase": "Running", "reshards": generation, "startedAt": rfc3339(T0), "policy": "elastic-deadline",
            "placement": [{"node": n, "gpus": g} for n, g in sorted(placement.items())],
            "gpus": sum(placement.values()), "deadline": rfc3339(T0 + 36000), "observedGeneration": 1,
            "progress": progress, **extra}


def workers(placement: dict[str, int], generation: int = 0, **owner) -> dict[str, dict]:
    out, rank = {}, 0
    for n, g in sorted(placement.items()):
        for _ in range(g):
            p = pod(wname("a", generation, rank), "a", generation, node_name=n, **owner)
            out[f"ns/{p['metadata']['name']}"] = p
            rank += 1
    return out


def chat(p: int, d: int, status=None, max_gpus: int = 12):
    tpl = lambda n: {"gpusPerInstance": 2, "template": {"spec": {"containers": [{"name": n, "image": "vllm"}]}}}  # noqa: E731
    return {"apiVersion": "flotilla.dev/v1alpha1", "kind": "ServingDeployment",
            "metadata": {"name": "chat", "namespace": "ns", "uid": "u1", "generation": 1},
            "spec": {"slo": {"ttftMs": 400, "tpotMs": 50}, "maxGPUs": max_gpus, "prefill": tpl("p"),
                     "decode": tpl("d"), "planner": {"mode": "fixed", "prefillReplicas": p, "decodeReplicas": d}},
            "status": status or {"lastPlan": {"time": rfc3339(T0), "reason": "fixed"}}}


def serving_pods(role: str, nodes: list[str], terminating: bool = False) -> dict[str, dict]:
    out = {}
    for i, n in enumerate(nodes):
        meta = {"name": f"chat-{role}-{i}", "namespace": "ns",
                "labels": {"flotilla.dev/serving": "chat", "flotilla.dev/role": role}}
        if terminating:
            meta["deletionTimestamp"] = rfc3339(NOW)
        out[f"ns/{meta['name']}"] = {"metadata": meta, "spec": {"nodeName": n, "containers": [
            {"name": role, "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}, "status": {"phase": "Running"}}
    return out


def deployments(prefill: int, decode: int) -> dict[str, dict]:
    body = chat(prefill, decode)
    return {f"ns/chat-{role}": {**serving.deployment(body, role, n, 2), "status": {"readyReplicas": n, "replicas": n}}
            for role, n in (("prefill", prefill), ("decode", decode))}


NODES = {n: node(n) for n in ("n0", "n1")}


def run(jobs, pods, sds, deps, now=NOW, policy=POLICY):
    return reconcile(now, policies.get("elastic-deadline"), jobs, NODES, pods, sds, deps, pool=policy)


def status_patch(actions, name):
    return next((a.status for a in actions if isinstance(a, PatchStatus) and a.name == name), {})


def replicas(actions):
    return {a.manifest["metadata"]["name"]: a.manifest["spec"]["replicas"]
            for a in actions if isinstance(a, ApplyDeployment)}


def events(actions, reason):
    return [a.message for a in actions if isinstance(a, PostEvent) and a.reason == reason]


def test_a_serving_burst_is_met_from_a_jobs_surplus_through_a_checkpoint_then_on_the_freed_gpus():
    full = {"n0": 8, "n1": 8}
    # 1. The job holds the whole cluster; chat's plan needs 6 GPUs: the job is asked for a checkpoint, and
    #    chat's Deployments may not grow yet (nothing is free).
    first = run({"ns/a": job(running(full))}, workers(full), {"ns/chat": chat(1, 2)}, {})
    ask = next(a for a in first if isinstance(a, PatchAnnotations) and a.name == "a")
    request = json.loads(ask.annotations["flotilla.dev/checkpoint-request"])
    assert "lent 6 GPUs to sd/chat" in request["reason"]
    assert status_patch(first, "a")["phase"] == "Resharding"
    assert replicas(first) == {"chat-prefill": 0, "chat-decode": 0}
    sd_status = status_patch(first, "chat")
    assert sd_status["pool"]["grantedGPUs"] == 6 and "borrowed 6 GPUs from tj/a" in sd_status["pool"]["reason"]
    assert not any(isinstance(a, DeletePod) for a in first)

    # 2. Rank 0 acknowledged: the job switches to the 10 GPUs chat leaves it (any whole-worker count), records the loan
    #    and deletes its old workers; its new ones wait until the old have left their GPUs.
    asked = job(running(full, checkpoint={"requestedGeneration": request["generation"], "generation": 0,
                                          "requestedAt": rfc3339(NOW), "reason": request["reason"]}))
    asked["metadata"]["annotations"] = {"flotilla.dev/checkpoint-ack": json.dumps(
        {"generation": request["generation"], "step": 5000, "time": rfc3339(NOW)})}
    second = run({"ns/a": asked}, workers(full), {"ns/chat": chat(1, 2)}, deployments(0, 0))
    switched = status_patch(second, "a")
    assert switched["gpus"] == 10 and switched["reshards"] == 1
    assert switched["lentTo"] == [{"serving": "ns/chat", "gpus": 6}]
    assert events(second, "LentGPUs") == ["lent 6 GPUs to sd/chat (6 in all)"]
    assert sum(isinstance(a, DeletePod) for a in second) == 16 and not any(isinstance(a, CreatePod) for a in second)
    assert replicas(second) == {}  # the old workers still hold every GPU

    # 3. The old workers are gone, the new ones are pinned: chat grows into the free GPUs and names its lender.
    shrunk = job(running({p["node"]: p["gpus"] for p in switched["placement"]}, 1,
                         lentTo=switched["lentTo"]))
    third = run({"ns/a": shrunk}, workers({p["node"]: p["gpus"] for p in switched["placement"]}, 1),
                {"ns/chat": chat(1, 2)}, deployments(0, 0))
    assert replicas(third) == {"chat-prefill": 1, "chat-decode": 2}
    assert status_patch(third, "chat")["borrowedFrom"] == [{"job": "ns/a", "gpus": 6}]
    assert events(third, "BorrowedGPUs") == ["borrowed 6 GPUs from tj/a (6 in all)"]
    assert not any(isinstance(a, (PatchAnnotations, DeletePod)) for a in third)


def test_a_shrink_whose_old_workers_are_still_terminating_is_not_shrunk_again():
    """The flake of e2e/test_unified.py's borrow test under load: between the switch and its old workers'
    end, the GPUs they hold were neither free for serving nor the job's, so the arbiter borrowed them a second
    time (a new checkpoint request to shrink to 4) and gave them back once the workers were gone: the job
    went 16 -> 10 -> 4 -> 10 within one scale-up of serving. They are on their way to serving: it waits."""
    full = {"n0": 8, "n1": 8}
    shrunk_to = {"n0": 2, "n1": 8}  # what the switch of the first test records: chat is lent 6 GPUs
    shrunk = job(running(shrunk_to, 1, lentTo=[{"serving": "ns/chat", "gpus": 6}]))
    old = workers(full)
    for p in old.values():
        p["metadata"]["deletionTimestamp"] = rfc3339(NOW)
    leaving = run({"ns/a": shrunk}, old, {"ns/chat": chat(1, 2)}, deployments(0, 0))
    assert not any(isinstance(a, (PatchAnnotations, DeletePod, CreatePod)) for a in leaving)
    assert "phase" not in status_patch(leaving, "a") and "gpus" not in status_patch(leaving, "a")
    shared = arbitrate(NOW, POLICY, {"ns/a": shrunk}, NODES, old, {"ns/chat": chat(1, 2)})
    assert shared.jobs["ns/a"].gpus == 10 and not shared.lending
    grant = shared.serving["ns/chat"]
    assert (grant.gpus, grant.budget) == (6, 0)  # granted, and used once the old workers have left
    assert replicas(leaving) == {}

    gone = run({"ns/a": shrunk}, workers(shrunk_to, 1), {"ns/chat": chat(1, 2)}, deployments(0, 0))
    assert replicas(gone) == {"chat-prefill": 1, "chat-decode": 2}
    assert not any(isinstance(a, PatchAnnotations) for a in gone)


def test_a_burst_that_would_break_a_guarantee_is_refused_by_policy_and_says_so():
    full = {"n0": 8, "n1": 8}
    # 100,000 steps by the deadline needs every GPU: the whole cluster is the job's guaranteed share.
    tight = job(running(full), min_gpus=2, deadline_seconds=100_000 // 15 + 120)
    actions = run({"ns/a": tight}, workers(full), {"ns/chat": chat(1, 2)}, {})
    assert not any(isinstance(a, PatchAnnotations) for a in actions)  # no checkpoint request: the job keeps 16
    sd_status = status_patch(actions, "chat")
    assert sd_status["pool"]["grantedGPUs"] == 0
    risk = next(c for c in sd_status["conditions"] if c["type"] == "SLOAtRisk")
    assert risk["status"] == "True" and "break the guaranteed share of tj/a" in risk["message"]
    assert replicas(actions) == {"chat-prefill": 0, "chat-decode": 0}

    allowed = run({"ns/a": tight}, workers(full), {"ns/chat": chat(1, 2)}, {},
                  policy=PoolPolicy(forecast_headroom=0.0, borrow_guaranteed=True))
    ask = next(a for a in allowed if isinstance(a, PatchAnnotations))
    assert "deadline is no longer guaranteed" in json.loads(ask.annotations["flotilla.dev/checkpoint-request"])["reason"]


def test_serving_gives_back_only_after_the_hold_down_and_the_job_grows_back_once_the_pods_are_gone():
    job_on = {"n0": 8}
    a = job(running(job_on, 1, lentTo=[{"serving": "ns/chat", "gpus": 6}]))
    pods = {**workers(job_on, 1), **serving_pods("prefill", ["n1"]), **serving_pods("decode", ["n1", "n1"])}
    sd_status = {"lastPlan": {"time": rfc3339(T0), "reason": "fixed"}, "borrowedFrom": [{"job": "ns/a", "gpus": 6}],
                 "prefillReplicas": 1, "decodeReplicas": 2, "ratio": "1:2", "gpus": 6}
    # The plan drops to nothing: chat keeps its 6 GPUs through the hold-down, the job stays as it is.
    during = run({"ns/a": a}, pods, {"ns/chat": chat(0, 0, sd_status)}, deployments(1, 2))
    held = status_patch(during, "chat")["pool"]
    assert held["grantedGPUs"] == 6 and held["belowSince"] == rfc3339(NOW) and "hold-down" in held["reason"]
    assert replicas(during) == {} and not any(isinstance(x, PatchAnnotations) for x in during)

    # After the hold-down: both Deployments go to 0; the job may not grow while chat's pods are still there.
    later = NOW + 301
    sd_status["pool"] = held
    after = run({"ns/a": a}, pods, {"ns/chat": chat(0, 0, sd_status)}, deployments(1, 2), now=later)
    assert replicas(after) == {"chat-prefill": 0, "chat-decode": 0}
    assert status_patch(after, "chat")["pool"]["grantedGPUs"] == 0
    assert not any(isinstance(x, PatchAnnotations) for x in after)
    terminating = {**workers(job_on, 1), **serving_pods("decode", ["n1", "n1"], terminating=True)}
    still = run({"ns/a": a}, terminating, {"ns/chat": chat(0, 0, sd_status)}, deployments(0, 0), now=later)
    assert not any(isinstance(x, PatchAnnotations) for x in still)
    frozen = arbitrate(later, POLICY, {"ns/a": a}, NODES, pods, {"ns/chat": chat(0, 0, sd_status)})
    assert frozen.jobs["ns/a"].gpus == 8 and frozen.jobs["ns/a"].reason == "waiting for sd/chat to give back GPUs"

    # chat's pods are gone: the job is asked for a checkpoint to grow back to the whole cluster.
    grow = run({"ns/a": a}, workers(job_on, 1), {"ns/chat": chat(0, 0, sd_status)}, deployments(0, 0), now=later)
    ask = next(x for x in grow if isinstance(x, PatchAnnotations))
    assert "grows 8->16 GPUs" in json.loads(ask.annotations["flotilla.dev/checkpoint-request"])["reason"]

    # Had its worker set not reported a rate yet, whether growing pays back its restore could not be told: it
    # would keep its size.
    unmeasured = copy.deepcopy(a)
    del unmeasured["status"]["progress"]
    kept = run({"ns/a": unmeasured}, workers(job_on, 1), {"ns/chat": chat(0, 0, sd_status)}, deployments(0, 0),
               now=later)
    assert not any(isinstance(x, PatchAnnotations) for x in kept)


def test_growing_back_pays_the_loan_off_and_tells_the_borrower():
    job_on = {"n0": 8}
    status = running(job_on, 1, lentTo=[{"serving": "ns/chat", "gpus": 6}],
                     checkpoint={"requestedGeneration": 2, "generation": 1, "requestedAt": rfc3339(NOW),
                                 "reason": "grow"})
    a = job(status)
    a["metadata"]["annotations"] = {"flotilla.dev/checkpoint-ack": json.dumps(
        {"generation": 2, "step": 7000, "time": rfc3339(NOW)})}
    sd_status = {"lastPlan": {"time": rfc3339(T0), "reason": "fixed"}, "borrowedFrom": [{"job": "ns/a", "gpus": 6}],
                 "prefillReplicas": 0, "decodeReplicas": 0, "ratio": "0:0", "gpus": 0}
    actions = run({"ns/a": a}, workers(job_on, 1), {"ns/chat": chat(0, 0, sd_status)}, deployments(0, 0))
    switched = status_patch(actions, "a")
    assert switched["gpus"] == 16 and switched["lentTo"] == []
    assert events(actions, "GotGPUsBack") == ["got 6 GPUs back from sd/chat"]

    # The next pass, the borrower's ledger follows the lender's.
    paid = copy.deepcopy(a)
    paid["status"]["lentTo"] = switched["lentTo"]
    after = run({"ns/a": paid}, workers(job_on, 1), {"ns/chat": chat(0, 0, sd_status)}, deployments(0, 0))
    assert status_patch(after, "chat")["borrowedFrom"] == []
    assert events(after, "ReturnedGPUs") == ["returned 6 GPUs to tj/a"]


@pytest.mark.parametrize("budget,expected", [(12, (2, 4)), (6, (1, 2)), (8, (1, 3)), (4, (1, 1)), (0, (0, 0))])
def test_fit_keeps_the_ratio_as_close_as_the_budget_allows(budget, expected):
    want = serving.Target({"prefill": 2, "decode": 4}, {"prefill": 2, "decode": 2}, "plan")
    got = serving.fit(want, budget)
    assert (got.replicas["prefill"], got.replicas["decode"]) == expected and got.gpus <= budget


def test_without_a_pool_policy_serving_only_keeps_what_it_holds():
    full = {"n0": 8, "n1": 8}
    actions = reconcile(NOW, policies.get("elastic-deadline"), {"ns/a": job(running(full))}, NODES, workers(full),
                        {"ns/chat": chat(1, 2)}, {})
    assert not any(isinstance(a, PatchAnnotations) for a in actions)
    assert replicas(actions) == {"chat-prefill": 1, "chat-decode": 2}  # Pending pods: the GPUs are the job's
    assert "pool" not in status_patch(actions, "chat")


def test_a_peak_seen_within_the_forecast_window_is_counted_by_admission():
    def newcomer():
        body = job(min_gpus=1, deadline_seconds=3600)
        body["spec"]["totalSteps"] = 20_000  # needs 8 GPUs (5.7 steps/s) for its deadline
        return body

    def after_peak(at: float):
        return {"lastPlan": {"time": rfc3339(T0), "reason": "fixed"}, "prefillReplicas": 1, "decodeReplicas": 0,
                "ratio": "1:0", "gpus": 2, "pool": {"peakGPUs": 12, "peakAt": rfc3339(at), "grantedGPUs": 2}}

    pods = serving_pods("prefill", ["n1"])
    recent = arbitrate(NOW, POLICY, {"ns/a": newcomer()}, NODES, pods, {"ns/chat": chat(1, 0, after_peak(NOW - 600))})
    assert recent.jobs["ns/a"].verdict.value == "Rejected"  # 16 - 12 forecast leaves 4 GPUs to guarantees
    assert recent.serving["ns/chat"].peak == (12, NOW - 600) and recent.serving["ns/chat"].gpus == 2
    old = arbitrate(NOW, POLICY, {"ns/a": newcomer()}, NODES, pods, {"ns/chat": chat(1, 0, after_peak(NOW - 3600))})
    assert old.jobs["ns/a"].verdict.value == "Admitted" and old.jobs["ns/a"].gpus >= 8
    assert old.serving["ns/chat"].peak == (2, NOW)  # the window has passed: the peak is the demand now


def test_serving_grows_only_once_the_shrunk_jobs_new_workers_are_bound():
    # The job shrank from 16 to 10 GPUs for chat: its old workers are gone, its new ones are created, pinned, not yet
    # bound. 6 GPUs are free by the records, but 16 are free to kube-scheduler, which could give a GPU recorded for a
    # worker to a chat pod and leave the worker Pending: chat waits for the next pass.
    placed = {"n0": 8, "n1": 2}
    body = job(running(placed, 1, lentTo=[{"serving": "ns/chat", "gpus": 6}]))
    pinned = {}
    rank = 0
    for n, g in sorted(placed.items()):
        for _ in range(g):
            w = pod(wname("a", 1, rank), "a", 1, node_name=None, phase="Pending")
            w["spec"]["nodeSelector"] = {"kubernetes.io/hostname": n}
            pinned[f"ns/{w['metadata']['name']}"] = w
            rank += 1
    plan = arbitrate(NOW, POLICY, {"ns/a": body}, NODES, pinned, {"ns/chat": chat(1, 2)})
    assert plan.serving["ns/chat"].gpus == 6 and plan.serving["ns/chat"].budget == 0
    # Bound: the 6 GPUs left are the only free ones, chat grows into them.
    plan = arbitrate(NOW, POLICY, {"ns/a": body}, NODES, workers(placed, 1), {"ns/chat": chat(1, 2)})
    assert plan.serving["ns/chat"].budget == 6


def test_serving_may_only_grow_into_gpus_no_pod_holds():
    # chat holds 2 GPUs on n1; the job holds the other 14: the plan wants 6, nothing is free yet.
    job_on = {"n0": 8, "n1": 6}
    pods = {**workers(job_on), **serving_pods("prefill", ["n1"])}
    plan = arbitrate(NOW, POLICY, {"ns/a": job(running(job_on))}, NODES, pods, {"ns/chat": chat(1, 2)})
    assert plan.serving["ns/chat"].gpus == 6 and plan.serving["ns/chat"].budget == 2
    # One old worker on n1 is gone: 1 GPU free, not a whole 2-GPU instance.
    del pods["ns/" + wname("a", 0, 13)]
    job_on = {"n0": 8, "n1": 5}
    plan = arbitrate(NOW, POLICY, {"ns/a": job(running(job_on))}, NODES, pods, {"ns/chat": chat(1, 2)})
    assert plan.serving["ns/chat"].budget == 2


def test_a_job_whose_gpus_a_serving_pod_took_before_its_workers_started_is_placed_afresh():
    # The job was placed on n1 (recorded, pods created) but the scheduler bound chat's pods there first.
    placed = {"n1": 8}
    body = job(running(placed), min_gpus=1)
    body["spec"]["elasticity"]["maxGPUs"] = 8
    body["status"]["phase"] = "Admitted"
    pending = {k: {**p, "spec": {**p["spec"], "nodeName": None,
                                "nodeSelector": {"kubernetes.io/hostname": "n1"}}, "status": {"phase": "Pending"}}
               for k, p in workers(placed).items()}
    pods = {**pending, **serving_pods("prefill", ["n1"]), **serving_pods("decode", ["n1"])}
    for policy in (POLICY, None):
        actions = reconcile(NOW, policies.get("elastic-deadline"), {"ns/a": body}, NODES, pods,
                            {"ns/chat": chat(1, 1)}, deployments(1, 1), pool=policy)
        moved = status_patch(actions, "a")
        assert moved["placement"] == [{"node": "n0", "gpus": 8}] and moved["reshards"] == 1
        assert sum(isinstance(a, DeletePod) for a in actions) == 8 and not any(
            isinstance(a, PatchAnnotations) for a in actions)  # nothing ran: no checkpoint
    # Bound workers (it started) are never moved this way.
    bound = {**workers(placed), **serving_pods("prefill", ["n1"])}
    actions = run({"ns/a": job(running(placed), min_gpus=1)}, bound, {"ns/chat": chat(1, 1)}, deployments(1, 1))
    assert "placement" not in status_patch(actions, "a")


@pytest.mark.parametrize("owner_uid", ["uid-a-deleted", None], ids=["still-owned-by-the-old-uid", "orphaned"])
def test_gpus_still_held_by_a_gone_jobs_workers_are_not_given_to_anyone(owner_uid):
    # An earlier job "a" was deleted (its namespace is going, or --cascade=orphan); its worker pods, labelled
    # for "a", still hold n0. The new job "a" (another UID) does not count them as its own: they are foreign.
    leftovers = workers({"n0": 8}, owner_uid=owner_uid)
    newcomer = job(min_gpus=1)
    newcomer["spec"]["elasticity"]["maxGPUs"] = 8
    for policy in (POLICY, None):
        actions = reconcile(NOW, policies.get("elastic-deadline"), {"ns/a": newcomer}, NODES, leftovers,
                            {"ns/chat": chat(0, 0)}, deployments(0, 0), pool=policy)
        assert status_patch(actions, "a")["placement"] == [{"node": "n1", "gpus": 8}]
        assert not any(isinstance(a, DeletePod) for a in actions)


def test_a_job_with_one_worker_running_and_one_blocked_moves_without_a_checkpoint():
    # Two 4-GPU workers placed on n0 and n1; n0's is Running, chat's pods took n1 before the other was bound.
    placed = {"n0": 4, "n1": 4}
    body = job(running(placed), min_gpus=8)
    body["spec"]["elasticity"].update(maxGPUs=8, gpusPerWorker=4)
    body["status"]["phase"] = "Admitted"
    w0 = pod(wname("a", 0, 0), "a", 0, node_name="n0", gpus=4)
    w1 = pod(wname("a", 0, 1), "a", 0, node_name=None, gpus=4, phase="Pending")
    w1["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "n1"}
    pods = {"ns/" + wname("a", 0, 0): w0, "ns/" + wname("a", 0, 1): w1, **serving_pods("prefill", ["n1", "n1"]),
            **serving_pods("decode", ["n1", "n1"])}
    actions = reconcile(NOW, policies.get("fifo-gang"), {"ns/a": body}, NODES, pods, {"ns/chat": chat(2, 2)},
                        deployments(2, 2))
    moved = status_patch(actions, "a")
    assert moved["reshards"] == 1 and sum(p["gpus"] for p in moved["placement"]) == 8
    assert "n1" not in {p["node"] for p in moved["placement"]}
    assert not any(isinstance(a, PatchAnnotations) for a in actions)  # no checkpoint request
