"""The typed parse of the resources the operator and the controller share."""

import pytest

from flotilla.resources import node, serving_deployment, training_job
from tests.operator_plan.builders import T0, trainingjob
from tests.operator_plan.builders import node as node_body


def test_a_training_job_reads_spec_and_status():
    body = trainingjob("j", min_gpus=2, max_gpus=4, per_worker=2, status={
        "phase": "Running", "placement": [{"node": "a", "gpus": 2}, {"node": "b", "gpus": 0}],
        "checkpoint": {"step": 40, "restoreSeconds": 12.5}, "lentTo": [{"serving": "ns/sd", "gpus": 2}]})
    job = training_job.parse(body)
    assert (job.key, job.uid, job.created, job.deadline) == ("ns/j", "uid-j", T0, T0 + 3600)
    assert (job.min_gpus, job.max_gpus, job.gpus_per_worker, job.total_steps) == (2, 4, 2, 1000)
    assert job.throughput == ((1, 1.0), (4, 3.0))
    assert job.placement == {"a": 2, "b": 0} and job.gpus == 2
    assert (job.phase, job.checkpoint_step, job.restore_seconds) == ("Running", 40, 12.5)
    assert job.lent_to == {"ns/sd": 2}


def test_a_new_training_job_has_defaults():
    job = training_job.parse(trainingjob("j"))
    assert (job.phase, job.placement, job.gpus, job.reshards, job.deadline_met) == (None, {}, 0, 0, None)
    assert job.restore_seconds == training_job.DEFAULT_RESTORE_SECONDS
    assert job.pipeline_stages is None and not job.best_effort


@pytest.mark.parametrize("path, value, field", [
    ("spec.elasticity.minGPUs", "2", "spec.elasticity.minGPUs"),
    ("spec.throughput", {"gpus": 1}, "spec.throughput"),
    ("status.placement", {"a": 1}, "status.placement"),
    ("spec.deadlineSeconds", 1.5, "spec.deadlineSeconds"),
    ("status.checkpoint.restoreSeconds", "soon", "status.checkpoint.restoreSeconds"),
])
def test_a_malformed_training_job_names_the_field(path, value, field):
    body = trainingjob("j", status={"checkpoint": {}})
    *parents, leaf = path.split(".")
    target = body
    for p in parents:
        target = target[p]
    target[leaf] = value
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        training_job.parse(body)


def test_a_node_reads_gpus_readiness_and_health_marks():
    body = node_body("n", 8, taints=[{"key": "flotilla.dev/unhealthy", "effect": "NoSchedule", "value": "xid"}])
    body["status"]["capacity"] = {"nvidia.com/gpu": "8"}
    body["status"]["conditions"].append({"type": "FlotillaGPUHealthy", "status": "False", "reason": "Xid"})
    n = node.parse(body)
    assert (n.capacity_gpus, n.allocatable_gpus, n.ready, n.healthy, n.schedulable) == (8, 8, True, False, False)
    assert n.unhealthy_taint is not None and n.unhealthy_taint["value"] == "xid"
    bare = node.parse({"metadata": {"name": "cpu"}, "status": {}})
    assert (bare.capacity_gpus, bare.allocatable_gpus, bare.schedulable) == (0, None, False)
    with pytest.raises(ValueError, match="status.allocatable"):
        node.parse({"metadata": {"name": "x"}, "status": {"allocatable": {"nvidia.com/gpu": "many"}}})


def test_a_serving_deployment_reads_the_pool_record():
    body = {"metadata": {"name": "sd", "namespace": "ns", "uid": "u"},
            "spec": {"maxGPUs": 8, "prefill": {"gpusPerInstance": 2}, "slo": {"ttftMs": 400, "tpotMs": 50}},
            "status": {"pool": {"grantedGPUs": 4, "peakGPUs": 6, "peakAt": "2026-01-01T00:00:00Z"},
                       "borrowedFrom": [{"job": "ns/j", "gpus": 2}]}}
    sd = serving_deployment.parse(body)
    assert (sd.key, sd.planner_mode, sd.max_gpus, sd.min_gpus) == ("ns/sd", "auto", 8, 0)
    assert (sd.prefill_gpus_per_instance, sd.decode_gpus_per_instance) == (2, None)
    assert sd.pool == serving_deployment.PoolRecord(4, 6, T0, None)
    assert sd.borrowed_from == {"ns/j": 2} and sd.slo == {"ttftMs": 400.0, "tpotMs": 50.0}
    with pytest.raises(ValueError, match=r"status\.pool\.peakAt"):
        serving_deployment.parse({**body, "status": {"pool": {"peakAt": "yesterday"}}})
