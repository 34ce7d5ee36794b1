"""What the operator gives a PyTorch worker set: a rendezvous (rank 0's DNS name under the job's headless Service),
checkpoint storage from spec.checkpoint.uri, the checkpoint interval; and the restore cost the workers measure,
recorded and used by the allocator."""

from __future__ import annotations

import json

from flotilla.operator.actions import ApplyObject, CreatePod, PatchStatus
from flotilla.operator.training import (
    checkpoint_storage,
    job_state,
    plan_job,
    rendezvous_service,
    rendezvous_service_name,
    worker_pods,
)
from flotilla.reshard import encoding as checkpoint
from tests.operator_plan.builders import T0, pod, trainingjob, wname


def _env(manifest):
    return {e["name"]: e["value"] for e in manifest["spec"]["containers"][0]["env"] if "value" in e}


def test_every_worker_gets_rank_0s_dns_name_of_its_own_generation_and_the_checkpoint_settings():
    body = trainingjob("llm", per_worker=2)
    body["spec"]["checkpoint"] = {"intervalSteps": 250, "uri": "pvc://ckpts/teams/a/llm"}
    pods = worker_pods(body, {"n0": 4, "n1": 2}, generation=3)
    service = rendezvous_service_name("llm", "uid-llm")
    rank0 = wname("llm", 3, 0)
    assert [_env(p)["FLOTILLA_RANK"] for p in pods] == ["0", "1", "2"]
    for p in pods:
        env = _env(p)
        assert env["FLOTILLA_RENDEZVOUS_ADDR"] == env["MASTER_ADDR"] == f"{rank0}.{service}.ns.svc"
        assert env["FLOTILLA_RENDEZVOUS_PORT"] == env["MASTER_PORT"] == "29500"
        assert env["FLOTILLA_GPUS_PER_WORKER"] == "2" and env["FLOTILLA_WORLD_SIZE"] == "3"
        assert env["FLOTILLA_CHECKPOINT_INTERVAL_STEPS"] == "250"
        assert env["FLOTILLA_CHECKPOINT_URI"] == "pvc://ckpts/teams/a/llm"
        assert env["FLOTILLA_CHECKPOINT_DIR"] == "/flotilla/checkpoint"
        assert p["spec"]["subdomain"] == service  # the pod's DNS name is <pod>.<service>.<ns>.svc
        assert p["spec"]["volumes"] == [{"name": "flotilla-checkpoint", "persistentVolumeClaim": {"claimName": "ckpts"}}]
        assert p["spec"]["containers"][0]["volumeMounts"] == [
            {"name": "flotilla-checkpoint", "mountPath": "/flotilla/checkpoint", "subPath": "teams/a/llm"}]


def test_checkpoint_uris():
    assert checkpoint_storage({"checkpoint": {"uri": "file:///var/ckpt/j"}}) == (
        "/var/ckpt/j", {"name": "flotilla-checkpoint", "hostPath": {"path": "/var/ckpt/j", "type": "DirectoryOrCreate"}},
        {"name": "flotilla-checkpoint", "mountPath": "/var/ckpt/j"})
    assert checkpoint_storage({"checkpoint": {"uri": "pvc://claim"}})[2] == {
        "name": "flotilla-checkpoint", "mountPath": "/flotilla/checkpoint"}
    assert checkpoint_storage({"checkpoint": {"uri": "s3://bucket/job"}}) == (None, None, None)
    assert checkpoint_storage({}) == (None, None, None)
    env = _env(worker_pods(trainingjob(), {"n0": 1}, 0)[0])
    assert not {"FLOTILLA_CHECKPOINT_DIR", "FLOTILLA_CHECKPOINT_URI", "FLOTILLA_CHECKPOINT_INTERVAL_STEPS"} & set(env)


def test_the_headless_service_selects_the_jobs_workers_ready_or_not_and_is_owned_by_the_job():
    svc = rendezvous_service(trainingjob("llm"))
    assert svc["metadata"]["name"] == rendezvous_service_name("llm", "uid-llm")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {"flotilla.dev/job-uid": "uid-llm", "flotilla.dev/role": "worker"}
    assert svc["metadata"]["ownerReferences"][0]["uid"] == "uid-llm"
    # A DNS-1035 label: a job named with a leading digit, or a long one, still gets a valid name.
    for job in ("7b-finetune", "x" * 80):
        name = rendezvous_service_name(job, "u")
        assert name[0].isalpha() and len(name) <= 63 and not name.endswith("-")


def test_the_service_is_applied_with_the_pods_it_names_and_not_once_they_exist():
    admitted = {"phase": "Admitted", "placement": [{"node": "n0", "gpus": 2}], "gpus": 2, "workers": 2, "reshards": 0}
    body = trainingjob("j", status=admitted)
    acts = plan_job(body, [], None, T0 + 10, "elastic-deadline")
    assert sum(isinstance(a, CreatePod) for a in acts) == 2
    assert [a.manifest["metadata"]["name"] for a in acts if isinstance(a, ApplyObject)] == [
        rendezvous_service_name("j", "uid-j")]
    running = [pod(wname("j", 0, r), "j", 0) for r in range(2)]
    again = plan_job(body, running, None, T0 + 20, "elastic-deadline")
    assert not [a for a in again if isinstance(a, (CreatePod, ApplyObject))]


def test_the_measured_restore_cost_goes_into_status_and_replaces_the_declared_one():
    status = {"phase": "Running", "placement": [{"node": "n0", "gpus": 2}], "gpus": 2, "workers": 2, "reshards": 1,
              "checkpoint": {"step": 300, "generation": 1}, "startedAt": "2026-01-01T00:00:00Z"}
    body = trainingjob("j", status=status)
    body["spec"]["checkpoint"] = {"restoreSeconds": 30}
    assert job_state(body).restore_seconds == 30.0
    body["metadata"]["annotations"] = checkpoint.progress_annotation(310, 2.0, T0 + 60, 1, 300, restore_seconds=12.34)
    running = [pod(wname("j", 1, r), "j", 1) for r in range(2)]
    acts = plan_job(body, running, None, T0 + 61, "elastic-deadline")
    patch = next(a.status for a in acts if isinstance(a, PatchStatus))
    assert patch["checkpoint"]["restoreSeconds"] == 12.34
    assert "restoreSeconds" not in patch.get("progress", {})
    body["status"]["checkpoint"] = patch["checkpoint"]
    assert job_state(body).restore_seconds == 12.34
    assert json.loads(body["metadata"]["annotations"]["flotilla.dev/progress"])["restoreSeconds"] == 12.34


def test_a_worker_set_of_one_rendezvouses_on_the_loopback_without_a_service():
    admitted = {"phase": "Admitted", "placement": [{"node": "n0", "gpus": 1}], "gpus": 1, "workers": 1, "reshards": 0}
    acts = plan_job(trainingjob("j", status=admitted), [], None, T0 + 10, "elastic-deadline")
    [created] = [a.manifest for a in acts if isinstance(a, CreatePod)]
    assert not [a for a in acts if isinstance(a, ApplyObject)]  # no Service, no Endpoints churn for it
    env = _env(created)
    assert env["FLOTILLA_RENDEZVOUS_ADDR"] == env["MASTER_ADDR"] == "127.0.0.1" and env["FLOTILLA_WORLD_SIZE"] == "1"
    assert "subdomain" not in created["spec"]
