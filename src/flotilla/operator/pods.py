"""What the operator reads off a pod (pure): its GPUs, whether it holds them, whose it is.

A pod belongs to the object its controlling ownerReference names by UID, as in Kubernetes' own controllers:
labels select, they do not own. A worker pod orphaned by `kubectl delete --cascade=orphan` (the garbage
collector strips the reference) or left by an earlier job of the same name belongs to no live job.
"""

from __future__ import annotations

from typing import Any, Mapping

from flotilla.resources import names

Body = Mapping[str, Any]


def pod_gpus(pod: Body) -> int:
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        total += int(str(((c.get("resources") or {}).get("limits") or {}).get(names.GPU_RESOURCE, "0")))
    return total


def holds_gpus(pod: Body) -> bool:
    """Bound and not finished: its GPUs are taken (a terminating pod's too, until it is gone)."""
    phase = (pod.get("status") or {}).get("phase")
    return bool((pod.get("spec") or {}).get("nodeName")) and phase not in ("Succeeded", "Failed")


def controller_ref(obj: Body) -> Mapping[str, Any] | None:
    """The object's controlling ownerReference (controller: true), if any."""
    return next((ref for ref in obj["metadata"].get("ownerReferences") or [] if ref.get("controller")), None)


def worker_job_uid(pod: Body) -> str | None:
    """The UID of the TrainingJob that controls a worker pod; None for any other pod and for an orphan."""
    if (pod["metadata"].get("labels") or {}).get(names.LABEL_ROLE) != names.ROLE_WORKER:
        return None
    ref = controller_ref(pod)
    return ref.get("uid") if ref is not None and ref.get("kind") == "TrainingJob" else None


def serving_key(pod: Body) -> str | None:
    labels = pod["metadata"].get("labels") or {}
    if labels.get(names.LABEL_ROLE) in (names.ROLE_PREFILL, names.ROLE_DECODE) and names.LABEL_SERVING in labels:
        return f"{pod['metadata']['namespace']}/{labels[names.LABEL_SERVING]}"
    return None


def gpu_indices(pod: Body) -> tuple[int, ...]:
    """The node's GPU indices the operator gave the pod (names.ANNOTATION_GPU_INDICES); () when it gave none or
    the annotation is not a comma-separated list of indices."""
    return gpu_indices_in(pod["metadata"].get("annotations") or {})


def gpu_indices_in(annotations: Mapping[str, Any]) -> tuple[int, ...]:
    """`gpu_indices` from a pod's annotations alone (for callers that hold a client object, not a dict)."""
    raw = str(annotations.get(names.ANNOTATION_GPU_INDICES) or "")
    parts = [p.strip() for p in raw.split(",") if p.strip()]
    return tuple(int(p) for p in parts) if parts and all(p.isdigit() for p in parts) else ()
