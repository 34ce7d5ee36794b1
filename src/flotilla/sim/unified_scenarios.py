"""Seeded scenarios for the unified-pool simulator: a diurnal day and a sudden burst.

Serving is OPT-13B on A100s (the shipped profile), chat-like lengths, SLO TTFT 400 ms /
TPOT 60 ms at 90%, 2-GPU prefill and 2-GPU decode instances. Training is the training
simulator's synthetic trace (sim.training_trace.generate), every job submitted within the
span (so training stays loaded to the end); the simulator judges the jobs whose deadline falls
within the span.

* diurnal: one compressed day; the rate follows mean * (1 - 0.5 cos(2 pi t / day)), a 3x
  peak-to-trough swing, with +-5% seeded noise per minute. The forecaster knows the curve
  (yesterday's), not the noise.
* burst: a steady rate that triples, unannounced, for the middle sixth of the span. The
  forecaster expects the steady rate.
"""

from __future__ import annotations

import math

import numpy as np

from flotilla.serving.planner import InstanceCapacities, instance_capacities
from flotilla.serving.shipped_profiles import OPT_13B_A100
from flotilla.serving.workload import SLO, Workload
from flotilla.sim.training_trace import generate
from flotilla.sim.unified import Scenario, ServingLoad

SCENARIOS = ("diurnal", "burst")
SWING = 0.5  # (1 + SWING) / (1 - SWING) = 3x peak to trough
NOISE = 0.05
BURST_FACTOR = 3.0
BURST_SHARE_OF_MEAN = 0.6  # the steady rate of the burst scenario, as a share of `mean_rate`
_SLO = SLO(ttft_ms=400.0, tpot_ms=60.0, attainment=0.9)


def _capacities() -> InstanceCapacities:
    workload = Workload.from_means(1.0, 180.0, 150.0)
    return instance_capacities(workload, _SLO, OPT_13B_A100, allow_colocated=False, prefill_gpus=2, decode_gpus=2)


def build(name: str, seed: int, gpus: int = 64, duration_s: float = 12 * 3600.0, mean_rate: float = 250.0,
          training_jobs: int = 120, training_load: float = 0.9) -> Scenario:
    """Scenario `name` (one of SCENARIOS), reproducible from `seed`."""
    if name not in SCENARIOS:
        raise ValueError(f"scenario: unknown {name!r}; choose from {', '.join(SCENARIOS)}")
    rng = np.random.default_rng(seed)
    minutes = int(duration_s // 60) + 2
    noise = 1 + NOISE * rng.uniform(-1, 1, size=minutes)
    if name == "diurnal":
        def curve(t: float) -> float:
            return mean_rate * (1 - SWING * math.cos(2 * math.pi * t / duration_s))

        def rate(t: float) -> float:
            return curve(t) * float(noise[min(int(t // 60), minutes - 1)])
        forecast = curve
        peak, mean = mean_rate * (1 + SWING) * (1 + NOISE), mean_rate
    else:
        base = mean_rate * BURST_SHARE_OF_MEAN
        start, end = duration_s * 5 / 12, duration_s * 7 / 12

        def rate(t: float) -> float:
            return base * (BURST_FACTOR if start <= t < end else 1.0)

        def forecast(t: float) -> float:
            return base
        peak = base * BURST_FACTOR
        mean = base * (1 + (BURST_FACTOR - 1) * (end - start) / duration_s)
    serving = ServingLoad("default/chat", rate, forecast, _capacities(), min_gpus=4, max_gpus=gpus,
                          gpus_per_instance=2)
    trace = generate(training_jobs, gpus, seed=seed, load=training_load)
    if trace[-1].submit < duration_s:
        raise ValueError(f"training_jobs: {training_jobs} jobs at load {training_load} arrive within "
                         f"{trace[-1].submit:.0f} s; the span needs more to stay loaded to its end")
    kept = tuple(j for j in trace if j.submit < duration_s)
    return Scenario(name, gpus, duration_s, kept, (serving,), (peak,), (mean,))
