"""Discrete-event simulation of training jobs on a GPU cluster under one allocation policy.

Jobs arrive at their submit time; every arrival and completion (and the time a
policy's plan changes by itself, `Decision.replan_at`) triggers a re-plan by the policy (the same `Allocator.decide` the operator calls). A job
runs at its curve's rate for the GPUs it holds. Any change to a running job's
placement (resize, move, preemption, restart) is a rescale: the job checkpoints
on request (no steps are lost) and then trains nothing for `restoreSeconds`.
Jobs run to completion even when late; a rejected job never runs.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from typing import Sequence, TextIO

from flotilla.allocation.snapshot import Allocator, ClusterSnapshot, JobDecision, JobState, NodeState, Verdict
from flotilla.sim.training_trace import TraceJob

GPUS_PER_NODE = 8
NODES_PER_RACK = 4
_EPS = 1e-6


def make_nodes(gpus: int) -> tuple[NodeState, ...]:
    """`gpus` GPUs as 8-GPU nodes (the last one may be smaller), 4 nodes to a rack."""
    if gpus <= 0:
        raise ValueError("gpus must be > 0")
    nodes = []
    for i in range(math.ceil(gpus / GPUS_PER_NODE)):
        size = min(GPUS_PER_NODE, gpus - i * GPUS_PER_NODE)
        nodes.append(NodeState(f"node-{i:04d}", size, labels={"flotilla.dev/rack": f"rack-{i // NODES_PER_RACK:03d}"}))
    return tuple(nodes)


@dataclass
class SimJob:
    """A trace job as it runs: progress, placement, restore pauses."""

    trace: TraceJob
    done: float = 0.0
    placement: dict[str, int] = field(default_factory=dict)
    verdict: Verdict | None = None
    idle_until: float = 0.0  # restoring after a rescale until then
    attained: float = 0.0
    finish: float | None = None
    rescales: int = 0
    guaranteed: bool = False  # the policy promised it GPUs to meet its deadline at some point
    share: int = 0  # the share its guarantee was last planned at (JobDecision.share)

    @property
    def gpus(self) -> int:
        return sum(self.placement.values())

    def rate(self) -> float:
        return self.trace.curve.rate(self.gpus)

    def state(self, now: float) -> JobState:
        """What the allocator sees at `now`. A job restoring after a resize has not reported a rate on its
        new worker set yet, as in the operator (`JobState.rate_unknown`)."""
        t = self.trace
        done = min(t.total_steps, math.floor(self.done + _EPS))
        return JobState(
            key=t.job_id, submit_time=t.submit, deadline=t.deadline, total_steps=t.total_steps, done_steps=done,
            min_gpus=t.min_gpus, max_gpus=t.max_gpus, gpus_per_worker=t.gpus_per_worker, curve=t.curve,
            restore_seconds=t.restore_seconds, best_effort=t.best_effort, placement=dict(self.placement),
            verdict=self.verdict, last_checkpoint_step=done, requested_gpus=t.requested_gpus,
            attained_gpu_seconds=self.attained, resumes_at=self.idle_until,
            share=self.share, rate_unknown=bool(self.placement) and now < self.idle_until,
        )


def initial_state(job: TraceJob) -> JobState:
    """The allocator's view of a trace job that has just arrived."""
    return SimJob(job).state(job.submit)


@dataclass(frozen=True)
class SimResult:
    policy: str
    gpus: int
    jobs: int
    admitted: int  # jobs that ran (admitted or best-effort)
    rejected: int
    deadlines_met: int
    deadline_ratio: float  # met / submitted
    guarantees_missed: int  # jobs given a deadline guarantee that still finished late (or never)
    admitted_missed: int  # jobs the policy left admitted (a promise, for a policy that admits) that missed
    utilisation: float  # GPU-seconds held / (GPUs x span from first submit to last finish)
    avg_jct_s: float  # over jobs that finished
    unfinished: int  # jobs the policy never finished (e.g. they can never fit)
    rescales: int
    replans: int
    decision_ms_mean: float
    decision_ms_max: float
    # (time, GPUs held, jobs running) after each event, for plots.
    timeline: tuple[tuple[float, int, int], ...] = field(repr=False, default=())

    def summary(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if k != "timeline"}


