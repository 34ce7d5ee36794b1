"""Pure allocation logic: cluster snapshots in, per-job decisions out.

Nothing here imports Kubernetes, HTTP or SQL; the operator and the simulators
drive the same code.
"""

from flotilla.allocation.curve import ScalingCurve
from flotilla.allocation.snapshot import (
    Allocator,
    ClusterSnapshot,
    Decision,
    JobDecision,
    JobState,
    NodeState,
    Verdict,
)

__all__ = [
    "Allocator",
    "ClusterSnapshot",
    "Decision",
    "JobDecision",
    "JobState",
    "NodeState",
    "ScalingCurve",
    "Verdict",
]
