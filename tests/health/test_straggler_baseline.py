"""A straggler is judged against what its rank did before the fault: no flapping, the slowdown stated truly."""

import numpy as np
import pytest

from flotilla.health.monitor import HealthMonitor
from flotilla.health.samples import Sample

STAGES, REPLICAS = 3, 3


def run(slow: float, *, roles: bool = True, seconds: int = 420, start: int = 150, end: int = 10**9,
        seed: int = 0) -> list:
    """A 3-stage pipeline, three machines per stage, one rank per machine; the last stage computes 12 % longer.
    Machine n4 (a middle stage) is `slow` slower from `start` on."""
    rng = np.random.default_rng(seed)
    m = HealthMonitor()
    out = []
    for t in range(seconds):
        for i in range(STAGES * REPLICAS):
            stage, node = i % STAGES, f"n{i}"
            now = t + 0.05 * i
            step = 1.0 * (1.12 if stage == STAGES - 1 else 1.0) * np.exp(rng.normal(0, 0.02))
            if node == "n4" and start <= t < end:
                step *= 1 + slow
            role = f"pp{stage}/{STAGES}" if roles else None
            batch = [Sample(now, node, "heartbeat", 1.0, "j"),
                     Sample(now, node, "gpu_util", 95.0 + rng.normal(0, 1), "j", 0, role),
                     Sample(now, node, "step_time", step, "j", 0, role, i)]
            out += m.observe(batch, now)
    return out


@pytest.mark.parametrize("slow, roles", [(0.08, True), (0.25, True), (0.25, False)])
def test_a_straggler_in_a_three_machine_stage_is_flagged_once_and_its_slowdown_is_stated(slow, roles):
    out = [d for d in run(slow, roles=roles) if d.reason == "slow-rank"]
    assert [(d.node, d.state) for d in out] == [("n4", "confirmed")]
    assert out[0].ts >= 150
    assert out[0].evidence["slowdown"] == pytest.approx(slow, abs=0.03)
    assert out[0].evidence["basis"] in ("role-peers", "own-history")


def test_the_slow_machine_clears_once_it_is_fast_again_and_nothing_else_is_flagged():
    out = run(0.25, seconds=480, end=360)
    assert [(d.node, d.reason, d.state) for d in out] == [("n4", "slow-rank", "confirmed"), ("n4", "slow-rank", "cleared")]
    assert out[1].ts > 360
