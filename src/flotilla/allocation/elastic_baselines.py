"""Elastic baselines without admission control: what a user would otherwise run on an elastic cluster.

* `edf-elastic`: earliest deadline first, each job as large as helps. Every
  re-plan walks the unfinished jobs by deadline (those already past it last)
  and gives each the largest size its curve still gains from that the GPUs
  left allow; a job whose smallest size does not fit waits (later jobs
  backfill). The deadline-ordered elastic scheduling that ElasticFlow
  (Gu et al., ASPLOS 2023) compares with as "EDF" (there with elastic sizes).
* `goodput-elastic`: Pollux-style (Qiao et al., OSDI 2021) goodput-driven
  sizing, deadline-unaware. Every job gets its smallest size in submission
  order while GPUs last; the rest go one step at a time to the job whose
  speed-up per GPU (steps/s gained relative to its rate at the requested
  size) is highest, which maximises the sum of the jobs' speed-ups as
  Pollux's fitness does (without its batch-size tuning, which the curves here
  already include).

Both pay the same rescale cost as elastic-deadline and apply the same rule
against churn: a running job grows only if the finish time at the new size,
restore included, beats staying as it is. A job is never shrunk to make room
unless a job ahead of it (by deadline / by the goodput ordering) needs the GPUs.
"""

from __future__ import annotations

import heapq

from flotilla.allocation.placement import domains, free_gpus, place, shrink_in_place
from flotilla.allocation.sizes import fit_size, job_sizes
from flotilla.allocation.snapshot import ClusterSnapshot, Decision, JobDecision, JobState, Verdict


def _held(snapshot: ClusterSnapshot) -> dict[str, int]:
    schedulable = {n.name for n in snapshot.nodes if n.schedulable}
    return {j.key: j.gpus if j.placement and set(j.placement) <= schedulable else 0 for j in snapshot.jobs}


def _worth_resizing(job: JobState, current: int, size: int) -> bool:
    """Whether a running job should move from `current` to a larger `size`: sooner finish, restore included. As
    for `elastic-deadline`, not before its worker set has reported a rate (`JobState.rate_unknown`)."""
    if current == 0 or size <= current:
        return True
    if job.rate_unknown:
        return False
    stay = job.remaining_steps / job.curve.rate(current)
    move = job.restore_seconds + (job.remaining_steps + job.steps_since_checkpoint) / job.curve.rate(size)
    return move < stay


def _decide(snapshot: ClusterSnapshot, name: str, targets: dict[str, int], why: dict[str, str]) -> Decision:
    """Place each job's target GPU count: kept where unchanged, shrunk in place, the rest placed compactly."""
    held = _held(snapshot)
    jobs = {j.key: j for j in snapshot.jobs}
    kept: dict[str, dict[str, int]] = {}
    for key, target in targets.items():
        job = jobs[key]
        if held[key] and target == held[key]:
            kept[key] = dict(job.placement)
        elif held[key] and 0 < target < held[key]:
            kept[key] = shrink_in_place(job.placement, target, job.gpus_per_worker)
    free = free_gpus(snapshot.nodes, kept.values())
    placements = dict(kept)
    domain_of = domains(snapshot.nodes)
    for key in sorted((k for k, t in targets.items() if t and k not in kept), key=lambda k: (-targets[k], k)):
        job = jobs[key]
        for size in [s for s in reversed(job_sizes(job)[0]) if s <= targets[key]]:
            got = place(size, job.gpus_per_worker, free, snapshot.nodes, domain_of)
            if got is not None:
                for node, g in got.items():
                    free[node] -= g
                placements[key] = got
                break
    out: dict[str, JobDecision] = {}
    for job in snapshot.jobs:
        if job.remaining_steps == 0:
            out[job.key] = JobDecision(job.key, job.verdict or Verdict.ADMITTED, {}, "finished")
            continue
        placement = placements.get(job.key, {})
        gpus = sum(placement.values())
        verdict = Verdict.ADMITTED if gpus or job.verdict is Verdict.ADMITTED else Verdict.PENDING
        out[job.key] = JobDecision(job.key, verdict, placement, f"{why.get(job.key, '')}; {gpus} GPUs ({name})")
    return Decision(out, name)


class EdfElastic:
    name = "edf-elastic"

    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        now = snapshot.now
        held = _held(snapshot)
        waiting = sorted((j for j in snapshot.jobs if j.remaining_steps > 0),
                         key=lambda j: (j.deadline <= now, j.deadline, j.submit_time, j.key))
        left = snapshot.usable_gpus
        targets: dict[str, int] = {}
        why: dict[str, str] = {}
        for rank, job in enumerate(waiting, 1):
            sizes = job_sizes(job)[0]
            size = fit_size(sizes, left)
            current = held[job.key]
            if size > current > 0 and not _worth_resizing(job, current, size):
                size = fit_size(sizes, current)
            targets[job.key] = size
            left -= size
            why[job.key] = f"earliest deadline first, rank {rank}"
        return _decide(snapshot, self.name, targets, why)


class GoodputElastic:
    name = "goodput-elastic"

    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        held = _held(snapshot)
        jobs = sorted((j for j in snapshot.jobs if j.remaining_steps > 0 and job_sizes(j)[0]),
                      key=lambda j: (j.submit_time, j.key))
        left = snapshot.usable_gpus
        targets = {j.key: 0 for j in jobs}
        why = {j.key: "goodput-driven: waiting for its smallest size" for j in jobs}
        # Running jobs keep their smallest size first (no one is stopped for a newcomer), then the queue in order.
        for job in sorted(jobs, key=lambda j: held[j.key] == 0):
            smallest = job_sizes(job)[0][0]
            if smallest <= left:
                targets[job.key] = smallest
                left -= smallest
                why[job.key] = "goodput-driven: smallest size, then the highest speed-up per GPU"
        heap: list[tuple[float, str, int]] = []
        by_key = {j.key: j for j in jobs}

        def push(job: JobState) -> None:
            sizes, rates = job_sizes(job)
            now_size = targets[job.key]
            i = sizes.index(now_size) + 1 if now_size in sizes else len(sizes)
            if i < len(sizes):
                norm = job.curve.rate(job.requested) or rates[0]
                gain = (rates[i] - rates[i - 1]) / (sizes[i] - now_size) / norm
                heapq.heappush(heap, (-gain, job.key, sizes[i]))

        for job in jobs:
            if targets[job.key]:
                push(job)
        while heap and left > 0:
            _, key, size = heapq.heappop(heap)
            job = by_key[key]
            step = size - targets[key]
            if step > left:
                continue
            current = held[key]
            if current and size > current and not _worth_resizing(job, current, size):
                continue
            targets[key] = size
            left -= step
            push(job)
        # A running job that would only change for a gain its restore does not pay keeps its size where GPUs allow.
        for job in jobs:
            current = held[job.key]
            if current and targets[job.key] < current:
                extra = fit_size(job_sizes(job)[0], min(current, targets[job.key] + left))
                if extra > targets[job.key]:
                    left -= extra - targets[job.key]
                    targets[job.key] = extra
        return _decide(snapshot, self.name, targets, why)
