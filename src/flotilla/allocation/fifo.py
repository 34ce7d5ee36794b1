"""FIFO gang scheduling at the requested size (Kueue StrictFIFO / Volcano gang): the simple baseline.

Jobs start in submission order, each with exactly the GPUs it asked for
(`requested_gpus`; `minGPUs` when it names none, as the operator does), all
workers at once or not at all. The head of the queue blocks those behind it (strict FIFO).
A running job keeps its placement while its nodes stay schedulable; if one
is lost, the job is placed again from scratch. No deadline guarantee is given.
"""

from __future__ import annotations

from flotilla.allocation.placement import free_gpus, place
from flotilla.allocation.snapshot import ClusterSnapshot, Decision, JobDecision, JobState, Verdict


class FifoGang:
    name = "fifo-gang"

    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        schedulable = {n.name for n in snapshot.nodes if n.schedulable}
        jobs = sorted(snapshot.jobs, key=lambda j: (j.submit_time, j.key))
        kept: dict[str, dict[str, int]] = {}
        for job in jobs:
            if job.placement and job.remaining_steps > 0 and set(job.placement) <= schedulable:
                kept[job.key] = dict(job.placement)
        free = free_gpus(snapshot.nodes, kept.values())

        out: dict[str, JobDecision] = {}
        blocked_by: JobState | None = None
        for job in jobs:
            if job.remaining_steps == 0:
                out[job.key] = JobDecision(job.key, job.verdict or Verdict.ADMITTED, {}, "finished")
                continue
            if job.key in kept:
                out[job.key] = JobDecision(job.key, Verdict.ADMITTED, kept[job.key], f"running on {job.gpus} GPUs")
                continue
            if blocked_by is not None:
                out[job.key] = JobDecision(job.key, Verdict.PENDING, {},
                                           f"queued behind {blocked_by.key} (FIFO)")
                continue
            placement = place(job.requested, job.gpus_per_worker, free, snapshot.nodes)
            if placement is None:
                blocked_by = job
                out[job.key] = JobDecision(
                    job.key, Verdict.PENDING, {},
                    f"waiting for {job.requested} GPUs in {job.gpus_per_worker}-GPU workers; "
                    f"{sum(free.values())} free",
                )
                continue
            for node, g in placement.items():
                free[node] -= g
            why = "placed again after losing a node" if job.placement else "started"
            out[job.key] = JobDecision(job.key, Verdict.ADMITTED, placement,
                                       f"{why} at its requested {job.requested} GPUs (FIFO gang)")
        return Decision(out, self.name)
