"""Play the workers of TrainingJobs whose pods run on KWOK's fake GPU nodes.

They advance at the speed the job's scaling curve gives (times --speed), report
progress, acknowledge checkpoint requests and exit when the steps are done, all
through flotilla.worker like a real worker. For the demo and the e2e tests.
"""

from __future__ import annotations

import argparse

HELP = "Simulate training workers on KWOK nodes (demo and e2e)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--speed", type=float, default=1.0, help="time runs this many times faster (default 1)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between passes (default 1)")
    parser.add_argument("--namespace", help="only this namespace (default: all)")


def run(args: argparse.Namespace) -> int:
    from kubernetes import client, config

    from flotilla.worker.simulated import SimulatedWorkers

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    SimulatedWorkers(client.ApiClient(), speed=args.speed, namespace=args.namespace).run_forever(args.interval)
    return 0
