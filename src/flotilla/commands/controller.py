"""Run the controller: REST admin API, Prometheus metrics, metric ingest, decision history.

State: SQLite under $FLOTILLA_DATA (default ./.flotilla/) unless --db-url names
PostgreSQL (postgresql://user:pass@host/db). The database is created and
migrated on start. Tokens: --tokens-file, lines '<token>,<role>,<name>' with
role read|ingest|admin; created with one admin token if missing.

Ingest: --ingest-auth shared (the default, for development) lets any ingest
token post for any node; --ingest-auth tokenreview (production) accepts samples
only from agents' node-bound ServiceAccount tokens, for their own node, and
serving statistics only from callers allowed to update servingdeployments/stats.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from flotilla.controller.ingest_auth import DEFAULT_AGENT_SERVICE_ACCOUNT, DEFAULT_AUDIENCE, MODES, SHARED

HELP = "Run the controller: REST admin API, metrics, ingest and decision history"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db-url", help="SQLAlchemy URL (default: sqlite file $FLOTILLA_DATA/controller.db)")
    parser.add_argument("--redis-url", help="consume agent metrics from this Redis (stream flotilla:metrics)")
    parser.add_argument("--tokens-file", type=Path, help="bearer tokens (default: $FLOTILLA_DATA/tokens)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    parser.add_argument("--no-kubernetes", action="store_true",
                        help="run without a cluster: no object sync, cluster actions answer 503")
    parser.add_argument("--tokenreview-admins", metavar="USERS",
                        help="also accept tokens the API server vouches for (TokenReview, made for "
                             "--token-audience); comma-separated usernames get admin, everyone else read")
    parser.add_argument("--ingest-auth", choices=MODES, default=SHARED,
                        help="who may post samples and serving statistics: shared (any ingest token, for any node; "
                             "development only) or tokenreview (an agent's node-bound ServiceAccount token, for its "
                             "own node only; statistics need update on servingdeployments/stats). Default shared")
    parser.add_argument("--token-audience", default=DEFAULT_AUDIENCE, metavar="AUDIENCE",
                        help=f"the audience Kubernetes tokens must be made for (default {DEFAULT_AUDIENCE})")
    parser.add_argument("--agent-service-accounts", default=DEFAULT_AGENT_SERVICE_ACCOUNT, metavar="NS/NAME,...",
                        help="ServiceAccounts whose node-bound tokens may post samples with --ingest-auth "
                             f"tokenreview (default {DEFAULT_AGENT_SERVICE_ACCOUNT})")
    parser.add_argument("--tls-cert-file", type=Path, help="serve HTTPS with this certificate (PEM; with --tls-key-file)")
    parser.add_argument("--tls-key-file", type=Path, help="the private key of --tls-cert-file (PEM)")
    parser.add_argument("--sample-retention", type=float, default=6 * 3600.0, metavar="SECONDS",
                        help="drop metric samples older than this (default 6 h); decisions are kept")
    parser.add_argument("--ingest-limit", type=int, default=4 * 1024 * 1024, metavar="BYTES",
                        help="largest POST /v1/ingest body (default 4 MiB)")
    parser.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                        help="allow browser requests from this origin (repeatable; CORS is off by default)")
    parser.add_argument("--no-health", action="store_true",
                        help="do not run the fault and straggler detectors on ingested metrics")
    parser.add_argument("--no-replan", action="store_true",
                        help="do not re-plan auto-mode ServingDeployments from pushed serving statistics")
    parser.add_argument("--scrape-interval", type=float, default=15.0, metavar="SECONDS",
                        help="scrape the serving engines' /metrics (the decode Services' endpoints) this often; "
                             "two scrapes make a window for the re-planner; 0: do not scrape (default 15)")
    parser.add_argument("--scale-down-after", type=float, default=120.0, metavar="SECONDS",
                        help="a serving plan must hold this long before a smaller one replaces it (default 120)")
    parser.add_argument("--peak-memory", type=float, default=120.0, metavar="SECONDS",
                        help="a smaller serving plan must fit the peak seen this long; it grows to the period of "
                             "peaks that come back, up to an hour (default 120)")
    parser.add_argument("--instance-start", type=float, default=30.0, metavar="SECONDS",
                        help="how long a new serving instance takes to serve (default 30)")
    parser.add_argument("--stragglers", choices=("report", "evict"), default="report",
                        help="report a straggler only, or also taint its node and move its jobs (default: report)")
    parser.add_argument("--taint-budget-fraction", type=float, default=0.10, metavar="F",
                        help="taint at most this fraction of all nodes (at least 1) per budget window; faults "
                             "beyond it are recorded and counted, not acted on (default 0.10)")
    parser.add_argument("--taint-budget-domain-fraction", type=float, default=0.50, metavar="F",
                        help="taint at most this fraction of one topology domain's nodes (at least 1) per budget "
                             "window (default 0.50)")
    parser.add_argument("--taint-budget-window", type=float, default=600.0, metavar="SECONDS",
                        help="the taint budget's sliding window (default 600)")


def run(args: argparse.Namespace) -> int:
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # logs at import; say nothing useful
    from flotilla.controller.service import ControllerService, Settings
    from flotilla.health.budget import TaintBudgetConfig
    from flotilla.serving.replan import ReplanPolicy

    try:
        budget = TaintBudgetConfig(fraction=args.taint_budget_fraction,
                                   domain_fraction=args.taint_budget_domain_fraction, window=args.taint_budget_window)
    except ValueError as e:
        raise SystemExit(f"flotilla controller: {e}") from None

    settings = Settings(host=args.host, port=args.port, redis_url=args.redis_url,
                        kubernetes=not args.no_kubernetes, sample_retention_s=args.sample_retention,
                        ingest_limit=args.ingest_limit, cors_origins=tuple(args.cors_origin),
                        health=not args.no_health, straggler_action=args.stragglers, replan=not args.no_replan,
                        taint_budget=budget, scrape_interval_s=args.scrape_interval,
                        ingest_auth=args.ingest_auth, token_audience=args.token_audience,
                        agent_service_accounts=frozenset(sa.strip() for sa in args.agent_service_accounts.split(",")
                                                         if sa.strip()),
                        tls_cert_file=args.tls_cert_file, tls_key_file=args.tls_key_file,
                        replan_policy=ReplanPolicy(scale_down_delay_s=args.scale_down_after,
                                                   peak_memory_s=args.peak_memory,
                                                   instance_start_s=args.instance_start))
    if args.db_url:
        settings.db_url = args.db_url
    if args.tokens_file:
        settings.tokens_file = args.tokens_file
    if args.tokenreview_admins is not None:
        settings.tokenreview_admins = frozenset(u.strip() for u in args.tokenreview_admins.split(",") if u.strip())
    try:
        settings.check()
    except ValueError as e:
        raise SystemExit(f"flotilla controller: {e}") from None
    ControllerService(settings).serve()
    return 0
