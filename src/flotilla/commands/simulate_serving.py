"""Play a request trace through a prefill/decode deployment under one policy and report SLO attainment,
TTFT/TPOT percentiles, goodput and goodput per GPU.

Trace CSV columns: arrival_s, prompt_tokens, output_tokens (make one with `flotilla serving-trace`).
Policies: adaptive (the planner re-planning every --interval seconds, and at once when a --scrape window calls
for a scale-up), adaptive-colocated, adaptive-disaggregated, static-peak, static-best, fixed-1-1, colocated.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from flotilla.serving.profile import ProfileError, resolve_profile
from flotilla.serving.shipped_profiles import SHIPPED_PROFILES
from flotilla.serving.workload import SLO
from flotilla.sim.serving import POLICIES, simulate
from flotilla.sim.serving_trace import read_csv

HELP = "Simulate a serving trace under a PD policy and report attainment and goodput per GPU"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", required=True, help="trace CSV (arrival_s, prompt_tokens, output_tokens)")
    parser.add_argument("--profile", required=True,
                        help=f"a shipped profile ({', '.join(sorted(SHIPPED_PROFILES))}) or a YAML/JSON file "
                             "holding a spec.profile object")
    parser.add_argument("--gpus", type=int, required=True, help="GPU budget (maxGPUs)")
    parser.add_argument("--policy", required=True, choices=POLICIES)
    parser.add_argument("--ttft-ms", type=float, default=400.0, help="TTFT SLO (default 400)")
    parser.add_argument("--tpot-ms", type=float, default=60.0, help="TPOT SLO (default 60)")
    parser.add_argument("--attainment", type=float, default=0.9, help="SLO attainment target (default 0.9)")
    parser.add_argument("--interval", type=float, default=30.0, help="planner interval, s (default 30)")
    parser.add_argument("--startup", type=float, default=30.0, help="instance start-up time, s (default 30)")
    parser.add_argument("--scrape", type=float, default=15.0,
                        help="the controller's scrape interval, s: a window that calls for a scale-up by rate is "
                             "evaluated at once (default 15, the controller's; 0: one window per interval)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")


def run(args: argparse.Namespace) -> int:
    try:
        path = Path(args.profile)
        profile = resolve_profile(yaml.safe_load(path.read_text()) if path.is_file() else {"name": args.profile})
        slo = SLO(args.ttft_ms, args.tpot_ms, args.attainment)
        trace = read_csv(args.trace)
        if args.gpus < 1:
            raise ValueError(f"--gpus: must be >= 1, got {args.gpus}")
        if args.scrape < 0:
            raise ValueError(f"--scrape: must be >= 0, got {args.scrape}")
        result = simulate(trace, profile, slo, args.gpus, args.policy, args.interval, args.startup,
                          scrape_s=args.scrape or None)
    except (ProfileError, ValueError, OSError, yaml.YAMLError) as exc:
        print(f"error: {exc}")
        return 2
    if args.json:
        print(json.dumps(result.to_dict()))
        return 0
    r = result
    print(f"policy {r.policy}: {r.requests} requests over {r.duration_s:.0f} s, {r.plan_changes} plan change(s)")
    print(f"  attainment (TTFT<={slo.ttft_ms:g} ms and TPOT<={slo.tpot_ms:g} ms): {r.attainment:.3f}")
    print(f"  TTFT ms p50/p90/p99: {r.ttft_p50_ms:.0f} / {r.ttft_p90_ms:.0f} / {r.ttft_p99_ms:.0f}")
    print(f"  TPOT ms p50/p90/p99: {r.tpot_p50_ms:.1f} / {r.tpot_p90_ms:.1f} / {r.tpot_p99_ms:.1f}")
    print(f"  goodput {r.goodput:.2f} req/s on {r.mean_gpus:.2f} GPUs on average (peak {r.max_gpus}): "
          f"{r.goodput_per_gpu:.3f} req/s per GPU")
    return 0
