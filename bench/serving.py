"""Goodput per GPU of the adaptive PD planner against static baselines, on seeded traces.

For each of three traces (steady, bursty, diurnal load; ShareGPT-like chat lengths; OPT-13B on A100
profile) every policy is simulated with the same GPU budget, sized so that the static baselines meet
the SLO at the peak. Goodput counts requests that meet both TTFT and TPOT; goodput per GPU divides
it by the GPUs held on average (the adaptive planner hands GPUs back when the load falls). Ratios are
adaptive / baseline, per trace and as a geometric mean over the traces. Planner decision time is the
median of `plan()` calls for a 64-GPU budget.

    python bench/serving.py --quick     # about 10 s; last line is the JSON summary
    python bench/serving.py             # longer, busier traces
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout

from flotilla.serving.planner import PlanRequest, plan
from flotilla.serving.shipped_profiles import OPT_13B_A100
from flotilla.serving.workload import SLO, Workload
from flotilla.sim.serving import POLICIES, simulate
from flotilla.sim.serving_trace import generate

SLO_TARGET = SLO(ttft_ms=400.0, tpot_ms=60.0, attainment=0.9)
BASELINES = [p for p in POLICIES if p != "adaptive"]
ARRIVALS = ("steady", "bursty", "diurnal", "step")


def plan_time_ms(repeats: int) -> float:
    request = PlanRequest(Workload.from_means(120.0, 300.0, 200.0), SLO_TARGET, OPT_13B_A100,
                          min_gpus=0, max_gpus=64)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        plan(request)
        times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short traces (finishes well within 60 s)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rate, duration, budget = (8.0, 1200.0, 6) if args.quick else (20.0, 7200.0, 16)

    ratios: dict[str, list[float]] = {b: [] for b in BASELINES}
    attainments = []
    print(f"profile {OPT_13B_A100.name}, SLO TTFT {SLO_TARGET.ttft_ms:g} ms / TPOT {SLO_TARGET.tpot_ms:g} ms "
          f"at {SLO_TARGET.attainment:g}, mean rate {rate:g} req/s, {duration:g} s, budget {budget} GPUs")
    print(f"{'trace':8} {'policy':12} {'attain':>7} {'goodput':>8} {'GPUs':>6} {'gp/GPU':>7} "
          f"{'TTFT p90':>9} {'TPOT p90':>9} {'changes':>7}")
    for i, arrival in enumerate(ARRIVALS):
        trace = generate(arrival, "chat", rate, duration, args.seed + i)
        results = {p: simulate(trace, OPT_13B_A100, SLO_TARGET, budget, p) for p in POLICIES}
        for policy, r in results.items():
            print(f"{arrival:8} {policy:12} {r.attainment:7.3f} {r.goodput:8.2f} {r.mean_gpus:6.2f} "
                  f"{r.goodput_per_gpu:7.3f} {r.ttft_p90_ms:9.0f} {r.tpot_p90_ms:9.1f} {r.plan_changes:7d}")
        adaptive = results["adaptive"]
        attainments.append(adaptive.attainment)
        for baseline in BASELINES:
            ratios[baseline].append(adaptive.goodput_per_gpu / results[baseline].goodput_per_gpu)
        print(f"{arrival:8} adaptive goodput/GPU vs " + ", ".join(
            f"{b} {ratios[b][-1]:.2f}x" for b in BASELINES))

    plan_ms = plan_time_ms(5 if args.quick else 20)
    print(f"planner decision time, 64-GPU budget: {plan_ms:.1f} ms (median)")
    summary = {
        "goodput_per_gpu_vs": {b: round(math.exp(statistics.fmean(math.log(x) for x in v)), 3)
                               for b, v in ratios.items()},
        "attainment": round(min(attainments), 4),
        "plan_ms": round(plan_ms, 2),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
