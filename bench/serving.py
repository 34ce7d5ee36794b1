"""Goodput per GPU of the adaptive PD planner against honest baselines, judged by the engine double.

For each of four traces (steady, bursty, diurnal, step load; ShareGPT-like chat lengths; OPT-13B on
A100) every policy runs on the same GPU budget in `flotilla.sim.serving`, whose instances are engine
doubles (iteration-level batching, chunked prefill when colocated, KV cache; DistServe's published
timings): the plans are judged by what the engines do, not by the planner's latency formulas.
Policies (all sized by the same planner and SLO unless said otherwise):

    adaptive                re-plans every 30 s from the observed window (at once when a 15-s scrape
                            window calls for a scale-up, as the controller does), any mode
    adaptive-colocated      the same, colocated plans only
    adaptive-disaggregated  the same, disaggregated plans only
    static-peak             one plan, sized for the trace's busiest minute
    static-best             one plan, sized for the trace's average rate plus the adaptive headroom
    fixed-1-1               1 prefill : 1 decode instance pairs, each role at the GPUs per instance the
                            planner gives it for the busiest minute, as many pairs as that minute needs
    colocated               colocated instances (chunked prefill, vLLM's default) filling the budget
    reactive                what a user runs today: an HPA (or KEDA) per pool on the engines' gauges
                            (vllm:num_requests_waiting, vllm:gpu_cache_usage_perc), the shape the planner
                            gives the busiest minute, HPA's tolerance, 5-minute scale-down stabilization
                            and scale-up limit (flotilla.sim.serving.ReactiveSettings; its targets were
                            tuned on the tuning seeds, below)

Goodput counts requests that meet both TTFT and TPOT (in windows meeting the attainment target);
per GPU it divides by the GPUs held on average. Ratios are adaptive / baseline, per trace and as a
geometric mean. "modes" counts the adaptive policy's plans (first and changes) per mode. GPU-hours are
what each policy held; "gpu_hours_vs" is adaptive's over each baseline's (geometric mean over the
traces; per trace in "gpu_hours_vs_per_trace"). "broken_promises" counts the traces on which the
adaptive policy missed the SLO's attainment target while none of its plans was flagged at risk.
"plan_p99_*" time the planner's plan() (the check included) on a 64-GPU budget; "replan_p99_cpu_ms" the
re-planner's decisions in the adaptive runs (each adopted plan is checked first).

    python bench/serving.py --quick     # last line is the JSON summary
    python bench/serving.py             # longer, busier traces
    python bench/serving.py --baselines static-peak   # only these baselines (adaptive always runs)

Seeds: the re-planner's rules (flotilla.serving.replan) were chosen on the traces of seeds 101, 105 and
109 (`--seed 101` ...: the four traces take seed, seed+1, seed+2, seed+3); this round's rule for rises
shorter than an instance start on seed 101 alone. The figures reported in docs/serving.md use the
default seed 21 (traces 21-24), held out, and `--seed 31` (traces 31-34). Seeds 7-10, the held-out set of
earlier rounds, were seen while earlier rules were chosen.
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

from flotilla.serving.planner import PlanRequest, _instance_capacities, plan
from flotilla.serving.search import _estimates
from flotilla.serving.shipped_profiles import OPT_13B_A100
from flotilla.serving.workload import SLO, Workload
from flotilla.sim.serving import POLICIES, make_policy, simulate
from flotilla.sim.serving_trace import generate

SLO_TARGET = SLO(ttft_ms=400.0, tpot_ms=60.0, attainment=0.9)
BASELINES = [p for p in POLICIES if p != "adaptive"]
ARRIVALS = ("steady", "bursty", "diurnal", "step")


def plan_times_ms(repeats: int) -> tuple[float, float, float]:
    """(median wall, p99 wall, p99 CPU) ms of plan(), the check included, over rates 2-120 req/s on a
    64-GPU budget, each on lengths not seen before (caches cleared). CPU time is what a shared machine
    measures fairly; wall time is what the issue bounds (p99 < 1 s)."""
    walls, cpus = [], []
    for i in range(repeats):
        rate = 2.0 + 118.0 * i / max(repeats - 1, 1)
        request = PlanRequest(Workload.from_means(rate, 300.0, 200.0), SLO_TARGET, OPT_13B_A100,
                              min_gpus=0, max_gpus=64)
        _instance_capacities.cache_clear()
        _estimates.cache_clear()
        wall, cpu = time.perf_counter(), time.process_time()
        plan(request)
        walls.append((time.perf_counter() - wall) * 1000.0)
        cpus.append((time.process_time() - cpu) * 1000.0)
    p99 = lambda v: sorted(v)[min(len(v) - 1, math.ceil(0.99 * len(v)) - 1)]  # noqa: E731
    return statistics.median(walls), p99(walls), p99(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short traces")
    parser.add_argument("--seed", type=int, default=21, help="the first trace's seed (default 21: held out)")
    parser.add_argument("--baselines", nargs="*", choices=BASELINES, default=BASELINES,
                        help="baselines to run (default: all)")
    args = parser.parse_args()
    baselines = [b for b in BASELINES if b in args.baselines]
    policies = ["adaptive", *baselines]
    rate, duration, budget = (8.0, 1200.0, 6) if args.quick else (20.0, 7200.0, 16)

    ratios: dict[str, list[float]] = {b: [] for b in baselines}
    hours: dict[str, list[float]] = {b: [] for b in baselines}
    broken = 0
    attainments: dict[str, list[float]] = {p: [] for p in policies}
    modes: dict[str, int] = {}
    decisions: list[float] = []  # CPU ms of each of adaptive's re-planning decisions, its check included
    print(f"profile {OPT_13B_A100.name}, SLO TTFT {SLO_TARGET.ttft_ms:g} ms / TPOT {SLO_TARGET.tpot_ms:g} ms "
          f"at {SLO_TARGET.attainment:g}, mean rate {rate:g} req/s, {duration:g} s, budget {budget} GPUs")
    print(f"{'trace':8} {'policy':22} {'attain':>7} {'goodput':>8} {'GPUs':>6} {'gp/GPU':>7} "
          f"{'TTFT p90':>9} {'TPOT p90':>9} {'changes':>7} {'GPU-h':>6}  modes")
    for i, arrival in enumerate(ARRIVALS):
        trace = generate(arrival, "chat", rate, duration, args.seed + i)
        results = {p: simulate(trace, OPT_13B_A100, SLO_TARGET, budget, p) for p in policies}
        for policy, r in results.items():
            attainments[policy].append(r.attainment)
            print(f"{arrival:8} {policy:22} {r.attainment:7.3f} {r.goodput:8.2f} {r.mean_gpus:6.2f} "
                  f"{r.goodput_per_gpu:7.3f} {r.ttft_p90_ms:9.0f} {r.tpot_p90_ms:9.1f} {r.plan_changes:7d} "
                  f"{r.gpu_hours:6.3f}  "
                  + ", ".join(f"{m} {n}" for m, n in sorted(r.modes.items())))
        adaptive = results["adaptive"]
        decisions += adaptive.decision_ms
        for mode, count in adaptive.modes.items():
            modes[mode] = modes.get(mode, 0) + count
        broken += int(adaptive.attainment < SLO_TARGET.attainment and adaptive.at_risk_plans == 0)
        for baseline in baselines:
            ratios[baseline].append(adaptive.goodput_per_gpu / results[baseline].goodput_per_gpu)
            hours[baseline].append(adaptive.gpu_hours / results[baseline].gpu_hours)
        print(f"{arrival:8} adaptive goodput/GPU vs " + ", ".join(
            f"{b} {ratios[b][-1]:.2f}x" for b in baselines))
        print(f"{arrival:8} adaptive GPU-hours vs " + ", ".join(
            f"{b} {hours[b][-1]:.2f}x" for b in baselines))
        for policy in ("adaptive", *(b for b in ("static-peak", "fixed-1-1") if b in baselines)):
            first = make_policy(policy, trace, SLO_TARGET, OPT_13B_A100, budget).initial_plan()
            print(f"{arrival:8} why {policy} starts {first.mode}: {first.reason}")

    plan_ms, plan_p99_ms, plan_p99_cpu_ms = plan_times_ms(10 if args.quick else 40)
    print(f"planner decision time (check included), 64-GPU budget: median {plan_ms:.0f} ms, p99 {plan_p99_ms:.0f} ms "
          f"wall, p99 {plan_p99_cpu_ms:.0f} ms CPU")
    replan_p99_ms = sorted(decisions)[min(len(decisions) - 1, math.ceil(0.99 * len(decisions)) - 1)]
    print(f"re-planner decision time (check included) over adaptive's {len(decisions)} decisions: "
          f"p99 {replan_p99_ms:.0f} ms CPU, max {max(decisions):.0f} ms")
    geomean = lambda v: round(math.exp(statistics.fmean(math.log(x) for x in v)), 3)  # noqa: E731
    summary = {
        "goodput_per_gpu_vs": {b: geomean(v) for b, v in ratios.items()},
        "gpu_hours_vs": {b: geomean(v) for b, v in hours.items()},
        "gpu_hours_vs_per_trace": {b: dict(zip(ARRIVALS, (round(x, 3) for x in v))) for b, v in hours.items()},
        "attainment_per_trace": {p: dict(zip(ARRIVALS, (round(x, 4) for x in v))) for p, v in attainments.items()},
        "broken_promises": broken,
        "attainment": round(min(attainments["adaptive"]), 4),
        "baseline_attainment": {b: round(min(attainments[b]), 4) for b in baselines},
        "plan_ms": round(plan_ms, 2),
        "plan_p99_ms": round(plan_p99_ms, 1),
        "plan_p99_cpu_ms": round(plan_p99_cpu_ms, 1),
        "replan_p99_cpu_ms": round(replan_p99_ms, 1),
        "modes": modes,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
