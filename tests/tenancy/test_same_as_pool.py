"""With no queues, tenancy.decide is flotilla.pool.decide, decision for decision, over the traces the training and
unified-pool simulators replay today; with one queue that holds every GPU, each job gets the same verdict and
GPUs."""

from __future__ import annotations

import dataclasses

import pytest

import flotilla.sim.unified as unified
from flotilla.allocation.snapshot import ClusterSnapshot, Decision
from flotilla.pool import PoolSnapshot, decide as pool_decide
from flotilla.sim.training import simulate as simulate_training
from flotilla.sim.training_trace import generate
from flotilla.sim.unified_scenarios import build
from flotilla.tenancy import RESOURCE_GPU, QueueSpec, Quota, decide

# The shapes of tests/sim_training/test_old_traces.py's traces, cut short to keep this test fast.
TRAINING = [(40, 32, 1, "poisson", (1.2, 3.0)), (40, 32, 2, "bursty", (1.2, 3.0)), (40, 64, 3, "poisson", (0.5, 1.5))]


def _one_queue(snapshot: PoolSnapshot) -> tuple[PoolSnapshot, list[QueueSpec]]:
    capacity = sum(n.usable_gpus for n in snapshot.nodes)
    jobs = tuple(dataclasses.replace(j, queue="team") for j in snapshot.jobs)
    serving = tuple(dataclasses.replace(s, queue="team") for s in snapshot.serving)
    return (dataclasses.replace(snapshot, jobs=jobs, serving=serving),
            [QueueSpec("team", {RESOURCE_GPU: Quota(capacity)})])


class _Both:
    """A policy for the training simulator that decides by the pool arbiter and checks tenancy against it."""

    name = "both"

    def __init__(self) -> None:
        self.decisions = 0

    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        pool = PoolSnapshot(snapshot.now, snapshot.nodes, snapshot.jobs, ())
        expected = pool_decide(pool)
        assert decide(pool, []).pool == expected
        _check_one_queue(pool, expected)
        self.decisions += 1
        return Decision(dict(expected.jobs), self.name)


def _check_one_queue(pool: PoolSnapshot, expected) -> None:  # type: ignore[no-untyped-def]
    queued, queues = _one_queue(pool)
    got = decide(queued, queues)
    assert not got.reclaims and not got.problems
    for key, d in expected.jobs.items():
        mine = got.pool.jobs[key]
        assert (mine.verdict, mine.gpus) == (d.verdict, d.gpus), (key, mine, d)
    for key, s in expected.serving.items():
        assert got.pool.serving[key].gpus == s.gpus, (key, got.pool.serving[key], s)


@pytest.mark.parametrize("jobs, gpus, seed, arrivals, factor", TRAINING)
def test_training_traces(jobs: int, gpus: int, seed: int, arrivals: str, factor: tuple[float, float]) -> None:
    both = _Both()
    trace = generate(jobs, gpus, seed=seed, load=2.0, arrivals=arrivals, deadline_factor=factor)
    simulate_training(trace, gpus, both)
    assert both.decisions > jobs


@pytest.mark.parametrize("name, seed", [("diurnal", 1), ("burst", 2)])
def test_unified_scenarios(name: str, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def checked(snapshot: PoolSnapshot, policy=unified.PoolPolicy()):  # type: ignore[no-untyped-def]
        expected = pool_decide(snapshot, policy)
        assert decide(snapshot, [], policy).pool == expected
        _check_one_queue(snapshot, expected)
        calls.append(snapshot.now)
        return expected

    monkeypatch.setattr(unified, "decide", checked)
    scenario = build(name, seed, gpus=16, duration_s=4 * 3600.0, mean_rate=60.0, training_jobs=12)
    unified.simulate(scenario, "unified", step_s=600.0)
    assert len(calls) >= 20
