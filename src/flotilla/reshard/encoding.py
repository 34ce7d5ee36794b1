"""The resharding protocol's annotations on a TrainingJob, encoded and parsed in one place (the operator, the
controller, the admin API and the workers all use these).

* `flotilla.dev/checkpoint-request` (operator, controller or admin):
  {"generation": int, "reason": str, "requestedBy": str, "restart": bool, "time": RFC 3339}
  `generation` is the checkpoint's number (`CheckpointStatus.requested`), not the worker set's.
* `flotilla.dev/checkpoint-ack` (rank 0, once the checkpoint is written):
  {"generation": int, "step": int, "time": RFC 3339}
* `flotilla.dev/progress` (rank 0, periodically):
  {"steps": int, "stepsPerSecond": float, "time": RFC 3339, "generation": int (the worker set's number),
   "checkpointStep": int (last periodic checkpoint, optional),
   "restoreSeconds": float (measured by a worker set restored from an acknowledged checkpoint, optional)}
"""

from __future__ import annotations

import json
import logging
from typing import Any, Mapping

from flotilla.resources import names
from flotilla.resources.parse import rfc3339

log = logging.getLogger(__name__)

REQUEST = names.ANNOTATION_CHECKPOINT_REQUEST
ACK = names.ANNOTATION_CHECKPOINT_ACK
PROGRESS = names.ANNOTATION_PROGRESS


def dump(value: Mapping[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))


def next_request_generation(*seen: int) -> int:
    """The number of a new checkpoint request: one past every checkpoint number already requested or written."""
    return max(seen, default=0) + 1


def request_value(generation: int, reason: str, now: float, requested_by: str = "operator",
                  restart: bool = False) -> dict[str, Any]:
    """The checkpoint request as JSON: what the annotation holds (and the controller records)."""
    return {"generation": generation, "reason": reason, "requestedBy": requested_by, "restart": restart,
            "time": rfc3339(now)}


def request_annotation(generation: int, reason: str, now: float, requested_by: str = "operator",
                       restart: bool = False) -> dict[str, str]:
    return {REQUEST: dump(request_value(generation, reason, now, requested_by, restart))}


def ack_annotation(generation: int, step: int, now: float) -> dict[str, str]:
    return {ACK: dump({"generation": generation, "step": step, "time": rfc3339(now)})}


def progress_annotation(steps: int, steps_per_second: float, now: float, generation: int,
                        checkpoint_step: int | None = None, restore_seconds: float | None = None) -> dict[str, str]:
    value: dict[str, Any] = {"steps": steps, "stepsPerSecond": round(steps_per_second, 4), "time": rfc3339(now),
                             "generation": generation}
    if checkpoint_step is not None:
        value["checkpointStep"] = checkpoint_step
    if restore_seconds is not None:
        value["restoreSeconds"] = round(restore_seconds, 2)
    return {PROGRESS: dump(value)}


def _parse(annotations: Mapping[str, str] | None, key: str) -> dict[str, Any] | None:
    raw = (annotations or {}).get(key)
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        log.warning("ignoring malformed %s annotation: %.80s", key, raw)
        return None
    return value if isinstance(value, dict) else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_request(annotations: Mapping[str, str] | None) -> dict[str, Any] | None:
    """The checkpoint request; None when absent or malformed (logged), so that a bad one blocks nothing."""
    req = _parse(annotations, REQUEST)
    return req if req and _is_int(req.get("generation")) else None


def strict_request(annotations: Mapping[str, str] | None) -> dict[str, Any] | None:
    """The checkpoint request; None when absent; ValueError naming the annotation when malformed."""
    raw = (annotations or {}).get(REQUEST)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        raise ValueError(f"metadata.annotations[{REQUEST!r}] must be a JSON object") from None
    if not isinstance(value, dict) or not _is_int(value.get("generation")):
        raise ValueError(f"metadata.annotations[{REQUEST!r}] must be a JSON object with an integer 'generation'")
    return value


def parse_ack(annotations: Mapping[str, str] | None) -> dict[str, Any] | None:
    ack = _parse(annotations, ACK)
    return ack if ack and _is_int(ack.get("generation")) and _is_int(ack.get("step")) else None


def parse_progress(annotations: Mapping[str, str] | None) -> dict[str, Any] | None:
    p = _parse(annotations, PROGRESS)
    try:
        return p if p and int(p["steps"]) >= 0 else None
    except (KeyError, TypeError, ValueError):
        return None
