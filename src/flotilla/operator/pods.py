"""What the operator reads off a pod (pure): its GPUs, whether it holds them, whose it is."""

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


def worker_of(pod: Body) -> str | None:
    """The TrainingJob key a worker pod belongs to; None for any other pod."""
    labels = pod["metadata"].get("labels") or {}
    if labels.get(names.LABEL_ROLE) == names.ROLE_WORKER and names.LABEL_JOB in labels:
        return f"{pod['metadata']['namespace']}/{labels[names.LABEL_JOB]}"
    return None


def serving_key(pod: Body) -> str | None:
    labels = pod["metadata"].get("labels") or {}
    if labels.get(names.LABEL_ROLE) in (names.ROLE_PREFILL, names.ROLE_DECODE) and names.LABEL_SERVING in labels:
        return f"{pod['metadata']['namespace']}/{labels[names.LABEL_SERVING]}"
    return None
