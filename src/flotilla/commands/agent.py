"""Run the node agent: sample this node's GPUs (NVML), host and training step times; publish them in batches.

Sources: `dcgm` (GPU metrics from the node's DCGM exporter, --dcgm-url), `nvml`
(through nvidia-ml-py; fails if no driver), `sim` (a simulated machine with
injectable faults, for tests and the demo), `auto` (the DCGM exporter when it
answers at start, else NVML when a GPU is there, else host metrics only, said in
one log line). Workers' step times arrive on UDP --step-bind:--step-port.
Publishing goes to Redis Streams (--redis-url) or to the controller's
POST /v1/ingest (--controller-url); while the transport is down samples are
held in a bounded buffer that drops the oldest.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from dataclasses import replace

from flotilla.agent.dcgm import DEFAULT_URL as DCGM_URL
from flotilla.agent.dcgm import DcgmSource
from flotilla.agent.host import HostSource
from flotilla.agent.nvml import NvmlSource
from flotilla.agent.publish import BufferedPublisher, HttpTransport, RedisTransport, Transport
from flotilla.agent.runner import Agent, HeartbeatSource
from flotilla.agent.simulated import FAULTS, SimulatedSource, parse_fault, write_ground_truth
from flotilla.agent.sources import MetricSource, SourceUnavailable
from flotilla.agent.steps import DEFAULT_PORT, StepIntake
from flotilla.health.samples import STREAM

HELP = "Run the node agent: sample GPU/host/step-time metrics and publish them to Redis or the controller"
log = logging.getLogger("flotilla.agent")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node", required=True, help="this node's name (the Kubernetes Node name)")
    parser.add_argument("--source", choices=("dcgm", "nvml", "sim", "auto"), default="auto",
                        help="GPU metrics from: the DCGM exporter, NVML, a simulated machine, or auto (DCGM exporter "
                             "if it answers at start, else NVML, else host metrics only)")
    parser.add_argument("--dcgm-url", default=DCGM_URL,
                        help=f"the node's DCGM exporter (Prometheus text; default {DCGM_URL})")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--redis-url", help="publish to this Redis (XADD to the metrics stream)")
    target.add_argument("--controller-url", help="publish to this controller (POST /v1/ingest)")
    parser.add_argument("--token-file",
                        help="bearer token for the controller, re-read at every send (a projected ServiceAccount "
                             "token); with --redis-url each stream entry carries it")
    parser.add_argument("--ca-file", help="CA certificate(s) to verify an https --controller-url with (PEM)")
    parser.add_argument("--stream", default=STREAM, help=f"Redis stream (default {STREAM})")
    parser.add_argument("--maxlen", type=int, default=100_000, help="approximate Redis stream length cap")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--buffer", type=int, default=100_000, help="samples held while publishing fails")
    parser.add_argument("--batch", type=int, default=5_000, help="samples per published batch at most")
    parser.add_argument("--step-port", type=int, default=DEFAULT_PORT,
                        help=f"UDP port for workers' step times (default {DEFAULT_PORT}; 0 = off)")
    parser.add_argument("--step-bind", default="127.0.0.1", metavar="ADDRESS",
                        help="address the step-time port is bound to: the node's IP in a cluster (the chart passes "
                             "status.hostIP; workers get the same as FLOTILLA_AGENT_HOST); default 127.0.0.1")
    parser.add_argument("--step-allow", action="append", default=[], metavar="CIDR",
                        help="accept step reports only from these networks (repeatable; e.g. the cluster's pod "
                             "CIDR); default: from any sender")
    parser.add_argument("--job", help="job label for samples when no worker reports one")
    parser.add_argument("--duration", type=float, help="stop after this many seconds")
    sim = parser.add_argument_group("simulated source")
    sim.add_argument("--sim-gpus", type=int, default=8)
    sim.add_argument("--sim-seed", type=int, default=0)
    sim.add_argument("--inject", action="append", default=[], metavar="TYPE@START[+DURATION][#GPU]",
                     help=f"inject a fault, seconds after start; TYPE one of {', '.join(FAULTS)}")
    sim.add_argument("--ground-truth", help="write the injected faults (absolute times) to this JSONL file")
    sim.add_argument("--clock-offset", type=float, default=0.0, metavar="SECONDS",
                     help="test only: stamp samples this many seconds off the wall clock, as a node whose "
                          "clock is skewed would (the chaos suite's clock-skew case)")


def _gpu_source(args: argparse.Namespace, start: float) -> list[MetricSource]:
    if args.source == "sim":
        faults = [parse_fault(args.node, text) for text in args.inject]
        if args.ground_truth:
            write_ground_truth([replace(f, start=f.start + start, end=None if f.end is None else f.end + start)
                                for f in faults], args.ground_truth)
        return [SimulatedSource(args.node, args.job, start, faults=faults, gpus=args.sim_gpus, seed=args.sim_seed,
                                clock_offset=args.clock_offset)]
    host: list[MetricSource] = [HostSource(args.node), HeartbeatSource(args.node)]
    reasons = []
    if args.source in ("dcgm", "auto"):
        try:
            return [DcgmSource(args.node, args.dcgm_url), *host]
        except SourceUnavailable as e:
            if args.source == "dcgm":
                raise
            reasons.append(str(e))
    try:
        return [NvmlSource(args.node), *host]
    except SourceUnavailable as e:
        if args.source == "nvml":
            raise
        reasons.append(str(e))
    log.warning("no GPU metrics on this node: %s; publishing host metrics and heartbeats only", "; ".join(reasons))
    return host


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise SystemExit("--interval must be positive")
    if args.inject and args.source != "sim":
        raise SystemExit("--inject needs --source sim")
    if args.clock_offset and args.source != "sim":
        raise SystemExit("--clock-offset needs --source sim")
    start = time.time()
    try:
        sources = _gpu_source(args, start)
    except (SourceUnavailable, ValueError) as e:
        log.error("%s", e)
        return 2
    try:
        intake = StepIntake(args.node, args.step_port, args.step_bind, args.step_allow) if args.step_port else None
    except ValueError as e:
        log.error("--step-allow: %s", e)
        return 2
    except OSError as e:
        log.error("cannot bind the step-time port %s:%d: %s", args.step_bind, args.step_port, e)
        return 2
    transport: Transport = (RedisTransport(args.redis_url, args.stream, args.maxlen, token_file=args.token_file)
                            if args.redis_url
                            else HttpTransport(args.controller_url, args.node, args.token_file, ca_file=args.ca_file))
    publisher = BufferedPublisher(transport, args.buffer, args.batch)
    agent = Agent(args.node, sources, publisher, lambda: args.job, intake=intake)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    log.info("agent for node %s: sources %s, publishing to %s every %.1fs%s", args.node,
             ", ".join(s.name for s in agent.sources), args.redis_url or args.controller_url, args.interval,
             f"; step times on udp {intake.address[0]}:{intake.port}" if intake else "")
    try:
        agent.run(args.interval, stop, args.duration)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info("agent stopped: %d samples sent, %d dropped from a full buffer, %d refused", publisher.sent,
             publisher.dropped, publisher.refused)
    return 0
