"""The simulated workers (KWOK clusters) play the job whose UID owns the pods, never one by name alone."""

import json
from types import SimpleNamespace

from kubernetes import client

from flotilla.worker.simulated import SimulatedWorkers


def job(uid, phase="Running"):
    return {"metadata": {"name": "reuse", "namespace": "ns", "uid": uid, "annotations": {}},
            "spec": {"totalSteps": 1000, "throughput": [{"gpus": 1, "stepsPerSecond": 10.0}]},
            "status": {"phase": phase, "placement": [{"node": "n0", "gpus": 1}], "workers": 1, "gpus": 1,
                       "reshards": 0}}


def worker(name, owner_uid):
    owners = [client.V1OwnerReference(api_version="flotilla.dev/v1alpha1", kind="TrainingJob", name="reuse",
                                      uid=owner_uid, controller=True)] if owner_uid else None
    return client.V1Pod(metadata=client.V1ObjectMeta(name=name, namespace="ns", owner_references=owners, labels={
        "flotilla.dev/job": "reuse", "flotilla.dev/role": "worker", "flotilla.dev/generation": "0"}),
        status=client.V1PodStatus(phase="Running"))


class FakeApi:
    def __init__(self, jobs, pods):
        self.jobs, self.pods, self.patches = jobs, pods, []

    def list_namespaced_custom_object(self, *args):
        return {"items": self.jobs}

    def get_namespaced_custom_object(self, group, version, ns, plural, name):
        return next(j for j in self.jobs if j["metadata"]["name"] == name)

    def patch_namespaced_custom_object(self, group, version, ns, plural, name, patch):
        self.patches.append(patch)

    def patch_namespaced_pod(self, name, ns, patch):
        self.exits = [*getattr(self, "exits", []), name]

    def list_namespaced_pod(self, ns, label_selector):
        return SimpleNamespace(items=self.pods)


def test_a_new_job_of_an_old_name_is_played_from_step_zero_with_its_own_pods_only():
    old = FakeApi([job("uid-old")], [worker("reuse-g0-w0", "uid-old")])
    sim = SimulatedWorkers(client.ApiClient(), namespace="ns")
    sim.custom = sim.core = old
    sim.step(now=0.0)
    sim.step(now=100.0)  # 1000 steps at 10/s: done, the workers exit
    assert sim.runs["uid-old"].finished and old.exits == ["reuse-g0-w0"]

    # Deleted with --cascade=orphan; a new "reuse" runs on its own pods, the orphan beside them.
    new = FakeApi([job("uid-new")], [worker("reuse-g0-w0", None), worker("reuse-abcde-g0-w0", "uid-new")])
    sim.custom = sim.core = new
    sim.step(now=200.0)
    sim.step(now=210.0)
    progress = json.loads(new.patches[-1]["metadata"]["annotations"]["flotilla.dev/progress"])
    assert progress["steps"] == 100 and new.patches[-1]["metadata"]["uid"] == "uid-new"
    assert not sim.runs["uid-new"].finished and "uid-old" not in sim.runs

    # Only an orphan left: nothing of the new job runs.
    lone = FakeApi([job("uid-new")], [worker("reuse-g0-w0", None)])
    sim.custom = sim.core = lone
    sim.step(now=220.0)
    assert lone.patches == []
