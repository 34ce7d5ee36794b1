"""The unified-pool simulator: a hand-checked loan, the static partitions, scenarios, errors, the command."""

from __future__ import annotations

import json

import pytest

from flotilla import cli
from flotilla.allocation import ScalingCurve
from flotilla.sim.training_trace import TraceJob
from flotilla.sim.unified import POLICIES, Scenario, ServingLoad, simulate
from flotilla.sim.unified_scenarios import _capacities, build

HOUR = 3600.0


def step_load(low: float, high: float, start: float, end: float) -> ServingLoad:
    def rate(t: float) -> float:
        return high if start <= t < end else low

    # 2-GPU prefill + 2-GPU decode instances of OPT-13B: a prefill instance serves about 75 req/s, a
    # decode instance about 31.
    return ServingLoad("default/chat", rate, lambda t: low, _capacities(), min_gpus=4, max_gpus=16,
                       gpus_per_instance=2)


def one_job_scenario() -> Scenario:
    # 16 GPUs; one elastic job (1..12 GPUs, 1 step/s per GPU) that needs 7.2 GPUs over its 3 hours (a
    # guaranteed share of 8); serving needs 4 GPUs, then 8 (1 prefill + 3 decode) for the second hour.
    job = TraceJob("tj", submit=0.0, total_steps=int(7.2 * 3 * HOUR), requested_gpus=8, min_gpus=1, max_gpus=12,
                   gpus_per_worker=1, deadline=3 * HOUR, curve=ScalingCurve.of({1: 1.0, 16: 16.0}),
                   restore_seconds=30.0)
    serving = step_load(20.0, 65.0, HOUR, 2 * HOUR)
    assert serving.demand_at(20.0) == 4 and serving.demand_at(65.0) == 8
    return Scenario("step", 16, 3 * HOUR, (job,), (serving,), peak_rates=(65.0,), mean_rates=(35.0,))


def test_a_serving_step_borrows_once_from_training_and_gives_back():
    unified = simulate(one_job_scenario(), "unified", step_s=60.0)
    # The job shrinks 12 -> 8 once for the step; growing back after the hold-down is no shrink.
    assert unified.checkpoint_shrinks == 1
    assert unified.deadline_ratio == 1.0
    assert unified.slo_attainment == pytest.approx(1.0)
    # Serving holds 4 GPUs, 8 during the step and through the 300 s hold-down after it.
    assert unified.serving_gpus_mean == pytest.approx((4 * 2 * HOUR + 8 * HOUR + 4 * 300) / (3 * HOUR), abs=0.05)

    peak = simulate(one_job_scenario(), "static-peak", step_s=60.0)
    assert peak.checkpoint_shrinks == 0 and peak.serving_gpus_mean == 8 and peak.slo_attainment == 1.0
    # Both finish the job and serve every request: the same useful GPU-seconds in the same span.
    assert unified.utilisation == pytest.approx(peak.utilisation)

    mean = simulate(one_job_scenario(), "static-mean", step_s=60.0)
    # Sized for 35 req/s (1 prefill + 2 decode, about 62 req/s): during the step it serves 62 of 65 req/s.
    assert mean.serving_gpus_mean == 6
    assert 0.9 < mean.slo_attainment < 1.0


def test_scenarios_are_seeded_and_static_peak_meets_the_peak():
    small = dict(gpus=32, duration_s=2 * HOUR, mean_rate=100.0, training_jobs=150, training_load=1.0)
    for name in ("diurnal", "burst"):
        scenario = build(name, seed=7, **small)
        results = {p: simulate(scenario, p, step_s=300.0) for p in POLICIES}
        assert results["static-peak"].slo_attainment == 1.0
        assert results["static-mean"].slo_attainment < 1.0
        assert simulate(build(name, seed=7, **small), "unified", step_s=300.0) == results["unified"]


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="policy: unknown 'lyra'"):
        simulate(one_job_scenario(), "lyra")
    with pytest.raises(ValueError, match="scenario: unknown 'weekly'"):
        build("weekly", seed=1)
    with pytest.raises(ValueError, match="training_jobs"):
        build("diurnal", seed=1, training_jobs=5)


def test_command_prints_one_result_per_policy(capsys):
    code = cli.main(["simulate-unified", "--scenario", "diurnal", "--gpus", "32", "--hours", "1", "--rate", "100",
                     "--training-jobs", "100", "--json"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0 and [r["policy"] for r in lines] == list(POLICIES)
    assert cli.main(["simulate-unified", "--scenario", "burst", "--hours", "0"]) == 2
    assert "--hours: must be > 0" in capsys.readouterr().out
