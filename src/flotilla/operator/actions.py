"""What the operator does to the cluster, as data. Planning returns these; `kube` applies them."""

from __future__ import annotations

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
