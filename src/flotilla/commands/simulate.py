"""Replay a training trace under allocation policies, or generate a synthetic trace.

  flotilla simulate --trace FILE.csv --gpus N [--policy NAME ...|all] [--json] [--plot out.png]
  flotilla simulate --generate JOBS --gpus N --out FILE.csv [--seed S] [--load L] [--bursty]
                    [--deadline-factor LOW,HIGH]

The CSV format is described in docs/training.md (and flotilla.sim.training_trace).
"""

from __future__ import annotations

import argparse
import json
import sys

HELP = "Simulate training policies on a job trace, or generate a synthetic trace"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from flotilla.allocation import policies

    parser.add_argument("--gpus", type=int, required=True, help="GPUs in the cluster (8-GPU nodes)")
    parser.add_argument("--trace", help="trace CSV to replay")
    parser.add_argument("--policy", action="append",
                        help=f"policy to run (repeatable, or 'all'); one of: {', '.join(policies.names())}; "
                             f"default {policies.DEFAULT}")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument("--plot", metavar="PNG", help="write GPUs allocated over time to this PNG")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    gen = parser.add_argument_group("trace generation")
    gen.add_argument("--generate", type=int, metavar="JOBS", help="generate a synthetic trace of JOBS jobs")
    gen.add_argument("--out", help="where to write the generated trace (CSV)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--load", type=float, default=1.5, help="offered GPU-seconds / cluster GPU-seconds")
    gen.add_argument("--bursty", action="store_true", help="bursty (gamma) arrivals instead of Poisson")
    gen.add_argument("--deadline-factor", default="1.2,3.0",
                     help="deadline = submit + U(LOW,HIGH) x duration at the requested size")


def run(args: argparse.Namespace) -> int:
    from flotilla.allocation import policies
    from flotilla.sim import training, training_trace

    try:
        if args.generate is not None:
            if not args.out:
                raise ValueError("--generate needs --out FILE.csv")
            try:
                low, high = (float(x) for x in args.deadline_factor.split(","))
            except ValueError:
                raise ValueError(f"--deadline-factor must be LOW,HIGH (e.g. 1.2,3.0), not {args.deadline_factor!r}") from None
            jobs = training_trace.generate(args.generate, args.gpus, seed=args.seed, load=args.load,
                                           arrivals="bursty" if args.bursty else "poisson",
                                           deadline_factor=(low, high))
            training_trace.write_csv(jobs, args.out)
            print(f"wrote {len(jobs)} jobs to {args.out}", file=sys.stderr)
            return 0
        if not args.trace:
            raise ValueError("give --trace FILE.csv (or --generate JOBS --out FILE.csv)")
        trace = training_trace.read_csv(args.trace)
        names = args.policy or [policies.DEFAULT]
        if "all" in names:
            names = policies.names()
        allocators = [policies.get(n) for n in names]
    except (ValueError, OSError) as e:
        print(f"flotilla simulate: {e}", file=sys.stderr)
        return 2

    stream = None if args.no_progress else training.default_progress_stream(len(trace))
    results = [training.simulate(trace, args.gpus, a, progress=stream) for a in allocators]
    if args.plot:
        training.plot(results, args.plot)
    if args.json:
        print(json.dumps({r.policy: r.summary() for r in results}))
    else:
        for r in results:
            print(f"{r.policy}: deadlines met {r.deadlines_met}/{r.jobs} ({r.deadline_ratio:.3f}), "
                  f"guaranteed but missed {r.guarantees_missed}, "
                  f"admitted {r.admitted}, rejected {r.rejected}, unfinished {r.unfinished}, "
                  f"utilisation {r.utilisation:.3f}, avg JCT {r.avg_jct_s:.0f} s, rescales {r.rescales}, "
                  f"re-plan {r.decision_ms_mean:.2f} ms mean / {r.decision_ms_max:.2f} ms max over {r.replans}")
    return 0
