"""The arbiter on small hand-checked cases (2 nodes of 8 GPUs, 1 step/s per GPU)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from flotilla.allocation import ClusterSnapshot, JobState, NodeState, ScalingCurve, Verdict
from flotilla.allocation.elastic import DeadlineElastic
from flotilla.pool import PoolDecision, PoolPolicy, PoolSnapshot, ServingState, decide

LINEAR = ScalingCurve.of({1: 1.0, 16: 16.0})
NODES = (NodeState("n0", 8), NodeState("n1", 8))
NO_HEADROOM = PoolPolicy(forecast_headroom=0.0, hold_down_seconds=300.0)


def job(name: str, remaining: int, deadline: float, placement: dict[str, int], restore: float = 30.0,
        verdict: Verdict | None = Verdict.ADMITTED, **extra) -> JobState:
    return JobState(key=f"default/{name}", submit_time=0.0, deadline=deadline, total_steps=remaining, done_steps=0,
                    min_gpus=1, max_gpus=12, gpus_per_worker=1, curve=LINEAR, restore_seconds=restore,
                    placement=placement, verdict=verdict, **extra)


def chat(demand: int, placement: dict[str, int], max_gpus: int = 12, **extra) -> ServingState:
    return ServingState("default/chat", demand_gpus=demand, min_gpus=4, max_gpus=max_gpus, gpus_per_instance=4,
                        placement=placement, **extra)


# llama-ft: 3000 steps by 1050 s, less the 30 s restore its shrink from 8 costs and the 15 s (half a restore)
# admission keeps in hand -> 3 steps/s -> guaranteed 3 GPUs (any whole-worker count, not rounded up to 4);
# holds 8.
LLAMA = job("llama-ft", 3000, 1050.0, {"n0": 8}, restore=30.0)
# resnet: 3000 steps by 1060 s less a 60 s restore -> guaranteed 4 GPUs; holds 4 (no surplus).
RESNET = job("resnet", 3000, 1060.0, {"n1": 4}, restore=60.0)


def assert_realisable(snapshot: PoolSnapshot, decision: PoolDecision) -> None:
    """No node over its usable GPUs, neither after the shrink step nor at the end."""
    usable = {n.name: n.usable_gpus for n in snapshot.nodes}
    finals = [d.placement for d in decision.jobs.values()] + [d.placement for d in decision.serving.values()]
    for stage in (list(decision.transition.interim.values()), finals):
        per_node: dict[str, int] = {}
        for placement in stage:
            for node, g in placement.items():
                per_node[node] = per_node.get(node, 0) + g
        for node, g in per_node.items():
            assert g <= usable[node], (node, g, stage)


def test_burst_met_from_one_jobs_surplus():
    snap = PoolSnapshot(0.0, NODES, (LLAMA, RESNET), (chat(8, {"n1": 4}),))
    d = decide(snap, NO_HEADROOM)
    assert d.serving["default/chat"].placement == {"n1": 4, "n0": 4}
    assert d.jobs["default/llama-ft"].placement == {"n0": 4}
    assert d.jobs["default/resnet"].placement == {"n1": 4}
    assert [(loan.job, loan.serving, loan.gpus, loan.from_guarantee) for loan in d.loans] == [
        ("default/llama-ft", "default/chat", 4, False)]
    assert "lent 4 GPUs to sd/chat" in d.jobs["default/llama-ft"].reason
    assert "borrowed 4 GPUs from tj/llama-ft" in d.serving["default/chat"].reason
    assert d.jobs["default/llama-ft"].guaranteed_gpus == 3
    # Shrink llama-ft first (checkpoint), then start chat's new instance on the freed GPUs.
    assert d.transition.shrink == ("tj/default/llama-ft",)
    assert d.transition.grow == ("sd/default/chat",)
    assert d.transition.interim["tj/default/llama-ft"] == {"n0": 4}
    assert_realisable(snap, d)


def test_the_cheapest_shrink_lends():
    # Both jobs have 4 GPUs of surplus; resnet's shrink costs less: no restore, nothing since its checkpoint,
    # while llama-ft would lose 30 s of restore and 200 steps of work.
    llama = replace(LLAMA, done_steps=200, total_steps=3200)
    resnet = replace(RESNET, placement={"n1": 8}, restore_seconds=0.0)
    snap = PoolSnapshot(0.0, (NodeState("n0", 8), NodeState("n1", 8), NodeState("n2", 4)), (llama, resnet),
                        (chat(8, {"n2": 4}),))
    d = decide(snap, NO_HEADROOM)
    assert [(loan.job, loan.gpus) for loan in d.loans] == [("default/resnet", 4)]
    assert d.jobs["default/llama-ft"].placement == {"n0": 8}
    assert_realisable(snap, d)


def test_burst_that_would_break_a_guarantee_is_refused_by_policy():
    snap = PoolSnapshot(0.0, NODES, (LLAMA, RESNET), (chat(12, {"n1": 4}),))
    d = decide(snap, NO_HEADROOM)
    sd = d.serving["default/chat"]
    assert sd.gpus == 8 and sd.demanded == 12
    assert "short 4 GPUs: taking them would break the guaranteed share of tj/llama-ft, tj/resnet" in sd.reason
    assert d.jobs["default/llama-ft"].gpus == 3 and d.jobs["default/resnet"].gpus == 4
    assert all(not loan.from_guarantee for loan in d.loans)
    assert_realisable(snap, d)


def test_policy_may_take_a_guaranteed_share_and_says_so():
    snap = PoolSnapshot(0.0, NODES, (LLAMA, RESNET), (chat(12, {"n1": 4}),))
    d = decide(snap, replace(NO_HEADROOM, borrow_guaranteed=True))
    assert d.serving["default/chat"].gpus == 12
    # llama-ft is the cheaper one to stop (30 s x 4 GPUs against 60 s x 4 GPUs).
    llama = d.jobs["default/llama-ft"]
    assert llama.gpus == 0 and llama.guaranteed_gpus == 0
    assert "by policy borrowGuaranteed: its deadline is no longer guaranteed" in llama.reason
    assert d.jobs["default/resnet"].gpus == 4
    assert [loan.from_guarantee for loan in d.loans] == [False, True]
    assert_realisable(snap, d)


def test_give_back_waits_for_the_hold_down():
    # 12 GPUs: chat borrowed half of n0 from llama-ft and holds all of n1; its demand falls to 4.
    nodes = (NodeState("n0", 8), NodeState("n1", 4))
    llama = replace(LLAMA, placement={"n0": 4}, total_steps=2000)
    lent = chat(4, {"n0": 4, "n1": 4})
    first = decide(PoolSnapshot(100.0, nodes, (llama,), (lent,)), NO_HEADROOM)
    sd = first.serving["default/chat"]
    assert sd.gpus == 8 and sd.below_since == 100.0 and "through the hold-down (gives back 4 once demand has stayed below for 300 s)" in sd.reason

    # Demand comes back before the hold-down ends: the clock restarts, nothing flaps.
    back = decide(PoolSnapshot(250.0, nodes, (llama,), (replace(lent, demand_gpus=8, below_since=100.0),)),
                  NO_HEADROOM)
    assert back.serving["default/chat"].below_since is None and back.serving["default/chat"].gpus == 8
    assert back.jobs["default/llama-ft"].gpus == 4

    during = decide(PoolSnapshot(399.0, nodes, (llama,), (replace(lent, below_since=100.0),)), NO_HEADROOM)
    assert during.serving["default/chat"].gpus == 8 and during.jobs["default/llama-ft"].gpus == 4

    snap = PoolSnapshot(400.0, nodes, (llama,), (replace(lent, below_since=100.0),))
    after = decide(snap, NO_HEADROOM)
    assert after.serving["default/chat"].placement == {"n1": 4}
    assert after.serving["default/chat"].below_since is None
    assert "gives back 4 GPUs" in after.serving["default/chat"].reason
    assert after.jobs["default/llama-ft"].placement == {"n0": 8}
    assert after.transition.shrink == ("sd/default/chat",)
    assert after.transition.grow == ("tj/default/llama-ft",)
    assert_realisable(snap, after)


def test_node_failure_during_a_loan():
    # chat borrowed n1 earlier; n1 fails. It finds 4 GPUs again in llama-ft's surplus, and no more.
    nodes = (NodeState("n0", 8), NodeState("n1", 8, schedulable=False))
    snap = PoolSnapshot(0.0, nodes, (LLAMA,), (chat(8, {"n1": 8}),))
    d = decide(snap, NO_HEADROOM)
    sd = d.serving["default/chat"]
    assert sd.placement == {"n0": 4}
    assert "lost 8 GPUs on unschedulable nodes" in sd.reason
    assert "short 4 GPUs" in sd.reason and "tj/llama-ft" in sd.reason
    assert d.jobs["default/llama-ft"].placement == {"n0": 3}  # its guaranteed share
    assert d.transition.interim["sd/default/chat"] == {}
    assert "sd/default/chat" in d.transition.shrink and "sd/default/chat" in d.transition.grow
    assert_realisable(snap, d)


@pytest.mark.parametrize("forecast, verdict", [((), Verdict.ADMITTED), (((500.0, 12),), Verdict.REJECTED)])
def test_admission_counts_the_serving_forecast(forecast, verdict):
    # 12 GPUs from now to 1000 s meet the new job's deadline; a forecast peak of 12 serving GPUs from 500 s
    # leaves it 4, so it is refused rather than broken later.
    new = job("new", 12000, 1000.0, {}, restore=0.0, verdict=None)
    snap = PoolSnapshot(0.0, NODES, (new,), (chat(4, {"n1": 4}, forecast=forecast),))
    d = decide(snap, NO_HEADROOM)
    assert d.jobs["default/new"].verdict is verdict
    assert_realisable(snap, d)


def test_serving_stays_within_max_gpus_and_whole_instances():
    snap = PoolSnapshot(0.0, NODES, (), (chat(14, {}, max_gpus=12),))
    d = decide(snap, NO_HEADROOM)
    assert d.serving["default/chat"].gpus == 12 and d.serving["default/chat"].demanded == 12


@pytest.mark.parametrize("values, message", [
    ({"holdDownSeconds": -1}, "holdDownSeconds must be >= 0"),
    ({"forecastHeadroom": "lots"}, "forecastHeadroom must be a number"),
    ({"borrowGuaranteed": "yes"}, "borrowGuaranteed must be true or false"),
    ({"holdDown": 3}, "unknown key(s) holdDown"),
])
def test_policy_errors_name_the_field(values, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        PoolPolicy.from_mapping(values)


def test_policy_from_mapping():
    assert PoolPolicy.from_mapping({"holdDownSeconds": 60, "borrowGuaranteed": True}) == PoolPolicy(
        hold_down_seconds=60, borrow_guaranteed=True)


@pytest.mark.parametrize("claimed, verdict", [
    ((), Verdict.REJECTED),  # 8 GPUs x 1000 s = 8000 steps < 11000
    (((500.0, -8),), Verdict.ADMITTED),  # 8 more GPUs from 500 s: 4000 + 16 x 500 = 12000 steps
    (((0.0, 4), (500.0, -8)), Verdict.REJECTED),  # 4 x 500 + 16 x 500 = 10000 steps
])
def test_elastic_admission_counts_claims_over_time(claimed, verdict):
    new = replace(job("new", 11000, 1000.0, {}, restore=0.0, verdict=None), max_gpus=16)
    decision = DeadlineElastic().decide(ClusterSnapshot(0.0, (NodeState("n0", 8),), (new,), claimed))
    assert decision.jobs["default/new"].verdict is verdict
