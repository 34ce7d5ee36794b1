"""Snapshot and decision types shared by every allocation policy.

Times are seconds on one clock (the operator uses Unix time, the simulator its
own clock). GPU counts are whole GPUs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping, Protocol

from flotilla.allocation.curve import ScalingCurve


@dataclass(frozen=True)
class NodeState:
    name: str
    total_gpus: int
    # GPUs held by pods Flotilla does not manage (other workloads); not ours to give.
    foreign_gpus: int = 0
    schedulable: bool = True  # False when cordoned or tainted flotilla.dev/unhealthy
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def usable_gpus(self) -> int:
        return max(0, self.total_gpus - self.foreign_gpus) if self.schedulable else 0

    @property
    def domain(self) -> str:
        """Topology domain (NVLink domain, else rack, else the node itself)."""
        return self.labels.get("flotilla.dev/nvlink-domain") or self.labels.get("flotilla.dev/rack") or self.name


class Verdict(str, enum.Enum):
    ADMITTED = "Admitted"  # guaranteed its minimum share until its deadline
    BEST_EFFORT = "BestEffort"  # runs on leftovers, no deadline guarantee
    PENDING = "Pending"  # waits (e.g. FIFO queue); not yet decided for good
    REJECTED = "Rejected"  # cannot meet its deadline; will not run


@dataclass(frozen=True)
class JobState:
    key: str  # "namespace/name"
    submit_time: float
    deadline: float  # absolute, same clock as ClusterSnapshot.now
    total_steps: int
    done_steps: int
    min_gpus: int
    max_gpus: int
    gpus_per_worker: int
    curve: ScalingCurve
    restore_seconds: float = 30.0
    best_effort: bool = False
    # What the job holds now: node -> GPUs. Empty when not running.
    placement: Mapping[str, int] = field(default_factory=dict)
    # The verdict it already has (admission is decided once, then kept).
    verdict: Verdict | None = None
    checkpoint_interval_steps: int = 0
    last_checkpoint_step: int = 0
    # The size the user asked for (fixed-size baselines run at it); 0 means minGPUs.
    requested_gpus: int = 0
    # GPU-seconds the job has received so far (least-attained-service baselines).
    attained_gpu_seconds: float = 0.0
    # When a job that was just resized trains again (its restore ends); 0 or the past: it trains now.
    resumes_at: float = 0.0
    # The share its guarantee was last planned at (JobDecision.share, fed back): a re-plan keeps at least
    # that much for it, so that the plan every other guarantee was checked against still holds. 0: none.
    share: int = 0
    # Its worker set has not reported a rate yet (just started or resized): whether a resize would pay back
    # its restore cannot be told, so it is not grown for speed until it has.
    rate_unknown: bool = False
    # Its team's queue (flotilla.tenancy; "" = the implicit queue of a cluster with no queues) and its priority
    # within the queue (higher keeps its GPUs longer when borrowed GPUs are reclaimed).
    queue: str = ""
    priority: int = 0

    @property
    def gpus(self) -> int:
        return sum(self.placement.values())

    @property
    def remaining_steps(self) -> int:
        return max(0, self.total_steps - self.done_steps)

    @property
    def requested(self) -> int:
        return self.requested_gpus or self.min_gpus

    @property
    def steps_since_checkpoint(self) -> int:
        return max(0, self.done_steps - self.last_checkpoint_step)


@dataclass(frozen=True)
class ClusterSnapshot:
    now: float
    nodes: tuple[NodeState, ...]
    jobs: tuple[JobState, ...]
    # Others' claims on `usable_gpus` over time, as (from time, GPUs) steps (0 before the first):
    # GPUs that serving is forecast to take (negative: to give back). Admission keeps them free.
    claimed: tuple[tuple[float, int], ...] = ()

    @property
    def usable_gpus(self) -> int:
        return sum(n.usable_gpus for n in self.nodes)


@dataclass(frozen=True)
class JobDecision:
    key: str
    verdict: Verdict
    placement: Mapping[str, int]  # node -> GPUs; empty means no GPUs now
    reason: str
    # GPUs this job is guaranteed right now (its minimum satisfactory share); 0 if none.
    guaranteed_gpus: int = 0
    # The share its guarantee is planned at (GPUs up to which it is reserved until it finishes); 0 if none.
    # Feed it back as JobState.share.
    share: int = 0

    @property
    def gpus(self) -> int:
        return sum(self.placement.values())


@dataclass(frozen=True)
class Decision:
    jobs: Mapping[str, JobDecision]
    policy: str

    def for_job(self, key: str) -> JobDecision | None:
        return self.jobs.get(key)


class Allocator(Protocol):
    """A policy. `decide` must be a pure function of the snapshot."""

    name: str

    def decide(self, snapshot: ClusterSnapshot) -> Decision: ...
