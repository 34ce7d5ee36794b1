"""The resharding protocol's annotations on a TrainingJob, encoded and parsed in one place.

* `flotilla.dev/checkpoint-request` (operator, controller or admin):
  {"generation": int, "reason": str, "requestedBy": str, "restart": bool, "time": RFC 3339}
* `flotilla.dev/checkpoint-ack` (rank 0, once the checkpoint is written):
  {"generation": int, "step": int, "time": RFC 3339}
* `flotilla.dev/progress` (rank 0, periodically):
  {"steps": int, "stepsPerSecond": float, "time": RFC 3339, "generation": int (worker set),
   "checkpointStep": int (last periodic checkpoint, optional),
   "restoreSeconds": float (measured by a worker set restored from an acknowledged checkpoint, optional)}
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import Any, Mapping

from flotilla.resources import names

log = logging.getLogger(__name__)


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _dump(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))


def request_annotation(generation: int, reason: str, now: float, requested_by: str = "operator",
                       restart: bool = False) -> dict[str, str]:
    return {names.ANNOTATION_CHECKPOINT_REQUEST: _dump(
        {"generation": generation, "reason": reason, "requestedBy": requested_by, "restart": restart,
         "time": rfc3339(now)})}


def ack_annotation(generation: int, step: int, now: float) -> dict[str, str]:
    return {names.ANNOTATION_CHECKPOINT_ACK: _dump({"generation": generation, "step": step, "time": rfc3339(now)})}


def progress_annotation(steps: int, steps_per_second: float, now: float, generation: int,
                        checkpoint_step: int | None = None, restore_seconds: float | None = None) -> dict[str, str]:
    value: dict[str, Any] = {"steps": steps, "stepsPerSecond": round(steps_per_second, 4), "time": rfc3339(now),
                             "generation": generation}
    if checkpoint_step is not None:
        value["checkpointStep"] = checkpoint_step
    if restore_seconds is not None:
        value["restoreSeconds"] = round(restore_seconds, 2)
    return {names.ANNOTATION_PROGRESS: _dump(value)}


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


def parse_request(annotations: Mapping[str, str] | None) -> dict[str, Any] | None:
    req = _parse(annotations, names.ANNOTATION_CHECKPOINT_REQUEST)
    return req if req and isinstance(req.get("generation"), int) else None


def parse_ack(annotations: Mapping[str, str] | None) -> dict[str, Any] | None:
    ack = _parse(annotations, names.ANNOTATION_CHECKPOINT_ACK)
    return ack if ack and isinstance(ack.get("generation"), int) and isinstance(ack.get("step"), int) else None


def parse_progress(annotations: Mapping[str, str] | None) -> dict[str, Any] | None:
    p = _parse(annotations, names.ANNOTATION_PROGRESS)
    try:
        return p if p and int(p["steps"]) >= 0 else None
    except (KeyError, TypeError, ValueError):
        return None
