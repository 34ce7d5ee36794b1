"""The `flotilla` command.

Each subcommand lives in its own module under `flotilla.commands` and exposes
`HELP` (one line), `add_arguments(parser)` and `run(args) -> int`. Modules are
imported only when their subcommand runs, so `flotilla --help` stays fast and a
subcommand's heavy dependencies load only when needed.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# name -> (module, one-line help). Keep sorted by how a user meets them.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("flotilla.commands.demo", "Bring up a local cluster with fake GPU nodes, run the operator and apply examples/"),
    "operator": ("flotilla.commands.operator", "Run the operator: reconcile TrainingJobs, ServingDeployments and Nodes"),
    "simworkers": ("flotilla.commands.simworkers", "Simulate training workers on KWOK nodes (demo and e2e)"),
    "crds": ("flotilla.commands.crds", "Print or write the CRD manifests generated from flotilla.resources"),
    "simulate-serving": ("flotilla.commands.simulate_serving", "Simulate a serving trace under a PD policy"),
    "serving-trace": ("flotilla.commands.serving_trace", "Generate a seeded serving request trace (CSV)"),
    "agent": ("flotilla.commands.agent", "Run the node agent: sample GPU/host/step-time metrics and publish them"),
    "detect": ("flotilla.commands.detect", "Run the health detectors offline over a JSONL metrics dump"),
    "simulate": ("flotilla.commands.simulate", "Simulate training policies on a job trace, or generate a synthetic trace"),
    "queues": ("flotilla.commands.queues", "Teams' Queues: import Kueue ClusterQueues and Cohorts (print or --apply)"),
    "controller": ("flotilla.commands.controller", "Run the controller: REST admin API, metrics, ingest and decision history"),
    "simulate-unified": ("flotilla.commands.simulate_unified", "Simulate training and serving on one pool against static partitions"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flotilla",
        description="Flotilla: deadline-aware elastic training and SLO-driven serving on one GPU pool.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_) in COMMANDS.items():
        # The module is loaded lazily in main(); here we only need its help text.
        sub.add_parser(name, help=help_, description=help_, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    top, rest = parser.parse_known_args(argv)
    if not top.command:
        parser.print_help()
        return 2
    module_name, help_ = COMMANDS[top.command]
    module = importlib.import_module(module_name)
    sub = argparse.ArgumentParser(prog=f"flotilla {top.command}", description=getattr(module, "__doc__", None) or help_,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    module.add_arguments(sub)
    args = sub.parse_args(rest)
    args.verbose = top.verbose or getattr(args, "verbose", False)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    try:
        return int(module.run(args) or 0)
    except SystemExit as e:
        # A command refuses its configuration with SystemExit("what is wrong"): one line and exit 2, no traceback.
        if not isinstance(e.code, str):
            raise
        message = e.code.removeprefix(f"flotilla {top.command}: ").removeprefix("error: ")
        print(f"flotilla {top.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
