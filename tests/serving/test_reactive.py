"""The reactive (HPA-like) baseline of bench/serving.py: a pool scaled on the engines' own gauges."""

from flotilla.serving.planner import Plan
from flotilla.sim.serving import ReactivePolicy, ReactiveSettings

SHAPE = Plan("disaggregated", 2, 1, 3, 1, 0, 0, 10.0, 10.0, False, "shape")


def _policy(budget: int = 16) -> ReactivePolicy:
    return ReactivePolicy(SHAPE, SHAPE, budget, ReactiveSettings(waiting_target=2.0, kv_target=0.5))


def test_a_pool_over_its_target_scales_up_at_once_and_down_only_after_the_stabilization_window():
    policy = _policy()
    assert policy.initial_plan().prefill_replicas == 2
    policy.observe_pools(15.0, {"prefill": [(6, 0.0), (6, 0.0)], "decode": [(0, 0.5)] * 3})
    plan = policy.on_window(None)  # type: ignore[arg-type]
    assert plan is not None and plan.prefill_replicas == 6 and plan.decode_replicas == 3  # 2 * 6/2
    policy.observe_pools(30.0, {"prefill": [(0, 0.0)] * 6, "decode": [(0, 0.5)] * 3})
    assert policy.on_window(None) is None  # type: ignore[arg-type]  # scale-down waits for the window
    for t in range(45, 360, 15):
        policy.observe_pools(float(t), {"prefill": [(0, 0.0)] * 6, "decode": [(0, 0.2)] * 3})
    plan = policy.on_window(None)  # type: ignore[arg-type]
    assert plan is not None and plan.prefill_replicas == 1 and plan.decode_replicas == 2


def test_within_the_tolerance_nothing_changes_and_the_budget_bounds_the_pools():
    policy = _policy()
    policy.observe_pools(15.0, {"prefill": [(2, 0.0), (2, 0.0)], "decode": [(0, 0.53)] * 3})
    assert policy.on_window(None) is None  # type: ignore[arg-type]
    small = _policy(budget=6)
    small.observe_pools(15.0, {"prefill": [(40, 0.0)] * 2, "decode": [(0, 1.0)] * 3})
    plan = small.on_window(None)  # type: ignore[arg-type]
    assert plan is not None and plan.prefill_replicas + plan.decode_replicas <= 6
