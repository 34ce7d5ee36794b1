"""Builders for the objects the operator sees (as the API server returns them)."""

from __future__ import annotations

import copy
from typing import Any

CREATED = "2026-01-01T00:00:00Z"
T0 = 1767225600.0  # CREATED as Unix time


def trainingjob(name: str = "job", *, min_gpus: int = 2, max_gpus: int = 4, per_worker: int = 1,
                status: dict[str, Any] | None = None, annotations: dict[str, str] | None = None,
                deadline_seconds: int = 3600) -> dict[str, Any]:
    return {
        "apiVersion": "flotilla.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": 1,
                     "creationTimestamp": CREATED, "resourceVersion": "1", "annotations": annotations or {}},
        "spec": {
            "deadlineSeconds": deadline_seconds,
            "totalSteps": 1000,
            "elasticity": {"minGPUs": min_gpus, "maxGPUs": max_gpus, "gpusPerWorker": per_worker},
            "throughput": [{"gpus": 1, "stepsPerSecond": 1.0}, {"gpus": 4, "stepsPerSecond": 3.0}],
            "template": {"metadata": {"labels": {"team": "a"}},
                         "spec": {"containers": [{"name": "w", "image": "img"}]}},
        },
        "status": copy.deepcopy(status) if status else {},
    }


def node(name: str, gpus: int = 8, *, ready: bool = True, unschedulable: bool = False,
         taints: list[dict[str, str]] | None = None, rack: str = "r0") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                     "labels": {"flotilla.dev/rack": rack}},
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)},
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


_OWNER = object()


def pod(name: str, job: str, generation: int, phase: str = "Running", node_name: str = "n0",
        gpus: int = 1, role: str = "worker", owner_uid: Any = _OWNER) -> dict[str, Any]:
    """A pod labelled for `job`, controlled by the job of that name built by `trainingjob` (uid-<job>), another
    UID given as `owner_uid`, or none (`owner_uid=None`: an orphan)."""
    owner_uid = f"uid-{job}" if owner_uid is _OWNER else owner_uid
    owners = [{"apiVersion": "flotilla.dev/v1alpha1", "kind": "TrainingJob", "name": job, "uid": owner_uid,
               "controller": True, "blockOwnerDeletion": True}] if owner_uid and role == "worker" else []
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"pod-uid-{name}", "ownerReferences": owners,
                     "labels": {"flotilla.dev/job": job, "flotilla.dev/role": role,
                                "flotilla.dev/generation": str(generation)}},
        "spec": {"nodeName": node_name,
                 "containers": [{"name": "w", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
        "status": {"phase": phase},
    }


def wname(job: str, generation: int, rank: int) -> str:
    """The name the operator gives rank `rank` of `job`'s worker set `generation` (the job built by `trainingjob`)."""
    from flotilla.operator.training import pod_name

    return pod_name(job, f"uid-{job}", generation, rank)
