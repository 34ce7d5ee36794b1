"""Reclaims as the operator marks them on a TrainingJob or ServingDeployment (pure): a condition whose reason
says Reclaim, or a checkpoint request made for a reclaim. The mirror reads them into the job's record; the
store turns a job that then gives GPUs back into a `reclaim` decision (flotilla.controller.queues)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from flotilla.resources import names, parse

# A job is being reclaimed when a condition's reason (or its checkpoint request's reason) says so.
_RECLAIM = re.compile(r"reclaim", re.IGNORECASE)
# "... to queue team-b ..." / "... for queue team-b ..." in a reclaim message names the queue that gets the GPUs.
_TO_QUEUE = re.compile(r"(?:to|for|by) queue ['\"]?([a-z0-9](?:[-a-z0-9.]*[a-z0-9])?)", re.IGNORECASE)


@dataclass(frozen=True)
class ReclaimSign:
    """What a job's status says about a reclaim in progress: why, since when, and for which queue."""

    reason: str
    since: float | None
    to_queue: str | None
    signal: str = ""  # which request or condition said it: one reclaim is recorded once, however often it is seen


def reclaim_sign(obj: Mapping[str, Any]) -> ReclaimSign | None:
    """The reclaim the operator asked of a TrainingJob or ServingDeployment: its checkpoint request when made
    for a reclaim (the operator names the reclaim in the shrink's reason: "reclaim: gives 4 GPUs back to queue
    'team-b' through a checkpoint ..."), else the newest condition whose reason says Reclaim; None when none."""
    meta = parse.mapping(obj, "metadata", "")
    request = parse.annotation_request(meta, names.ANNOTATION_CHECKPOINT_REQUEST)
    reason = str((request or {}).get("reason") or "")
    if request and _RECLAIM.search(reason):
        return ReclaimSign(reason, _time(request.get("time")), _to_queue(reason),
                           f"checkpoint-request:{request.get('generation')}")
    status = parse.mapping(obj, "status", "")
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, Mapping)
                  and _RECLAIM.search(str(c.get("reason") or "")) and c.get("status", "True") == "True"]
    if conditions:
        c = max(conditions, key=lambda c: str(c.get("lastTransitionTime") or ""))
        message = str(c.get("message") or "")
        return ReclaimSign(f"{c.get('reason')}: {message}".strip(": "),
                           _time(c.get("lastTransitionTime")), _to_queue(message),
                           f"condition:{c.get('type')}:{c.get('lastTransitionTime')}")
    return None


def _time(value: Any) -> float | None:
    try:
        return parse.parse_time(value, "time")
    except ValueError:
        return None


def _to_queue(message: str) -> str | None:
    found = _TO_QUEUE.search(message)
    return found.group(1) if found else None
