"""Run a seeded unified-pool scenario (training and serving on one cluster) under the three policies:
static partition at peak, static partition at mean, and the unified pool (the arbiter)."""

from __future__ import annotations

import argparse
import json

from flotilla.pool import PoolPolicy
from flotilla.sim.unified import POLICIES, simulate
from flotilla.sim.unified_scenarios import SCENARIOS, build

HELP = "Simulate training and serving on one cluster: static partitions against the unified pool"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", required=True, choices=SCENARIOS)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--gpus", type=int, default=64, help="cluster GPUs, 8 per node (default 64)")
    parser.add_argument("--hours", type=float, default=12.0, help="simulated span (default 12)")
    parser.add_argument("--rate", type=float, default=250.0, help="mean serving rate, req/s (default 250)")
    parser.add_argument("--training-jobs", type=int, default=400, help="jobs in the training trace (default 400)")
    parser.add_argument("--training-load", type=float, default=1.3,
                        help="training work offered, in cluster GPU-seconds (default 1.3)")
    parser.add_argument("--forecast-headroom", type=float, default=PoolPolicy.forecast_headroom)
    parser.add_argument("--hold-down", type=float, default=PoolPolicy.hold_down_seconds, help="seconds")
    parser.add_argument("--borrow-guaranteed", action="store_true",
                        help="let serving take training jobs' guaranteed shares")
    parser.add_argument("--json", action="store_true", help="print one JSON object per policy")


def run(args: argparse.Namespace) -> int:
    try:
        if args.hours <= 0:
            raise ValueError(f"--hours: must be > 0, got {args.hours}")
        scenario = build(args.scenario, args.seed, gpus=args.gpus, duration_s=args.hours * 3600,
                         mean_rate=args.rate, training_jobs=args.training_jobs, training_load=args.training_load)
        policy = PoolPolicy(args.forecast_headroom, args.hold_down, args.borrow_guaranteed)
        results = [simulate(scenario, p, policy) for p in POLICIES]
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    for r in results:
        if args.json:
            print(json.dumps(r.summary()))
        else:
            print(f"{r.policy:>12}: deadline ratio {r.deadline_ratio:.3f}, SLO attainment {r.slo_attainment:.4f}, "
                  f"utilisation {r.utilisation:.3f}, checkpoint shrinks {r.checkpoint_shrinks}, "
                  f"rejected {r.rejected}")
    return 0
