"""One GPU pool shared by deadline training and SLO serving (pure): the arbiter and its types."""

from flotilla.pool.arbiter import decide, with_foreign_gpus
from flotilla.pool.types import (
    Loan,
    PoolDecision,
    PoolPolicy,
    PoolSnapshot,
    ServingDecision,
    ServingState,
    Transition,
)

__all__ = ["decide", "with_foreign_gpus", "Loan", "PoolDecision", "PoolPolicy", "PoolSnapshot", "ServingDecision",
           "ServingState", "Transition"]
