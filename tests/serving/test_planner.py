"""The planner's search against brute-force enumeration, and its choices on the shipped profile."""

import itertools
import random

import pytest

from flotilla.serving.planner import InstanceCapacities, PlanRequest, plan, plan_capacity, plan_from_capacities
from flotilla.serving.shipped_profiles import OPT_13B_A100
from flotilla.serving.workload import SLO, Workload


def brute_force(caps: InstanceCapacities, rate: float, max_gpus: int) -> tuple[int, float]:
    """(GPUs, capacity) of the best layout: fewest GPUs meeting the rate (ties: more capacity),
    else the most capacity within the budget."""
    layouts = []
    for (gp, cp), (gd, cd) in itertools.product(caps.prefill.items(), caps.decode.items()):
        for n_p in range(1, max_gpus // gp + 1):
            for n_d in range(1, (max_gpus - n_p * gp) // gd + 1):
                layouts.append((n_p * gp + n_d * gd, min(n_p * cp, n_d * cd)))
    for g, c in caps.colocated.items():
        layouts += [(n * g, n * c) for n in range(1, max_gpus // g + 1)]
    meeting = [lay for lay in layouts if lay[1] >= rate]
    if meeting:
        return min(meeting, key=lambda lay: (lay[0], -lay[1]))
    return max(layouts, key=lambda lay: (lay[1], -lay[0]))


CASES = [
    # prefill caps, decode caps, colocated caps, rate, max GPUs
    ({1: 10.0}, {1: 4.0}, {}, 11.0, 16),  # 1 prefill : 3 decode
    ({1: 10.0, 2: 24.0}, {1: 4.0, 2: 9.0}, {1: 3.5}, 20.0, 16),
    ({2: 7.0, 4: 15.0}, {2: 6.0, 4: 11.0}, {2: 3.0, 4: 8.0}, 30.0, 24),
    ({1: 5.0}, {1: 5.0}, {1: 4.0}, 3.0, 4),  # one colocated GPU is enough
    ({1: 10.0}, {1: 4.0}, {}, 50.0, 8),  # over budget: at risk
    ({1: 10.0, 2: 12.0}, {1: 2.0, 2: 5.0}, {1: 1.5, 2: 4.0}, 100.0, 12),  # over budget, mixed sizes
]


@pytest.mark.parametrize("prefill, decode, colocated, rate, max_gpus", CASES)
def test_search_matches_enumeration(prefill, decode, colocated, rate, max_gpus):
    caps = InstanceCapacities(prefill, decode, colocated)
    chosen = plan_from_capacities(caps, rate, 0, max_gpus)
    gpus, capacity = brute_force(caps, rate, max_gpus)
    assert (chosen.gpus, chosen.predicted_goodput) == (gpus, pytest.approx(capacity))
    assert plan_capacity(chosen, caps) == pytest.approx(chosen.predicted_goodput)
    assert chosen.slo_at_risk == (capacity < rate)
    if chosen.slo_at_risk:
        assert chosen.reason.startswith(f"SLO at risk: {max_gpus} GPUs meet at most")


def test_search_matches_enumeration_on_random_cases():
    rng = random.Random(4)
    for _ in range(200):
        degrees = sorted(rng.sample([1, 2, 4, 8], rng.randint(1, 3)))
        caps = InstanceCapacities({g: rng.uniform(1, 10) * g for g in degrees},
                                  {g: rng.uniform(0.5, 5) * g for g in degrees},
                                  {g: rng.uniform(0.3, 4) * g for g in degrees if rng.random() < 0.5})
        rate, max_gpus = rng.uniform(0.5, 60), rng.randint(max(degrees) * 2, 24)
        chosen = plan_from_capacities(caps, rate, 0, max_gpus)
        gpus, capacity = brute_force(caps, rate, max_gpus)
        assert (chosen.gpus, chosen.predicted_goodput) == (gpus, pytest.approx(capacity)), (caps, rate, max_gpus)


def test_min_gpus_adds_capacity_to_the_bottleneck():
    caps = InstanceCapacities({1: 10.0}, {1: 4.0}, {})
    chosen = plan_from_capacities(caps, 3.0, 6, 16)
    assert chosen.gpus == 6
    assert (chosen.prefill_replicas, chosen.decode_replicas) == (2, 4)  # 20 vs 16 req/s: balanced
    assert chosen.predicted_goodput == pytest.approx(16.0)


@pytest.mark.parametrize("tpot_ms, router, mode", [(100.0, "queue+kv", "colocated"), (25.0, "queue+kv", "disaggregated"),
                                                     (25.0, "queue", "disaggregated")])
def test_colocated_wins_at_loose_tpot_and_disaggregation_at_tight(tpot_ms, router, mode):
    # Behind a router that balances KV-cache use, colocated replicas share the load; behind the queue-depth
    # router alone the first replicas take it (flotilla.serving.check), and the search weighs that.
    chosen = plan(PlanRequest(Workload.from_means(20.0, 300.0, 200.0), SLO(400.0, tpot_ms, 0.9),
                              OPT_13B_A100, min_gpus=0, max_gpus=64, router=router))
    assert chosen.mode == mode
    assert not chosen.slo_at_risk and chosen.predicted_goodput >= 20.0
    assert chosen.reason.startswith(f"{chosen.describe()} checked at 20.00 req/s")


def test_budget_too_small_is_flagged_with_the_rate_it_meets():
    chosen = plan(PlanRequest(Workload.from_means(200.0, 300.0, 200.0), SLO(400.0, 60.0, 0.9),
                              OPT_13B_A100, min_gpus=0, max_gpus=8))
    assert chosen.slo_at_risk and chosen.gpus <= 8
    assert 0 < chosen.predicted_goodput < 200.0
    assert f"{chosen.predicted_goodput:.2f} req/s of the 200.00 offered" in chosen.reason


def test_pinned_gpus_per_instance_are_respected():
    chosen = plan(PlanRequest(Workload.from_means(20.0, 300.0, 200.0), SLO(400.0, 25.0, 0.9), OPT_13B_A100,
                              min_gpus=0, max_gpus=64, prefill_gpus=2, decode_gpus=2))
    assert (chosen.mode, chosen.prefill_gpus_per_instance, chosen.decode_gpus_per_instance) == ("disaggregated", 2, 2)
    with pytest.raises(ValueError, match="prefill.gpusPerInstance"):
        plan(PlanRequest(Workload.from_means(20.0, 300.0, 200.0), SLO(400.0, 25.0, 0.9), OPT_13B_A100,
                         min_gpus=0, max_gpus=64, prefill_gpus=3))


@pytest.mark.parametrize("kwargs, message", [
    ({"min_gpus": 4, "max_gpus": 2}, "maxGPUs"),
    ({"min_gpus": -1, "max_gpus": 2}, "minGPUs"),
])
def test_bad_bounds_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PlanRequest(Workload.from_means(1.0, 10.0, 10.0), SLO(400.0, 60.0, 0.9), OPT_13B_A100, **kwargs)


def test_budget_below_one_instance_is_an_error():
    with pytest.raises(ValueError, match="maxGPUs: 1 GPUs cannot hold one instance"):
        plan_from_capacities(InstanceCapacities({2: 5.0}, {2: 5.0}, {}), 1.0, 0, 1)


def test_a_configuration_outside_the_prediction_tolerance_is_not_offered():
    from dataclasses import replace

    from flotilla.serving.planner import instance_capacities
    from flotilla.serving.validation import PREDICTION_TOLERANCE

    workload = Workload.from_means(6.0, 300.0, 200.0)
    slo = SLO(400.0, 60.0, 0.9)
    everything = instance_capacities(workload, slo, replace(OPT_13B_A100, prediction_errors=()))
    assert set(everything.colocated) == {1, 2, 4} and set(everything.prefill) == {1, 2, 4}
    mis = replace(OPT_13B_A100, prediction_errors=(("colocated", 4, PREDICTION_TOLERANCE + 0.52),
                                                   ("prefill", 2, -(PREDICTION_TOLERANCE + 0.01)),
                                                   ("decode", 1, PREDICTION_TOLERANCE)))
    caps = instance_capacities(workload, slo, mis)
    assert set(caps.colocated) == {1, 2} and set(caps.prefill) == {1, 4} and set(caps.decode) == {1, 2, 4}
    chosen = plan(PlanRequest(workload.at_rate(20.0), slo, mis, min_gpus=4, max_gpus=4))
    assert (chosen.mode, chosen.colocated_gpus_per_instance) != ("colocated", 4)
    with pytest.raises(ValueError, match="prefill.gpusPerInstance: .* offers no prefill configuration of 2 GPUs"):
        plan(PlanRequest(workload, slo, mis, min_gpus=1, max_gpus=8, prefill_gpus=2))


def test_the_shipped_profile_offers_only_validated_configurations():
    from flotilla.serving.validation import PREDICTION_TOLERANCE, offered

    errors = OPT_13B_A100.errors
    assert {(kind, g) for kind in ("prefill", "decode", "colocated") for g in (1, 2, 4)} <= set(errors)
    caps = instance_capacities_for_shipped()
    for kind, table in (("prefill", caps.prefill), ("decode", caps.decode), ("colocated", caps.colocated)):
        assert set(table) == {g for g in (1, 2, 4) if abs(errors[(kind, g)]) <= PREDICTION_TOLERANCE}
        assert all(offered(errors, kind, g) for g in table)


def instance_capacities_for_shipped():
    from flotilla.serving.planner import instance_capacities

    return instance_capacities(Workload.from_means(6.0, 300.0, 200.0), SLO(400.0, 60.0, 0.9), OPT_13B_A100)
