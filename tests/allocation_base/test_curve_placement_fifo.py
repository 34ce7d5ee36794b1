import pytest

from flotilla.allocation import ClusterSnapshot, JobState, NodeState, ScalingCurve, Verdict
from flotilla.allocation.fifo import FifoGang
from flotilla.allocation.placement import free_gpus, place


def test_curve_interpolates_never_extrapolates_up_and_scales_down_linearly():
    c = ScalingCurve.of({2: 2.0, 8: 5.0})
    assert c.rate(0) == 0 and c.rate(1) == 1.0 and c.rate(2) == 2.0
    assert c.rate(4) == pytest.approx(3.0) and c.rate(8) == 5.0 and c.rate(64) == 5.0
    assert c.seconds_for(10, 2) == 5.0 and c.seconds_for(10, 0) == float("inf")


@pytest.mark.parametrize("points,msg", [((), "at least one"), (((0, 1.0),), "> 0"),
                                        (((1, 1.0), (1, 2.0)), "same GPU count")])
def test_curve_rejects_bad_points(points, msg):
    with pytest.raises(ValueError, match=msg):
        ScalingCurve(points)


NODES = (NodeState("a", 8, labels={"flotilla.dev/nvlink-domain": "d0"}),
         NodeState("b", 8, labels={"flotilla.dev/nvlink-domain": "d0"}),
         NodeState("c", 8, labels={"flotilla.dev/nvlink-domain": "d1"}))


def test_place_prefers_the_tightest_single_node():
    assert place(4, 1, {"a": 8, "b": 4, "c": 6}, NODES) == {"b": 4}


def test_place_keeps_a_multi_node_job_in_one_domain_and_whole_workers():
    assert place(12, 4, {"a": 8, "b": 6, "c": 8}, NODES) == {"a": 8, "b": 4}
    assert place(12, 4, {"a": 3, "b": 3, "c": 3}, NODES) is None
    with pytest.raises(ValueError):
        place(3, 2, {"a": 8}, NODES)


def test_free_gpus_subtracts_placements_and_drops_unschedulable_nodes():
    nodes = NODES + (NodeState("d", 8, schedulable=False),)
    assert free_gpus(nodes, [{"a": 8}, {"b": 2}]) == {"b": 6, "c": 8}


def job(key, submit, min_gpus, placement=None, done=0):
    return JobState(key, submit, 1e9, 100, done, min_gpus, min_gpus * 2, 1, ScalingCurve.of({1: 1.0}),
                    placement=placement or {})


def test_fifo_is_strict_and_keeps_running_jobs_in_place():
    snap = ClusterSnapshot(0, NODES, (job("x", 0, 4, {"c": 4}), job("y", 1, 21), job("z", 2, 1)))
    d = FifoGang().decide(snap)
    assert d.jobs["x"].placement == {"c": 4}
    assert d.jobs["y"].verdict is Verdict.PENDING and "21 GPUs" in d.jobs["y"].reason
    assert d.jobs["z"].verdict is Verdict.PENDING and "behind y" in d.jobs["z"].reason


def test_fifo_replaces_a_job_whose_node_was_lost():
    nodes = (NODES[0], NodeState("c", 8, schedulable=False))
    d = FifoGang().decide(ClusterSnapshot(0, nodes, (job("x", 0, 4, {"c": 4}),)))
    assert d.jobs["x"].placement == {"a": 4} and "again" in d.jobs["x"].reason
