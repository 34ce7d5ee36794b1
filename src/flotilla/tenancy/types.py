"""What the tenancy decision returns: the pool's decision, each queue's usage, the reclaims, the problems."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from flotilla.pool.types import PoolDecision
from flotilla.tenancy.model import QueueProblem


@dataclass(frozen=True)
class QueueUsage:
    """A queue's figures for its status (GPUs, except admitted and pending: jobs and deployments)."""

    nominal: int
    used: int  # GPUs its jobs and deployments hold after this decision
    borrowed: int  # of `used`, above its nominal (others' unused nominal)
    lent: int  # of its unused nominal, used by others
    admitted: int  # jobs and deployments that run or are guaranteed
    pending: int  # jobs and deployments waiting for GPUs
    guaranteed: int  # GPUs promised now out of its nominal (its jobs' guaranteed shares, its serving's demand)


@dataclass(frozen=True)
class Reclaim:
    """A borrower shrunk (through a checkpoint) so that a queue gets its nominal back."""

    job: str  # the JobState (or ServingState) key
    from_queue: str  # the borrower's queue
    to_queue: str  # the queue that gets the GPUs back
    gpus: int
    reason: str


@dataclass(frozen=True)
class TenantDecision:
    pool: PoolDecision
    queues: Mapping[str, QueueUsage]
    reclaims: tuple[Reclaim, ...]
    problems: tuple[QueueProblem, ...]
