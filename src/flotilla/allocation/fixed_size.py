"""Fixed-size, preemptive gang baselines: each job runs at its requested size or not at all.

Every re-plan walks the unfinished jobs in the policy's priority order and
gives each its requested GPUs while they last, skipping a job that does not fit
(backfilling behind it). A running job that is no longer chosen is preempted
(it resumes later from its checkpoint). No admission control and no guarantee.
"""

from __future__ import annotations

from typing import Callable

from flotilla.allocation.placement import free_gpus, place
from flotilla.allocation.snapshot import ClusterSnapshot, Decision, JobDecision, JobState, Verdict

PriorityKey = Callable[[JobState, float], tuple]


class FixedSizeGang:
    def __init__(self, name: str, priority: PriorityKey, order_text: str) -> None:
        self.name = name
        self._priority = priority
        self._order_text = order_text

    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        now = snapshot.now
        schedulable = {n.name for n in snapshot.nodes if n.schedulable}
        out: dict[str, JobDecision] = {}
        waiting = sorted((j for j in snapshot.jobs if j.remaining_steps > 0),
                         key=lambda j: (self._priority(j, now), j.submit_time, j.key))
        for job in snapshot.jobs:
            if job.remaining_steps == 0:
                out[job.key] = JobDecision(job.key, job.verdict or Verdict.ADMITTED, {}, "finished")

        left = snapshot.usable_gpus
        chosen: list[JobState] = []
        for job in waiting:
            if job.requested <= left:
                chosen.append(job)
                left -= job.requested
        kept = {j.key: dict(j.placement) for j in chosen
                if j.placement and j.gpus == j.requested and set(j.placement) <= schedulable}
        free = free_gpus(snapshot.nodes, kept.values())
        placements = dict(kept)
        for job in chosen:
            if job.key in kept:
                continue
            got = place(job.requested, job.gpus_per_worker, free, snapshot.nodes)
            if got is not None:
                placements[job.key] = got
                for node, g in got.items():
                    free[node] -= g

        for rank, job in enumerate(waiting, 1):
            placement = placements.get(job.key)
            if placement is not None:
                what = "keeps" if job.key in kept else "starts on"
                why = f"{what} its requested {job.requested} GPUs ({self._order_text}, rank {rank})"
                out[job.key] = JobDecision(job.key, Verdict.ADMITTED, placement, why)
            else:
                preempted = "preempted; " if job.gpus else ""
                why = (f"{preempted}waiting for {job.requested} GPUs ({self._order_text}, rank {rank}; "
                       f"{snapshot.usable_gpus} usable)")
                out[job.key] = JobDecision(job.key, Verdict.PENDING, {}, why)
        return Decision(out, self.name)


def earliest_deadline(job: JobState, now: float) -> tuple:
    # A job already past its deadline goes behind every job that can still make it.
    return (job.deadline <= now, job.deadline)


# Tiresias-style discretised priority queues, by GPU-seconds attained.
LAS_QUEUE_LIMITS = (3_600.0, 36_000.0)


def least_attained_service(job: JobState, now: float) -> tuple:
    return (sum(job.attained_gpu_seconds >= limit for limit in LAS_QUEUE_LIMITS),)


def edf_fixed() -> FixedSizeGang:
    return FixedSizeGang("edf-fixed", earliest_deadline, "earliest deadline first")


def las_fixed() -> FixedSizeGang:
    return FixedSizeGang("least-attained-service", least_attained_service,
                         "least attained GPU-seconds first, queues at "
                         + "/".join(f"{x:.0f}" for x in LAS_QUEUE_LIMITS) + " GPU-s")
