"""Teams share the cluster (pure): queues with nominal GPU shares, borrowing and lending, reclaim through
checkpoints, deadlines promised out of each queue's own share."""

from flotilla.tenancy.model import (
    IMPLICIT_QUEUE,
    RESOURCE_GPU,
    QueueProblem,
    QueueSpec,
    Quota,
    queue_for,
    validate_queues,
)

__all__ = ["IMPLICIT_QUEUE", "RESOURCE_GPU", "QueueProblem", "QueueSpec", "Quota", "queue_for", "validate_queues"]
