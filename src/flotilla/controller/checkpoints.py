"""Asking a TrainingJob for a checkpoint: one way, for the API (admin) and the health responder (controller)."""

from __future__ import annotations

from typing import Any

from flotilla.controller.actions import ClusterActions
from flotilla.controller.metrics import ControllerMetrics
from flotilla.controller.mirror import DecisionRecord
from flotilla.controller.store import Store
from flotilla.reshard import encoding


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
    generation = encoding.next_request_generation(job.checkpoint_generation,
                                                     int((pending or {}).get("generation", 0)))
    req = encoding.request_value(generation, reason, store.clock(), requested_by, restart)
    actions.annotate("trainingjobs", job.namespace, job.name, encoding.REQUEST, encoding.dump(req))
    store.set_job_fields(key, checkpoint_request=req)
    decision = DecisionRecord("checkpoint-request", "TrainingJob", key, reason,
                              {"generation": generation, "restart": restart, "step": job.steps}, actor=actor)
    store.record([decision])
    metrics.decided([decision])
    return True, req
