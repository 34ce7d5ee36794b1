"""Write a seeded serving request trace as CSV (arrival_s, prompt_tokens, output_tokens) for
`flotilla simulate-serving`. Arrivals: steady (Poisson), bursty (3x bursts 20% of the time),
diurnal (one compressed day over the duration). Lengths: chat (ShareGPT-like), summarise
(long-context summarisation), code (code completion)."""

from __future__ import annotations

import argparse
import sys

from flotilla.sim.serving_trace import ARRIVALS, LENGTH_SHAPES, generate, write_csv

HELP = "Generate a seeded serving request trace (CSV) for simulate-serving"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arrival", choices=ARRIVALS, default="steady")
    parser.add_argument("--shape", choices=sorted(LENGTH_SHAPES), default="chat")
    parser.add_argument("--rate", type=float, required=True, help="mean requests per second")
    parser.add_argument("--duration", type=float, required=True, help="seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="-", help="output file (default: stdout)")


def run(args: argparse.Namespace) -> int:
    try:
        trace = generate(args.arrival, args.shape, args.rate, args.duration, args.seed)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_csv(trace, sys.stdout if args.out == "-" else args.out)
    return 0
