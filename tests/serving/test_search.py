"""The plan a deployment is offered (flotilla.serving.search): checked before it is promised."""

import time

import pytest

from flotilla.serving.check import check
from flotilla.serving.planner import PlanRequest, plan
from flotilla.serving.search import layout_of
from flotilla.serving.shipped_profiles import OPT_13B_A100
from flotilla.serving.workload import SLO, Workload

SLO_CHAT = SLO(200.0, 100.0, 0.9)


@pytest.mark.parametrize("rate, budget", [(3.0, 8), (12.0, 8), (30.0, 16)])
def test_an_offered_plan_holds_on_requests_it_was_not_checked_on(rate, budget):
    workload = Workload.from_means(rate, 300.0, 200.0)
    chosen = plan(PlanRequest(workload, SLO_CHAT, OPT_13B_A100, min_gpus=0, max_gpus=budget))
    assert not chosen.slo_at_risk and chosen.predicted_goodput == pytest.approx(rate)
    assert chosen.gpus <= budget and "checked at" in chosen.reason
    again = check(layout_of(chosen), OPT_13B_A100, workload, rate, SLO_CHAT, requests=4000, seed=99)
    assert again.attainment >= SLO_CHAT.attainment


def test_the_fewest_gpus_that_pass_are_offered():
    workload = Workload.from_means(12.0, 300.0, 200.0)
    chosen = plan(PlanRequest(workload, SLO_CHAT, OPT_13B_A100, min_gpus=0, max_gpus=8))
    smaller = plan(PlanRequest(workload, SLO_CHAT, OPT_13B_A100, min_gpus=0, max_gpus=chosen.gpus - 1))
    assert smaller.slo_at_risk  # nothing on fewer GPUs passed the check


def test_a_budget_too_small_is_at_risk_by_how_much():
    chosen = plan(PlanRequest(Workload.from_means(60.0, 300.0, 200.0), SLO_CHAT, OPT_13B_A100, min_gpus=0,
                              max_gpus=4))
    assert chosen.slo_at_risk and chosen.gpus <= 4
    assert 0 < chosen.predicted_goodput < 60.0
    short = 1 - chosen.predicted_goodput / 60.0
    assert chosen.reason.startswith(f"SLO at risk by {short:.0%}: 4 GPUs meet at most")


def test_checks_that_run_out_do_not_spend_the_whole_budget():
    # At 107.9 req/s on 64 GPUs the eight checks fail on layouts of 14-16 GPUs and ban each kind after two
    # failures; the plan then was the most the budget offers (18 + 23x2 GPUs: 64) where 16 serve the rate.
    rate = 2.0 + 118.0 * 35 / 39  # one of bench/serving.py's plan-time rates
    chosen = plan(PlanRequest(Workload.from_means(rate, 300.0, 200.0), SLO(400.0, 60.0, 0.9), OPT_13B_A100,
                              min_gpus=0, max_gpus=64))
    assert not chosen.slo_at_risk and chosen.gpus <= 24, chosen.reason
    assert "estimated to serve it with room" in chosen.reason


def test_min_gpus_and_pins_are_honoured():
    workload = Workload.from_means(3.0, 300.0, 200.0)
    chosen = plan(PlanRequest(workload, SLO_CHAT, OPT_13B_A100, min_gpus=4, max_gpus=8))
    assert chosen.gpus >= 4
    pinned = plan(PlanRequest(workload, SLO_CHAT, OPT_13B_A100, min_gpus=0, max_gpus=8, prefill_gpus=2,
                              decode_gpus=1))
    assert (pinned.mode, pinned.prefill_gpus_per_instance, pinned.decode_gpus_per_instance) == ("disaggregated", 2, 1)


def test_plan_time_including_the_check():
    # the bound is a p99 under 1 s of wall time on an idle core; CPU time is what this
    # shared machine can measure fairly
    workload = Workload.from_means(40.0, 300.0, 200.0)
    times = []
    for rate in (5.0, 20.0, 40.0):
        start = time.process_time()
        plan(PlanRequest(workload.at_rate(rate), SLO(400.0, 60.0, 0.9), OPT_13B_A100, min_gpus=0, max_gpus=64))
        times.append(time.process_time() - start)
    assert max(times) < 1.5, times
