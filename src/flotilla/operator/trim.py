"""What the operator keeps of a watched object: the fields planning reads, nothing else. Pure.

At 15,000 jobs the watched objects are most of the operator's memory: a pod as the API
server sends it is ~5 KB, most of it managed fields and the spec planning never reads.
"""

from __future__ import annotations

from typing import Any, Mapping

from flotilla.resources import phases

Body = Mapping[str, Any]
_DROPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)
_KEPT_METADATA = ("name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
                  "deletionTimestamp", "labels", "annotations", "ownerReferences")


def metadata(meta: Body) -> dict[str, Any]:
    out = {k: meta[k] for k in _KEPT_METADATA if k in meta}
    if any(a in (meta.get("annotations") or {}) for a in _DROPPED_ANNOTATIONS):
        out["annotations"] = {k: v for k, v in meta["annotations"].items() if k not in _DROPPED_ANNOTATIONS}
    return out


def pod(body: Body) -> dict[str, Any]:
    """Labels, node (bound, or pinned by nodeSelector while pending), GPU limits, phase and start time: what
    placement and the pods' planning read."""
    spec, status = body.get("spec") or {}, body.get("status") or {}
    return {
        "metadata": metadata(body["metadata"]),
        "spec": {**({"nodeName": spec["nodeName"]} if spec.get("nodeName") else {}),
                 **({"nodeSelector": spec["nodeSelector"]} if spec.get("nodeSelector") else {}),
                 "containers": [{"resources": {"limits": (c.get("resources") or {}).get("limits") or {}}}
                                for c in spec.get("containers") or []]},
        "status": {k: status[k] for k in ("phase", "startTime") if status.get(k)},
    }


def trainingjob(body: Body) -> dict[str, Any]:
    """A finished job is only its identity and phase: planning skips it; the rest is the object's."""
    if (body.get("status") or {}).get("phase") in phases.TRAINING_FINAL:
        meta = body["metadata"]
        return {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
                "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta},
                "status": {"phase": body["status"]["phase"]}}
    return {**body, "metadata": metadata(body["metadata"])}


def other(body: Body) -> dict[str, Any]:
    return {**body, "metadata": metadata(body["metadata"])}


def node(body: Body) -> dict[str, Any]:
    """Labels and annotations, cordon and taints, allocatable, and each condition's type and status: a
    heartbeat (a condition's times, the images, the kubelet's addresses) changes nothing planning reads."""
    spec, status = body.get("spec") or {}, body.get("status") or {}
    return {
        "apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
        "metadata": metadata(body["metadata"]),
        "spec": {k: spec[k] for k in ("unschedulable", "taints") if k in spec},
        "status": {"allocatable": status.get("allocatable") or {},
                   "conditions": [{"type": c.get("type"), "status": c.get("status")}
                                  for c in status.get("conditions") or []]},
    }
