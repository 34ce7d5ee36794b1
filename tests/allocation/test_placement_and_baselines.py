"""Compact placement, the fixed-size baselines and the policy registry."""

import pytest
from builders import job, nodes, snapshot

from flotilla.allocation import ScalingCurve, Verdict, policies
from flotilla.allocation.placement import free_gpus, place
from flotilla.allocation.sizes import job_sizes


@pytest.mark.parametrize("gpus, unit, free, expected", [
    (4, 1, {"n0": 8, "n1": 4}, {"n1": 4}),  # the tightest single node
    (8, 1, {"n0": 4, "n1": 4, "n2": 6, "n3": 6}, {"n0": 4, "n1": 4}),  # the tightest domain that holds it
    (4, 2, {"n0": 3, "n1": 3}, {"n0": 2, "n1": 2}),  # whole 2-GPU workers only
    (6, 2, {"n0": 3, "n1": 3}, None),
])
def test_place(gpus, unit, free, expected):
    node_list = nodes(8, 8, 8, 8, domains={"n0": "a", "n1": "a", "n2": "b", "n3": "b"})
    assert place(gpus, unit, free, node_list) == expected


def test_free_gpus_skips_unschedulable_nodes_and_held_gpus():
    node_list = nodes(8, 8, 8, unschedulable=("n1",))
    assert free_gpus(node_list, [{"n0": 3}, {"n2": 8}]) == {"n0": 5}


@pytest.mark.parametrize("min_gpus, max_gpus, unit, expected", [
    (1, 8, 1, (1, 2, 3, 4, 5, 6, 7, 8)),  # any whole-worker count, not only powers of two
    (3, 12, 1, tuple(range(3, 13))),
    (2, 16, 2, (2, 4, 6, 8, 10, 12, 14, 16)),
    (3, 3, 2, ()),  # no whole worker fits
])
def test_allowed_sizes(min_gpus, max_gpus, unit, expected):
    to_16 = ScalingCurve.of({1: 1.0, 16: 16.0})
    assert job_sizes(job("x", 10, 10, min_gpus=min_gpus, max_gpus=max_gpus, unit=unit, curve=to_16))[0] == expected


def test_edf_runs_the_earliest_deadline_that_can_still_be_met_first():
    a = job("a", 100, 100, requested_gpus=4)
    b = job("b", 100, 50, requested_gpus=4)
    edf = policies.get("edf-fixed")
    d = edf.decide(snapshot(nodes(4), a, b)).jobs
    assert (d["b"].gpus, d["a"].gpus, d["a"].verdict) == (4, 0, Verdict.PENDING)
    d = edf.decide(snapshot(nodes(4), a, b, now=60)).jobs  # b already missed its deadline
    assert (d["a"].gpus, d["b"].gpus) == (4, 0)


def test_least_attained_service_preempts_the_job_that_has_had_most():
    old = job("old", 100, 100, requested_gpus=4, attained_gpu_seconds=4000.0, placement={"n0": 4})
    new = job("new", 100, 100, requested_gpus=4, submit=10)
    d = policies.get("least-attained-service").decide(snapshot(nodes(4), old, new)).jobs
    assert d["new"].placement == {"n0": 4}
    assert d["old"].gpus == 0 and d["old"].reason.startswith("preempted;")


def test_fixed_size_baselines_backfill_behind_a_job_that_does_not_fit():
    big = job("big", 100, 10, requested_gpus=8)
    small = job("small", 100, 20, requested_gpus=2)
    d = policies.get("edf-fixed").decide(snapshot(nodes(4), big, small)).jobs
    assert (d["big"].gpus, d["small"].gpus) == (0, 2)


def test_registry():
    assert policies.names()[0] == policies.DEFAULT
    assert set(policies.names()) == {"elastic-deadline", "fifo-gang", "edf-fixed", "least-attained-service",
                                     "edf-elastic", "goodput-elastic"}
    for name in policies.names():
        assert policies.get(name).name == name
    with pytest.raises(ValueError, match="unknown policy 'nope'; known: elastic-deadline"):
        policies.get("nope")


def test_fifo_gang_runs_each_job_at_its_requested_size():
    first = job("first", 100, 100, min_gpus=1, requested_gpus=4)
    second = job("second", 100, 100, min_gpus=1, requested_gpus=8, submit=1)
    third = job("third", 100, 100, min_gpus=1, requested_gpus=2, submit=2)
    d = policies.get("fifo-gang").decide(snapshot(nodes(8), first, second, third)).jobs
    assert d["first"].gpus == 4 and "requested 4 GPUs" in d["first"].reason
    # second does not fit beside first: it blocks third (strict FIFO), although 2 GPUs are free.
    assert (d["second"].gpus, d["third"].gpus) == (0, 0) and "behind second" in d["third"].reason


def test_edf_elastic_gives_the_earliest_deadline_as_much_as_helps_then_the_next():
    peaked = ScalingCurve.of({1: 1.0, 2: 1.9, 4: 3.0, 6: 3.0})
    early = job("early", 1000, 100, max_gpus=8, curve=peaked)  # its curve stops rising at 4
    late = job("late", 1000, 500, max_gpus=8)
    gone = job("gone", 1000, 50, max_gpus=8)
    d = policies.get("edf-elastic").decide(snapshot(nodes(8), early, late, gone, now=60)).jobs
    assert (d["early"].gpus, d["late"].gpus, d["gone"].gpus) == (4, 4, 0)  # past its deadline: last


def test_goodput_elastic_gives_leftovers_to_the_highest_speedup_per_gpu():
    linear = job("linear", 10_000, 10_000, max_gpus=8, requested_gpus=1)
    flat = job("flat", 10_000, 10_000, max_gpus=8, requested_gpus=1, submit=1,
               curve=ScalingCurve.of({1: 1.0, 2: 1.2, 8: 1.3}))
    d = policies.get("goodput-elastic").decide(snapshot(nodes(8), linear, flat)).jobs
    # Both start at 1; every further GPU speeds linear up by 1x its rate, flat by at most 0.2x.
    assert (d["linear"].gpus, d["flat"].gpus) == (7, 1)


def test_elastic_baselines_do_not_grow_a_running_job_for_less_than_its_restore():
    # 100 steps left on 2 GPUs (50 s); 8 GPUs would take 12.5 s plus a 60 s restore.
    slow = job("a", 200, 1000, done=100, restore=60, placement={"n0": 2}, requested_gpus=2)
    for name in ("edf-elastic", "goodput-elastic"):
        assert policies.get(name).decide(snapshot(nodes(8), slow)).jobs["a"].placement == {"n0": 2}, name
