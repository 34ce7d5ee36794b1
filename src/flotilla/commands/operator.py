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
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Coroutine

import yaml

from flotilla.allocation import policies
from flotilla.pool import PoolPolicy
from flotilla.resources import names

if TYPE_CHECKING:
    from flotilla.operator.leader import LeaderElector

log = logging.getLogger("flotilla.operator")
HELP = "Run the operator: reconcile TrainingJobs, ServingDeployments and Nodes"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", default=policies.DEFAULT, choices=policies.names(),
                        help="allocation policy for TrainingJobs (default: %(default)s; the others are baselines)")
    parser.add_argument("--pool-policy", metavar="FILE",
                        help="the unified GPU pool's policy: a YAML mapping of forecastHeadroom, holdDownSeconds, "
                             "borrowGuaranteed (docs/unified.md); default: the documented defaults")
    parser.add_argument("--no-pool", action="store_true",
                        help="no unified pool: ServingDeployments never borrow training's GPUs")
    parser.add_argument("--resync", type=float, default=10.0, metavar="SECONDS",
                        help="wake at least this often, and re-plan everything this long after the last full "
                             "re-plan ended, or longer when one is slow (default: %(default)s)")
    parser.add_argument("--batch-seconds", type=float, default=0.5, metavar="SECONDS",
                        help="a pass that takes newly submitted TrainingJobs starts once submissions pause, or "
                             "at the latest this long after the first of them, so that jobs arriving together are "
                             "planned in one pass; it adds up to this "
                             "much to their admission, nothing to a job arriving twice as long after the previous "
                             "one (default: %(default)s)")
    parser.add_argument("--concurrency", type=int, default=16,
                        help="API calls in flight at once when applying a decision (default: %(default)s)")
    parser.add_argument("--qps", type=float, default=200.0,
                        help="the operator's API writes per second on average, 0 for no limit (default: %(default)s)")
    parser.add_argument("--burst", type=int, default=400,
                        help="API writes allowed at once above --qps, after a quiet spell (default: %(default)s)")
    parser.add_argument("--max-restarts", type=int, default=3,
                        help="restarts from the last checkpoint after a worker fails, before the job fails (default 3)")
    parser.add_argument("--namespace", action="append", default=[],
                        help="watch only this namespace (repeatable); default: all namespaces")
    parser.add_argument("--api-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="give up an API call after this long; a write that timed out is planned again on a "
                             "later pass (default: %(default)s)")
    parser.add_argument("--relist-seconds", type=float, default=60.0, metavar="SECONDS",
                        help="list everything watched this often, to drop objects deleted while a watch was "
                             "down (default: %(default)s; longer while one list of everything takes over 5%% "
                             "of that); also done soon after any watch re-lists")
    parser.add_argument("--agent-port", type=int, default=names.DEFAULT_AGENT_PORT, metavar="PORT",
                        help="UDP port of the node agents' step-time intake, given to worker pods as "
                             "FLOTILLA_AGENT_PORT (default %(default)s; the chart sets agent.stepPort)")
    parser.add_argument("--liveness", default="http://0.0.0.0:8081/healthz",
                        help="liveness endpoint URL, or '' for none (default: %(default)s)")
    parser.add_argument("--metrics-port", type=int, default=names.OPERATOR_METRICS_PORT, metavar="PORT",
                        help="serve Prometheus metrics on http://0.0.0.0:PORT/metrics (docs/operator-metrics.md), "
                             "standby replicas too; 0: not served (default: %(default)s)")
    lease = parser.add_argument_group("leader election (for several replicas: exactly one acts)")
    lease.add_argument("--leader-elect", action="store_true",
                       help="act only while holding a coordination.k8s.io Lease; wait for it otherwise")
    lease.add_argument("--lease-name", default="flotilla-operator", help="(default: %(default)s)")
    lease.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE") or "default",
                       help="(default: $POD_NAMESPACE, else %(default)s)")
    lease.add_argument("--lease-duration", type=int, default=15, metavar="SECONDS",
                       help="a standby takes over this long after the leader stops renewing; the leader stops "
                            "writing and steps down (exit 1) when it has not renewed for 2/3 of it "
                            "(default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    import kopf

    from flotilla import kubeapi
    from flotilla.operator import handlers

    for flag, value, least in (("--concurrency", args.concurrency, 1), ("--qps", args.qps, 0),
                               ("--burst", args.burst, 1), ("--api-timeout", args.api_timeout, 0.1),
                               ("--relist-seconds", args.relist_seconds, 1), ("--agent-port", args.agent_port, 1),
                               ("--batch-seconds", args.batch_seconds, 0), ("--metrics-port", args.metrics_port, 0)):
        if value < least:
            raise SystemExit(f"{flag} must be at least {least}, got {value}")
    if args.metrics_port > 65535:
        raise SystemExit(f"--metrics-port must be at most 65535, got {args.metrics_port}")
    elector = _elector(args) if args.leader_elect else None
    identity = elector.identity if elector else kubeapi.default_identity()
    op = handlers.configure(handlers.Settings(allocator=policies.get(args.policy), resync_seconds=args.resync,
                                              batch_seconds=args.batch_seconds,
                                              concurrency=args.concurrency, qps=args.qps, burst=args.burst,
                                              max_restarts=args.max_restarts, pool=pool_policy(args),
                                              api_timeout=args.api_timeout, relist_seconds=args.relist_seconds,
                                              namespaces=list(args.namespace), identity=identity,
                                              fence=elector.fence if elector else None,
                                              agent_port=args.agent_port))
    if args.metrics_port:
        from flotilla.operator.metrics import serve

        serve(op.metrics, args.metrics_port)
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    log.info("operator %s: requests carry User-Agent %s/%s", identity, handlers.USER_AGENT, identity)

    def operator(liveness: str | None) -> Coroutine[Any, Any, None]:
        return kopf.operator(standalone=True, clusterwide=not args.namespace, namespaces=args.namespace or [],
                             liveness_endpoint=liveness)

    if elector is None:
        asyncio.run(operator(args.liveness or None))
        return 0
    from flotilla.operator.leader import run_elected

    # While waiting, kopf does not run: the liveness endpoint is served by the election loop throughout.
    return asyncio.run(run_elected(elector, lambda: operator(None), args.liveness or None))


def pool_policy(args: argparse.Namespace) -> PoolPolicy | None:
    """The unified pool's policy. It arbitrates with the deadline-aware allocator, so the baseline
    policies run without it."""
    if args.no_pool:
        return None
    if args.policy != policies.DEFAULT:
        if args.pool_policy:
            raise SystemExit(f"--pool-policy needs --policy {policies.DEFAULT} (the unified pool arbitrates with it)")
        return None
    if not args.pool_policy:
        return PoolPolicy()
    try:
        values = yaml.safe_load(Path(args.pool_policy).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise SystemExit(f"--pool-policy {args.pool_policy}: {e}") from None
    if not isinstance(values, dict):
        raise SystemExit(f"--pool-policy {args.pool_policy}: expected a mapping of policy keys")
    try:
        return PoolPolicy.from_mapping(values)
    except ValueError as e:
        raise SystemExit(f"--pool-policy {args.pool_policy}: {e}") from None


def _elector(args: argparse.Namespace) -> LeaderElector:
    import socket
    import uuid

    from kubernetes import client

    from flotilla import kubeapi
    from flotilla.operator.handlers import USER_AGENT
    from flotilla.operator.leader import LeaderElector

    identity = f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    # The Lease calls go on a client of their own: renewing is not fenced, and never waits behind the writes.
    # No retries inside urllib3: each try is bounded by the renew deadline, and the elector tries again itself.
    api = kubeapi.connect(USER_AGENT, identity, timeout=args.api_timeout, retries=False)
    try:
        return LeaderElector(client.CoordinationV1Api(api), args.lease_namespace, args.lease_name, identity,
                             duration_s=args.lease_duration, renew_every_s=args.lease_duration / 5,
                             api_timeout_s=args.api_timeout)
    except ValueError as e:
        raise SystemExit(f"--lease-duration {args.lease_duration}: {e}") from None
