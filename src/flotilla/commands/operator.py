"""Run the operator.

It watches TrainingJobs, ServingDeployments, Nodes and the pods and Deployments
it created, decides with the allocation policy, and writes pods, Deployments,
status and Events. It installs nothing: apply crds/ (or the Helm chart) first.
Credentials come from KUBECONFIG, ~/.kube/config, or the in-cluster ServiceAccount.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

HELP = "Run the operator: reconcile TrainingJobs, ServingDeployments and Nodes"

POLICIES = ("fifo-gang",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", default="fifo-gang", choices=POLICIES,
                        help="allocation policy for TrainingJobs (default: %(default)s)")
    parser.add_argument("--resync", type=float, default=10.0, metavar="SECONDS",
                        help="reconcile everything at least this often (default: %(default)s)")
    parser.add_argument("--concurrency", type=int, default=16,
                        help="API calls in flight at once when applying a decision (default: %(default)s)")
    parser.add_argument("--namespace", action="append", default=[],
                        help="watch only this namespace (repeatable); default: all namespaces")
    parser.add_argument("--liveness", default="http://0.0.0.0:8081/healthz",
                        help="liveness endpoint URL, or '' for none (default: %(default)s)")


def _allocator(name: str):
    from flotilla.allocation.fifo import FifoGang

    return {"fifo-gang": FifoGang}[name]()


def run(args: argparse.Namespace) -> int:
    import kopf

    from flotilla.operator import handlers

    handlers.configure(handlers.Settings(allocator=_allocator(args.policy), resync_seconds=args.resync,
                                         concurrency=args.concurrency))
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    asyncio.run(kopf.operator(
        standalone=True,
        clusterwide=not args.namespace,
        namespaces=args.namespace or [],
        liveness_endpoint=args.liveness or None,
    ))
    return 0
