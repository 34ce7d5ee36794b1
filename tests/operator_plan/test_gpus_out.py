"""One sick GPU costs one GPU, on the operator's side: the node's out-of-service GPUs are not placed, the job
whose pod sits on one is placed afresh (only it moves), and every worker pod gets the node's GPU indices it
holds, never one out of service or held by another pod."""

import json

from flotilla.allocation.elastic import DeadlineElastic
from flotilla.operator import devices, training
from flotilla.operator.actions import CreatePod
from flotilla.operator.reconcile import Planner, training_snapshot
from flotilla.resources import node as k8s_node
from tests.operator_plan.builders import T0, node, pod, trainingjob, wname

NOW = T0 + 60


def sick(name: str, out: dict[int, str], gpus: int = 8) -> dict:
    n = node(name, gpus)
    n["metadata"]["annotations"]["flotilla.dev/unhealthy-gpus"] = json.dumps({str(g): w for g, w in out.items()})
    return n


def on(p: dict, *indices: int) -> dict:
    p["metadata"].setdefault("annotations", {})["flotilla.dev/gpu-indices"] = ",".join(map(str, indices))
    return p


def running(name: str, node_name: str, gpus: int) -> dict:
    return trainingjob(name, min_gpus=gpus, max_gpus=gpus, status={
        "phase": "Running", "placement": [{"node": node_name, "gpus": gpus}], "workerGeneration": 0,
        "startedAt": "2026-01-01T00:00:10Z",
        "progress": {"steps": 100, "stepsPerSecond": 1.0, "updatedAt": "2026-01-01T00:00:50Z"}})


def test_a_node_annotation_takes_its_gpus_out_of_placement():
    snap = training_snapshot(NOW, {}, {"n0": sick("n0", {3: "xid-79"}), "n1": node("n1")}, {})
    assert {n.name: n.usable_gpus for n in snap.nodes} == {"n0": 7, "n1": 8}


def test_a_malformed_annotation_names_the_field_and_blocks_only_its_node():
    bad = node("n0")
    bad["metadata"]["annotations"]["flotilla.dev/unhealthy-gpus"] = "3"
    parsed = k8s_node.parse(bad)
    assert not parsed.schedulable and "flotilla.dev/unhealthy-gpus" in (parsed.gpus_out_error or "")
    snap = training_snapshot(NOW, {}, {"n0": bad, "n1": node("n1")}, {})
    assert {n.name: n.usable_gpus for n in snap.nodes} == {"n0": 0, "n1": 8}


def test_only_the_job_on_the_sick_gpu_is_placed_afresh():
    jobs = {"ns/a": running("a", "n0", 4), "ns/b": running("b", "n0", 2), "ns/c": running("c", "n0", 2)}
    pods = {}
    for job, first, count in (("a", 0, 4), ("b", 4, 2), ("c", 6, 2)):
        for r in range(count):
            pods[f"ns/{wname(job, 0, r)}"] = on(pod(wname(job, 0, r), job, 0, node_name="n0"), first + r)
    nodes = {"n0": sick("n0", {7: "xid-79"}), "n1": node("n1")}
    snap = training_snapshot(NOW, jobs, nodes, pods)
    assert {j.key: dict(j.placement) for j in snap.jobs} == {"ns/a": {"n0": 4}, "ns/b": {"n0": 2}, "ns/c": {}}
    decided = DeadlineElastic().decide(snap).jobs
    assert decided["ns/a"].placement == {"n0": 4} and decided["ns/b"].placement == {"n0": 2}
    assert decided["ns/c"].placement == {"n1": 2}           # 7 in service on n0, 6 held: c goes to n1
    # an old worker set of c still on GPU 7 (terminating) moves nothing once c runs a newer set
    c = running("c", "n1", 2)
    c["status"]["workerGeneration"] = 1
    assert devices.on_gpus_out([c], nodes.values(), pods.values()) == set()


def test_worker_pods_get_the_lowest_free_in_service_indices():
    nodes = {"n0": sick("n0", {1: "xid-79"})}
    held = {"ns/x": on(pod("x", "other", 0, node_name="n0", gpus=2), 0, 2)}
    body = trainingjob("j", min_gpus=3, max_gpus=3, status={"phase": "Admitted",
                                                           "placement": [{"node": "n0", "gpus": 3}]})
    creates = [CreatePod(p) for p in training.worker_pods(body, {"n0": 3}, 0)]
    claims = devices.Claims()
    [(_, _, out)] = devices.assign([("jobs", "ns/j", creates)], held, nodes, claims, NOW)
    got = [p.manifest["metadata"]["annotations"]["flotilla.dev/gpu-indices"] for p in out]
    assert got == ["3", "4", "5"]
    env = {e["name"]: e["value"] for e in out[0].manifest["spec"]["containers"][0]["env"] if "value" in e}
    assert env["FLOTILLA_GPU_INDICES"] == "3"
    # a later pass, before the watch shows those pods, gives them the same and no one else theirs
    again = [CreatePod(p) for p in training.worker_pods(trainingjob("k", min_gpus=1, max_gpus=1), {"n0": 1}, 0)]
    [(_, _, later)] = devices.assign([("jobs", "ns/k", again)], held, nodes, claims, NOW + 1)
    assert later[0].manifest["metadata"]["annotations"]["flotilla.dev/gpu-indices"] == "6"


def test_the_planner_gives_created_pods_their_indices():
    jobs = {"ns/j": trainingjob("j", min_gpus=2, max_gpus=2)}
    planner = Planner()
    out = planner.plan(NOW, DeadlineElastic(), jobs, {"n0": sick("n0", {0: "ecc"})}, {}, {}, {})
    created = [a for _, _, actions in out for a in actions if isinstance(a, CreatePod)]
    assert created and all(a.manifest["metadata"]["annotations"]["flotilla.dev/gpu-indices"] != "0"
                           for a in created)
    assert sorted(a.manifest["metadata"]["annotations"]["flotilla.dev/gpu-indices"] for a in created) == ["1", "2"]
