"""Asking a TrainingJob for a checkpoint: one way, for the API (admin) and the health responder (controller)."""

from __future__ import annotations

import json
from typing import Any

from flotilla.controller import views
from flotilla.controller.actions import ClusterActions
from flotilla.controller.metrics import ControllerMetrics
from flotilla.controller.mirror import DecisionRecord
from flotilla.resources.names import ANNOTATION_CHECKPOINT_REQUEST as CHECKPOINT_REQUEST
from flotilla.controller.store import Store


def request(store: Store, actions: ClusterActions, metrics: ControllerMetrics, key: str, reason: str,
            restart: bool, actor: str, requested_by: str) -> tuple[bool, dict[str, Any]]:
    """-> (created, request). An unacknowledged request is returned instead of making another.
    Raises KeyError when the job is unknown."""
    found = store.job(key)
    if found is None:
        raise KeyError(key)
    job = found[0]
    pending = job.checkpoint_request
    if pending and int(pending.get("generation", 0)) > job.checkpoint_generation:
        return False, dict(pending)
    generation = max(job.checkpoint_generation, int((pending or {}).get("generation", 0))) + 1
    req = {"generation": generation, "reason": reason, "requestedBy": requested_by, "restart": restart,
           "time": views.iso(store.clock()) or ""}
    actions.annotate("trainingjobs", job.namespace, job.name, CHECKPOINT_REQUEST, json.dumps(req))
    store.set_job_fields(key, checkpoint_request=req)
    decision = DecisionRecord("checkpoint-request", "TrainingJob", key, reason,
                              {"generation": generation, "restart": restart, "step": job.steps}, actor=actor)
    store.record([decision])
    metrics.decided([decision])
    return True, req
