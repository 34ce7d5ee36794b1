"""Run the health detectors offline over a metrics dump.

Input: JSON lines `{"ts", "node", "job", "gpu", "metric", "value"[, "role", "rank"]}` in time
order (see docs/health.md for the metric names). Output: one JSON line per
decision at the moment it is confirmed, `{"ts", "node", "kind", "reason",
"evidence"}`, kind "fault" or "straggler".
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import IO, Iterator

from flotilla.health.monitor import HealthMonitor, MonitorConfig
from flotilla.health.samples import Sample

HELP = "Run the faulty-machine and straggler detectors offline over a JSONL metrics dump"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="samples, JSON lines ('-' = stdin)")
    parser.add_argument("--output", required=True, help="decisions, JSON lines ('-' = stdout)")
    defaults = MonitorConfig()
    parser.add_argument("--interval", type=float, default=defaults.interval, help="agents' sampling interval, s")
    parser.add_argument("--window", type=int, default=defaults.window, help="outlier window, samples")
    parser.add_argument("--continuity", type=int, default=defaults.continuity, help="evaluations an outlier must last")
    parser.add_argument("--threshold", type=float, default=defaults.threshold, help="windowed robust z-score")
    parser.add_argument("--heartbeat-timeout", type=float, default=defaults.heartbeat_timeout, help="seconds")


def _batches(stream: IO[str]) -> Iterator[list[Sample]]:
    """Consecutive samples with the same timestamp, as one batch."""
    batch: list[Sample] = []
    for number, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            sample = Sample.from_dict(json.loads(line))
        except (ValueError, TypeError) as e:
            raise ValueError(f"input line {number}: {e}") from None
        if batch and sample.ts != batch[0].ts:
            yield batch
            batch = []
        batch.append(sample)
    if batch:
        yield batch


def run(args: argparse.Namespace) -> int:
    monitor = HealthMonitor(MonitorConfig(interval=args.interval, window=args.window, continuity=args.continuity,
                                          threshold=args.threshold, heartbeat_timeout=args.heartbeat_timeout))
    source = sys.stdin if args.input == "-" else open(args.input)
    sink = sys.stdout if args.output == "-" else open(args.output, "w")
    now = float("-inf")
    try:
        for batch in _batches(source):
            now = max(now, batch[0].ts)
            for decision in monitor.observe(batch, now):
                if decision.state == "confirmed":
                    sink.write(json.dumps(decision.to_record()) + "\n")
    except ValueError as e:
        print(f"flotilla detect: {e}", file=sys.stderr)
        return 2
    finally:
        if source is not sys.stdin:
            source.close()
        if sink is not sys.stdout:
            sink.close()
    return 0
