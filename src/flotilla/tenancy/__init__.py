"""Teams share the cluster (pure): queues with nominal GPU shares, borrowing and lending, reclaim through
checkpoints, deadlines promised out of each queue's own share."""

from flotilla.tenancy.decision import decide
from flotilla.tenancy.model import (
    IMPLICIT_QUEUE,
    RESOURCE_GPU,
    QueueProblem,
    QueueSpec,
    Quota,
    queue_for,
    validate_queues,
)
from flotilla.tenancy.types import QueueUsage, Reclaim, TenantDecision

__all__ = ["IMPLICIT_QUEUE", "RESOURCE_GPU", "QueueProblem", "QueueSpec", "QueueUsage", "Quota", "Reclaim",
           "TenantDecision", "decide", "queue_for", "validate_queues"]
