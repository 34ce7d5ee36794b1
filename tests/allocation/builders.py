"""Small builders for allocation tests: linear curves, jobs, nodes."""

from __future__ import annotations

from flotilla.allocation import ClusterSnapshot, JobState, NodeState, ScalingCurve, Verdict

# One step per second per GPU, measured up to 8 GPUs.
LINEAR = ScalingCurve.of({1: 1.0, 8: 8.0})


def job(key: str, steps: int, deadline: float, *, done: int = 0, min_gpus: int = 1, max_gpus: int = 8,
        unit: int = 1, placement: dict[str, int] | None = None, verdict: Verdict | None = None,
        restore: float = 0.0, submit: float = 0.0, best_effort: bool = False,
        curve: ScalingCurve = LINEAR, **extra) -> JobState:
    return JobState(key=key, submit_time=submit, deadline=deadline, total_steps=steps, done_steps=done,
                    min_gpus=min_gpus, max_gpus=max_gpus, gpus_per_worker=unit, curve=curve,
                    restore_seconds=restore, best_effort=best_effort, placement=placement or {},
                    verdict=verdict, **extra)


def nodes(*sizes: int, unschedulable: tuple[str, ...] = (), domains: dict[str, str] | None = None) -> tuple[NodeState, ...]:
    out = []
    for i, size in enumerate(sizes):
        name = f"n{i}"
        labels = {"flotilla.dev/nvlink-domain": domains[name]} if domains and name in domains else {}
        out.append(NodeState(name, size, schedulable=name not in unschedulable, labels=labels))
    return tuple(out)


def snapshot(node_list: tuple[NodeState, ...], *jobs: JobState, now: float = 0.0) -> ClusterSnapshot:
    return ClusterSnapshot(now, node_list, tuple(jobs))
