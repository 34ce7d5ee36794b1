"""bench/heavy_trace.py (the Philly-shaped heavy trace) and bench/elasticflow.py (the ElasticFlow baseline)."""

from __future__ import annotations

import dataclasses
import math

from bench import elasticflow, heavy_trace
from flotilla.allocation.curve import ScalingCurve
from flotilla.allocation.snapshot import ClusterSnapshot, Decision, JobDecision, JobState, Verdict
from flotilla.sim import training
from flotilla.sim.training_trace import TraceJob

LINEAR = ScalingCurve.of([(1, 1.0), (2, 2.0), (4, 4.0), (8, 8.0), (16, 16.0), (32, 32.0)])


def _job(key: str, steps: int, deadline: float, submit: float = 0.0, max_gpus: int = 32, **kw: object) -> JobState:
    return JobState(key=key, submit_time=submit, deadline=deadline, total_steps=steps, done_steps=0, min_gpus=1,
                    max_gpus=max_gpus, gpus_per_worker=1, curve=LINEAR, restore_seconds=0.0, **kw)  # type: ignore[arg-type]


def test_heavy_trace_shape() -> None:
    jobs = heavy_trace.generate(101)
    assert jobs == heavy_trace.generate(101)
    assert len(jobs) == heavy_trace.JOBS == 876
    assert max(j.submit for j in jobs) <= heavy_trace.DAYS * 86400 + 1
    assert max(j.submit for j in jobs) > 0.9 * heavy_trace.DAYS * 86400
    for j in jobs:
        duration = j.total_steps / j.curve.rate(j.requested_gpus)
        factor = (j.deadline - j.submit) / duration
        assert 0.5 - 1e-3 <= factor <= 1.5 + 1e-3, (j.job_id, factor)
        assert j.min_gpus == 1 and j.requested_gpus <= heavy_trace.GPUS
        assert j.restore_seconds == heavy_trace.restore_seconds(j.requested_gpus)
    # Sub-linear everywhere, and most models fall again past a peak.
    falling = [m for m in {j.model for j in jobs}
               if heavy_trace.curve(m).rate(64) < max(heavy_trace.curve(m).rate(g) for g in (8, 16, 32))]
    assert len(falling) >= 3
    assert 0.5 < heavy_trace.offered_load(jobs, heavy_trace.GPUS) < 1.5
    assert heavy_trace.generate(102) != jobs


def test_elasticflow_admits_what_fits_and_declines_what_would_break_a_share() -> None:
    nodes = training.make_nodes(16)
    first = _job("a", steps=16 * 1000, deadline=1000.0)  # needs all 16 GPUs for its whole window
    d = elasticflow.ElasticFlow().decide(ClusterSnapshot(0.0, nodes, (first,)))
    assert d.jobs["a"].verdict is Verdict.ADMITTED
    assert d.jobs["a"].share == 16 and d.jobs["a"].gpus == 16
    admitted = dataclasses.replace(first, verdict=Verdict.ADMITTED, placement=dict(d.jobs["a"].placement))
    late = _job("b", steps=100, deadline=500.0, submit=0.0)
    d = elasticflow.ElasticFlow().decide(ClusterSnapshot(0.0, nodes, (admitted, late)))
    assert d.jobs["b"].verdict is Verdict.REJECTED
    assert d.jobs["a"].gpus == 16
    roomy = _job("c", steps=100, deadline=5000.0)
    d = elasticflow.ElasticFlow().decide(ClusterSnapshot(0.0, nodes, (admitted, roomy)))
    assert d.jobs["c"].verdict is Verdict.ADMITTED  # after a's deadline the cluster is free


def test_elasticflow_shares_are_powers_of_two_and_leftovers_placed_buddy_style() -> None:
    nodes = training.make_nodes(32)
    jobs = tuple(_job(f"j{i}", steps=3000 + 500 * i, deadline=10_000.0 + i) for i in range(5))
    d = elasticflow.ElasticFlow().decide(ClusterSnapshot(0.0, nodes, jobs))
    used = 0
    for job in jobs:
        gpus = d.jobs[job.key].gpus
        assert gpus & (gpus - 1) == 0, gpus  # 0 or a power of two
        placement = d.jobs[job.key].placement
        if 0 < gpus <= 8:
            assert len(placement) == 1  # a job of up to a node's GPUs sits on one node
        elif gpus > 8:
            assert all(g == 8 for g in placement.values())  # a larger one on whole nodes
        used += gpus
    assert used <= 32 and used >= 24  # leftovers are handed out (levels are powers of two)


def test_elasticflow_asks_for_a_replan_when_its_plan_starts_later() -> None:
    nodes = training.make_nodes(8)
    # As late as possible: a job due far ahead is planned at its deadline's end, and asks to be woken then.
    busy = _job("busy", steps=8 * 4000, deadline=4000.0)
    later = _job("later", steps=8 * 1000, deadline=6000.0, max_gpus=8)
    d = elasticflow.ElasticFlow().decide(ClusterSnapshot(0.0, nodes, (busy, later)))
    assert d.jobs["later"].verdict is Verdict.ADMITTED
    assert d.replan_at is not None and 0 < d.replan_at <= 5000.0


class _Delayed:
    """A policy that gives its one job GPUs only from t=100, and says so (Decision.replan_at)."""

    name = "delayed"

    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        out = {}
        for j in snapshot.jobs:
            placement = {snapshot.nodes[0].name: 1} if snapshot.now >= 100 - 1e-9 else {}
            out[j.key] = JobDecision(j.key, Verdict.ADMITTED, placement, "test")
        return Decision(out, self.name, replan_at=None if snapshot.now >= 100 else 100.0)


def test_simulator_replans_at_replan_at() -> None:
    job = TraceJob("x", 0.0, 50, 1, 1, 1, 1, 1000.0, LINEAR)
    r = training.simulate([job], 8, _Delayed())
    assert r.deadlines_met == 1 and math.isclose(r.avg_jct_s, 150.0)


def test_elasticflow_on_a_slice_of_the_heavy_trace_beats_edf_at_the_requested_size() -> None:
    from flotilla.allocation import policies

    trace = heavy_trace.generate(7)[:120]
    ef = training.simulate(trace, heavy_trace.GPUS, elasticflow.ElasticFlow())
    edf = training.simulate(trace, heavy_trace.GPUS, policies.get("edf-fixed"))
    assert ef.deadlines_met > edf.deadlines_met
    assert ef.admitted_missed <= 0.05 * ef.admitted
