"""A worker writes only to its own TrainingJob: never to a newer job that took its job's name."""

import json

from flotilla.worker.client import JobClient, WorkerIdentity


class FakeJobs:
    """The TrainingJob as the API server holds it; a merge patch naming another uid is refused (uid is immutable)."""

    def __init__(self, uid, annotations=None):
        self.body = {"metadata": {"name": "reuse", "uid": uid, "annotations": dict(annotations or {})}}
        self.refused = 0

    def patch_namespaced_custom_object(self, group, version, namespace, plural, name, patch):
        uid = patch["metadata"].get("uid")
        if uid is not None and uid != self.body["metadata"]["uid"]:
            self.refused += 1
            raise RuntimeError("422 metadata.uid: field is immutable")
        self.body["metadata"]["annotations"].update(patch["metadata"]["annotations"])

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        return self.body


REQUEST = {"flotilla.dev/checkpoint-request": json.dumps({"generation": 1, "reason": "grow"})}


def test_the_job_uid_comes_from_the_pods_environment():
    env = {"FLOTILLA_JOB": "reuse", "FLOTILLA_NAMESPACE": "ns", "FLOTILLA_RANK": "0", "FLOTILLA_WORLD_SIZE": "2",
           "FLOTILLA_JOB_UID": "uid-1"}
    assert WorkerIdentity.from_env(env).job_uid == "uid-1"
    assert WorkerIdentity.from_env({**env, "FLOTILLA_JOB_UID": ""}).job_uid == ""


def test_an_orphaned_worker_neither_reads_nor_writes_the_new_job_of_its_jobs_name():
    api = FakeJobs("uid-new", REQUEST)
    orphan = JobClient(WorkerIdentity("reuse", "ns", 0, 2, 0, "uid-old"), api=api)
    assert orphan.pending_checkpoint(force=True) is None
    try:
        orphan.report_progress(5000, 2.0, force=True)
    except RuntimeError:
        pass
    assert api.refused == 1 and "flotilla.dev/progress" not in api.body["metadata"]["annotations"]


def test_the_jobs_own_worker_reads_and_writes_as_before():
    api = FakeJobs("uid-new", REQUEST)
    worker = JobClient(WorkerIdentity("reuse", "ns", 0, 2, 0, "uid-new"), api=api)
    request = worker.pending_checkpoint(force=True)
    assert request is not None and request.generation == 1
    worker.acknowledge(request, 42)
    assert json.loads(api.body["metadata"]["annotations"]["flotilla.dev/checkpoint-ack"])["step"] == 42
