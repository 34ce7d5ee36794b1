"""bench/tenancy_judge.py: it imports nothing of Flotilla, and scores a hand-checked run: an eviction discards
the work since the last checkpoint, a checkpointed shrink discards none, and a reclaimed job's GPUs are free for
the other team only once its checkpoint is written."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from tenancy_judge import Allocation, Job, Team, Trace, View, make_trace, simulate, within_share  # noqa: E402

LINEAR = ((1, 1.0), (8, 8.0))


def test_the_judge_imports_nothing_of_flotilla() -> None:
    tree = ast.parse((BENCH / "tenancy_judge.py").read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert names and not [n for n in names if n.startswith("flotilla")], names


def _trace() -> Trace:
    a = Job("a/long", "a", 0.0, 8 * 2000, None, LINEAR, 1, 8, 8, restore_s=60.0, checkpoint_s=20.0,
            checkpoint_every=8 * 600)
    b = Job("b/new", "b", 1000.0, 4 * 500, 3000.0, LINEAR, 4, 4, 4, restore_s=60.0, checkpoint_s=20.0,
            checkpoint_every=1000)
    return Trace("hand", 0, 1, 8, 4000.0, (Team("a", 4), Team("b", 4)), (a, b))


class _Reclaimer:
    """a borrows the whole node; at b's arrival it gives 4 GPUs back (shrink or eviction)."""

    name = "hand"

    def __init__(self, preempts: str) -> None:
        self.preempts = preempts

    def decide(self, view: View) -> Allocation:
        jobs = {jv.job.id: jv for jv in view.jobs}
        alloc = Allocation({}, {})
        if "b/new" in jobs:
            alloc.jobs["b/new"] = {"n00": 4}
            if "a/long" in jobs and (self.preempts == "checkpoint" or jobs["a/long"].placement == {}):
                alloc.jobs["a/long"] = {"n00": 4}
        elif "a/long" in jobs:
            alloc.jobs["a/long"] = {"n00": 8}
        return alloc


def test_eviction_discards_work_since_the_checkpoint_and_a_checkpointed_shrink_none() -> None:
    shrink = simulate(_trace(), _Reclaimer("checkpoint"))
    evict = simulate(_trace(), _Reclaimer("evict"))
    assert shrink.reclaims == evict.reclaims == 1
    assert shrink.work_lost_gpu_h == 0.0
    # a trained 1000 s on 8 GPUs (8000 steps); its last checkpoint was at 4800: 3200 steps at 8/s on 8 GPUs lost.
    assert abs(evict.work_lost_gpu_h - 400 * 8 / 3600) < 1e-6
    # b waits for a's checkpoint (20 s) in one case, for its pods to go (30 s grace) in the other.
    assert shrink.reclaim_latency_s == [20.0] and evict.reclaim_latency_s == [30.0]
    assert shrink.met == {"b": 1} and shrink.judged == {"b": 1}


def test_within_share_counts_what_the_team_asks_for() -> None:
    trace = _trace()
    assert within_share(trace, {}) == {"b/new"}  # needs 4 of b's 4 GPUs
    tight = Trace("t", 0, 1, 8, 4000.0, (Team("a", 4), Team("b", 2)), trace.jobs)
    assert within_share(tight, {}) == set()


def test_traces_are_seeded() -> None:
    one, two = make_trace("bursty", 5, duration_s=3600.0), make_trace("bursty", 5, duration_s=3600.0)
    assert one == two and one.jobs
    assert make_trace("serving", 5, duration_s=3600.0).serving


class _Fixed:
    """a holds `a_gpus` GPUs throughout; b's job never gets any (it is late)."""

    name = "fixed"
    preempts = "checkpoint"

    def __init__(self, a_gpus: int) -> None:
        self.a_gpus = a_gpus

    def decide(self, view: View) -> Allocation:
        alloc = Allocation({}, {})
        if any(jv.job.id == "a/long" for jv in view.jobs):
            alloc.jobs["a/long"] = {"n00": self.a_gpus}
        return alloc


def test_a_late_job_is_deprived_only_when_another_team_held_its_share() -> None:
    borrowed = simulate(_trace(), _Fixed(8))  # a borrows b's 4 GPUs while b's job waits
    assert borrowed.violations == {"b/new"} and borrowed.deprived == {"b/new"}
    assert any(gpus == 4 for _, _, gpus in borrowed.short["b"])
    own = simulate(_trace(), _Fixed(4))  # a within its own share: b's job is late for no other team's work
    assert own.violations == {"b/new"} and own.deprived == set()
    assert "b" not in own.short
