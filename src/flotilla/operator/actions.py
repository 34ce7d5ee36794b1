"""What the operator does to the cluster, as data. Planning returns these; `kube` applies them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class PatchStatus:
    plural: str  # trainingjobs | servingdeployments
    namespace: str
    name: str
    status: dict[str, Any]  # merge-patched into .status


@dataclass(frozen=True)
class PatchAnnotations:
    plural: str
    namespace: str
    name: str
    annotations: dict[str, str]  # merge-patched into .metadata.annotations


@dataclass(frozen=True)
class CreatePod:
    manifest: dict[str, Any]


@dataclass(frozen=True)
class DeletePod:
    namespace: str
    name: str
    uid: str | None = None  # the pod planning saw: a precondition, so that no other pod of that name goes


@dataclass(frozen=True)
class ApplyDeployment:
    manifest: dict[str, Any]  # server-side applied: created, or replicas/template brought back


@dataclass(frozen=True)
class ApplyObject:
    manifest: dict[str, Any]  # server-side applied: a training job's rendezvous Service, a serving pool's Service or InferencePool


@dataclass(frozen=True)
class PostEvent:
    involved: dict[str, Any]  # apiVersion, kind, namespace, name, uid
    type: str  # Normal | Warning
    reason: str
    message: str
    fields: dict[str, Any] = field(default_factory=dict)


Action = PatchStatus | PatchAnnotations | CreatePod | DeletePod | ApplyDeployment | ApplyObject | PostEvent


def involved(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    return {"apiVersion": body["apiVersion"], "kind": body["kind"], "namespace": meta.get("namespace"),
            "name": meta["name"], "uid": meta.get("uid")}


def object_key(manifest: Mapping[str, Any]) -> str:
    meta = manifest["metadata"]
    return f"{manifest['kind']}/{meta.get('namespace')}/{meta['name']}"


def pod_key(manifest: Mapping[str, Any]) -> str:
    meta = manifest["metadata"]
    return f"{meta['namespace']}/{meta['name']}"


@dataclass(frozen=True)
class Done:
    """What the operator's own writes already did that the objects a pass plans with may not show yet (a pod's
    watch event is late; Services and InferencePools are not watched): planning leaves it out of its actions."""

    pods: frozenset[str] = frozenset()  # namespace/name of pods created, their watch events not come yet
    applied: Mapping[str, str] = field(default_factory=dict)  # object_key -> the manifest (JSON) applied recently

    def outstanding(self, kind: str, actions: list[Action]) -> list[Action]:
        """`actions` less what is done; a job's rendezvous Service goes only with pod creations."""
        out = [a for a in actions if not (isinstance(a, CreatePod) and pod_key(a.manifest) in self.pods)]
        if kind == "jobs" and not any(isinstance(a, CreatePod) for a in out):
            out = [a for a in out if not isinstance(a, ApplyObject)]
        return [a for a in out if not (isinstance(a, ApplyObject) and self.applied.get(object_key(a.manifest))
                                       == json.dumps(a.manifest, sort_keys=True))]