def simulate(trace: Sequence[TraceJob], gpus: int, policy: Allocator, progress: TextIO | None = None) -> SimResult:
    """Replay `trace` on `gpus` GPUs under `policy`. Progress goes to `progress` when given."""
    nodes = make_nodes(gpus)
    arrivals = sorted(trace, key=lambda j: (j.submit, j.job_id))
    if not arrivals:
        raise ValueError("the trace has no jobs")
    jobs = {j.job_id: SimJob(j) for j in arrivals}
    active: dict[str, SimJob] = {}
    bar = _ProgressBar(progress, policy.name, len(arrivals))
    next_arrival = 0
    now = arrivals[0].submit
    held_gpu_seconds = 0.0
    decision_s: list[float] = []
    timeline: list[tuple[float, int, int]] = []
    completed = 0
    while True:
        while next_arrival < len(arrivals) and arrivals[next_arrival].submit <= now + _EPS:
            job = jobs[arrivals[next_arrival].job_id]
            active[job.trace.job_id] = job
            next_arrival += 1
        wake = None
        if active:
            snapshot = ClusterSnapshot(now, nodes, tuple(j.state(now) for j in active.values()))
            started = time.perf_counter()
            decision = policy.decide(snapshot)
            decision_s.append(time.perf_counter() - started)
            wake = decision.replan_at
            for key, job in list(active.items()):
                apply_decision(job, decision.for_job(key), now)
                if job.verdict is Verdict.REJECTED:
                    del active[key]
                    completed += 1
        timeline.append((now, sum(j.gpus for j in active.values()), sum(1 for j in active.values() if j.gpus)))
        bar.update(completed)

        upcoming = [arrivals[next_arrival].submit] if next_arrival < len(arrivals) else []
        upcoming += [max(now, j.idle_until) + (j.trace.total_steps - j.done) / j.rate()
                     for j in active.values() if j.gpus]
        # A restore's end: the job's new worker set reports its rate, and the operator plans it again.
        upcoming += [j.idle_until for j in active.values() if j.gpus and j.idle_until > now + _EPS]
        # A plan that changes by itself (Decision.replan_at), if anything is left to run.
        upcoming += [wake] if wake is not None and wake > now + _EPS and active else []
        if not upcoming:
            break  # nothing runs and nothing arrives: what is left can never run
        until = max(min(upcoming), now)
        for key, job in list(active.items()):
            if not job.gpus:
                continue
            held_gpu_seconds += job.gpus * (until - now)
            job.attained += job.gpus * (until - now)
            job.done += job.rate() * max(0.0, until - max(now, job.idle_until))
            if job.done >= job.trace.total_steps * (1 - 1e-9) - _EPS:
                job.done = job.trace.total_steps
                job.finish = until
                job.placement = {}
                del active[key]
                completed += 1
        now = until
    bar.close()

    finished = [(j, j.finish) for j in jobs.values() if j.finish is not None]
    ran = [j for j in jobs.values() if j.verdict is not Verdict.REJECTED]
    met_ids = {j.trace.job_id for j, finish in finished if finish <= j.trace.deadline + _EPS}
    met = len(met_ids)
    span = (max((finish for _, finish in finished), default=now) - arrivals[0].submit) or 1.0
    return SimResult(
        policy=policy.name, gpus=gpus, jobs=len(arrivals), admitted=len(ran), rejected=len(arrivals) - len(ran),
        deadlines_met=met, deadline_ratio=met / len(arrivals),
        guarantees_missed=sum(1 for j in jobs.values() if j.guaranteed and j.trace.job_id not in met_ids),
        admitted_missed=sum(1 for j in jobs.values() if j.verdict is Verdict.ADMITTED and j.trace.job_id not in met_ids),
        utilisation=held_gpu_seconds / (gpus * span),
        avg_jct_s=sum(finish - j.trace.submit for j, finish in finished) / len(finished) if finished else 0.0,
        unfinished=len(ran) - len(finished), rescales=sum(j.rescales for j in jobs.values()),
        replans=len(decision_s), decision_ms_mean=1000 * sum(decision_s) / max(1, len(decision_s)),
        decision_ms_max=1000 * max(decision_s, default=0.0), timeline=tuple(timeline),
    )


def apply_decision(job: SimJob, decision: JobDecision | None, now: float) -> None:
    if decision is None:
        return
    if decision.verdict is not Verdict.PENDING:
        job.verdict = decision.verdict
    job.guaranteed = job.guaranteed or decision.guaranteed_gpus > 0
    job.share = decision.share
    new = {n: g for n, g in decision.placement.items() if g}
    if new == job.placement:
        return
    if job.placement or job.done > 0:
        # A resize, move, preemption or restart: checkpoint, then pay the restore.
        job.rescales += 1
        job.idle_until = now + job.trace.restore_seconds
    job.placement = new


class _ProgressBar:
    """A one-line progress bar on a terminal stream; silent when no stream is given."""

    def __init__(self, stream: TextIO | None, label: str, total: int) -> None:
        self.stream, self.label, self.total = stream, label, total
        self.shown = -1

    def update(self, done: int) -> None:
        if self.stream is None:
            return
        pct = 100 * done // self.total
        if pct != self.shown:
            self.shown = pct
            filled = pct // 4
            self.stream.write(f"\r{self.label:>24} [{'#' * filled}{'.' * (25 - filled)}] {pct:3d}% "
                              f"{done}/{self.total} jobs")
            self.stream.flush()

    def close(self) -> None:
        if self.stream is not None:
            self.stream.write("\n")
            self.stream.flush()


def default_progress_stream(jobs: int) -> TextIO | None:
    """stderr for long traces on a terminal, else nothing."""
    return sys.stderr if jobs >= 200 and sys.stderr.isatty() else None


def plot(results: Sequence[SimResult], path: str) -> None:
    """GPUs held over time, one line per policy, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    for r in results:
        if r.timeline:
            t0 = r.timeline[0][0]
            ax.step([(t - t0) / 3600 for t, _, _ in r.timeline], [g for _, g, _ in r.timeline], where="post",
                    label=f"{r.policy} (deadlines met {r.deadline_ratio:.0%})", linewidth=0.8)
    if results:
        ax.axhline(results[0].gpus, color="grey", linestyle=":", label="cluster GPUs")
    ax.set_xlabel("hours since the first submit")
    ax.set_ylabel("GPUs allocated")
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
