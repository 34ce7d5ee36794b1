"""Re-planning: scale up fast, down slowly, never flap on noise."""

import random

import pytest

from flotilla.serving.planner import PlanRequest
from flotilla.serving.replan import ObservedWindow, ReplanPolicy, Replanner
from flotilla.serving.shipped_profiles import OPT_13B_A100
from flotilla.serving.workload import SLO, Workload

SLO_ = SLO(400.0, 60.0, 0.9)
POLICY = ReplanPolicy(headroom=0.3, scale_down_delay_s=300.0)
INTERVAL = 30.0


def make_replanner(rate: float, max_gpus: int = 64) -> Replanner:
    return Replanner.start(PlanRequest(Workload.from_means(rate, 300.0, 200.0), SLO_, OPT_13B_A100, min_gpus=1,
                                       max_gpus=max_gpus), POLICY)


def test_start_plans_for_the_rate_with_headroom():
    replanner = make_replanner(10.0)
    assert replanner.current.offered_rate == pytest.approx(13.0)
    assert replanner.current.predicted_goodput >= 13.0


def window(t: float, rate: float, attainment: float | None = None, requests: int = 0) -> ObservedWindow:
    return ObservedWindow(time=t, requests_per_second=rate, mean_prompt_tokens=300.0, mean_output_tokens=200.0,
                          attainment=attainment, requests=requests)


def test_noise_within_the_headroom_changes_nothing():
    replanner = make_replanner(20.0)
    rng = random.Random(1)
    start = replanner.current
    decisions = [replanner.observe(window(i * INTERVAL, 20.0 * rng.uniform(0.9, 1.1))) for i in range(1, 100)]
    assert [d for d in decisions if d.plan is not None] == []
    assert replanner.current is start


def test_rate_tripling_scales_up_at_the_next_window_and_back_down_once():
    replanner = make_replanner(10.0)
    before = replanner.current
    t = INTERVAL
    assert replanner.observe(window(t, 10.0)).plan is None
    t += INTERVAL
    up = replanner.observe(window(t, 30.0))
    assert up.plan is not None and up.reason.startswith("scale up")
    assert up.plan.gpus > before.gpus and up.plan.predicted_goodput >= 30.0 * (1 + POLICY.headroom) - 1e-6
    assert up.plan.reason == up.reason
    # Load falls back: nothing changes until the scale-down delay has passed, then one step down.
    changes = []
    for _ in range(100):
        t += INTERVAL
        decision = replanner.observe(window(t, 10.0))
        if decision.plan is not None:
            changes.append((t, decision))
    assert len(changes) == 1
    when, down = changes[0]
    assert when - (2 * INTERVAL) >= POLICY.peak_memory_s
    assert down.reason.startswith("scale down") and down.plan.gpus < up.plan.gpus


def test_a_dip_shorter_than_the_delay_keeps_the_plan():
    replanner = Replanner(make_replanner(30.0).template, make_replanner(30.0).current,
                          ReplanPolicy(headroom=0.3, scale_down_delay_s=300.0, peak_memory_s=300.0))
    t = 0.0
    for rate in [30.0] * 12 + [10.0] * 9 + [30.0] * 12:  # a 4.5-minute dip
        t += INTERVAL
        assert replanner.observe(window(t, rate)).plan is None


def test_recurring_bursts_keep_their_capacity():
    replanner = make_replanner(10.0)
    t, changes = 0.0, []
    for _ in range(6):  # a 3-minute burst at 3x every 15 minutes
        for rate in [30.0] * 6 + [10.0] * 24:
            t += INTERVAL
            decision = replanner.observe(window(t, rate))
            if decision.plan is not None:
                changes.append(decision.reason)
    assert len(changes) == 1 and changes[0].startswith("scale up")


def test_missed_attainment_adds_capacity_after_settling():
    replanner = make_replanner(10.0)
    first = replanner.current
    # Just after the plan took effect a missed window is blamed on the transition...
    assert replanner.observe(window(INTERVAL, 10.0, attainment=0.5, requests=300)).plan is None
    # ...later it is not; too few requests say nothing.
    assert replanner.observe(window(4 * INTERVAL, 10.0, attainment=0.5, requests=10)).plan is None
    decision = replanner.observe(window(5 * INTERVAL, 10.0, attainment=0.5, requests=300))
    assert decision.plan is not None and "attainment 0.500 below target 0.9" in decision.reason
    assert decision.plan.predicted_goodput > first.predicted_goodput


def test_budget_exhausted_reports_slo_at_risk_and_stays_put():
    replanner = make_replanner(5.0, max_gpus=4)
    up = replanner.observe(window(INTERVAL, 100.0))
    assert up.plan is not None and up.plan.slo_at_risk and up.plan.gpus <= 4
    again = replanner.observe(window(2 * INTERVAL, 100.0))
    assert again.plan is None and "best the budget allows" in again.reason


@pytest.mark.parametrize("rate", [5.0, 40.0])
def test_observing_the_planned_rate_keeps_the_plan(rate):
    replanner = make_replanner(rate)
    assert replanner.observe(window(INTERVAL, rate)).plan is None
