"""Assembles the controller process: database (migrated at start-up), API, metrics, ingest, sync, retention."""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Sequence

import uvicorn

from flotilla.controller.actions import ClusterActions, OfflineActions
from flotilla.controller.api import Controller, Policy, create_app
from flotilla.controller.auth import TokenAuthenticator, create_tokens_file, parse_tokens
from flotilla.controller.db import create_engine, is_outage, upgrade
from flotilla.controller.health import HealthResponder
from flotilla.controller.ingest import Ingestor, RedisConsumer, Retention, SampleSink, SampleStoreSink
from flotilla.controller.ingest_auth import (
    DEFAULT_AGENT_SERVICE_ACCOUNT,
    DEFAULT_AUDIENCE,
    SHARED,
    TOKENREVIEW,
    IngestPolicy,
)
from flotilla.controller.metrics import ControllerMetrics
from flotilla.controller.replan import ServingReplanner
from flotilla.controller.scrape import EngineScraper
from flotilla.controller.store import Store
from flotilla.health.budget import TaintBudget, TaintBudgetConfig
from flotilla.serving.replan import ReplanPolicy

if TYPE_CHECKING:
    from flotilla.controller.kube import Sync

log = logging.getLogger(__name__)


def data_dir() -> Path:
    return Path(os.environ.get("FLOTILLA_DATA") or ".flotilla")


@dataclass
class Settings:
    db_url: str = field(default_factory=lambda: f"sqlite:///{(data_dir() / 'controller.db').resolve()}")
    tokens_file: Path = field(default_factory=lambda: data_dir() / "tokens")
    redis_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    kubernetes: bool = True
    tokenreview_admins: frozenset[str] | None = None  # None: Kubernetes tokens give no admin or read role
    ingest_auth: str = SHARED  # shared (development) | tokenreview (production): see flotilla.controller.ingest_auth
    token_audience: str = DEFAULT_AUDIENCE
    agent_service_accounts: frozenset[str] = frozenset({DEFAULT_AGENT_SERVICE_ACCOUNT})
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    sample_retention_s: float = 6 * 3600.0
    retention_every_s: float = 300.0
    body_limit: int = 64 * 1024
    ingest_limit: int = 4 * 1024 * 1024
    cors_origins: Sequence[str] = ()
    policy: Policy = field(default_factory=Policy)
    health: bool = True  # run the fault and straggler detectors on ingested samples
    replan: bool = True  # re-plan auto-mode ServingDeployments from pushed statistics (needs Kubernetes)
    replan_policy: ReplanPolicy = field(default_factory=ReplanPolicy)
    scrape_interval_s: float = 15.0  # scrape the serving engines' /metrics this often (0: off; needs Kubernetes)
    straggler_action: Literal["report", "evict"] = "report"
    taint_budget: TaintBudgetConfig = field(default_factory=TaintBudgetConfig)
    # The controller's own Pod (downward API), for Events about the metric pipeline; unset: no such Events.
    pod_namespace: str | None = field(default_factory=lambda: os.environ.get("POD_NAMESPACE") or None)
    pod_name: str | None = field(default_factory=lambda: os.environ.get("POD_NAME") or None)

    def check(self) -> None:
        """Raise ValueError naming the flag when settings cannot work together."""
        if self.ingest_auth == TOKENREVIEW and not self.kubernetes:
            raise ValueError("--ingest-auth tokenreview needs the Kubernetes API (TokenReview): drop --no-kubernetes")
        if self.scrape_interval_s < 0:
            raise ValueError(f"--scrape-interval must be >= 0 (0 turns scraping off), got {self.scrape_interval_s}")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("--tls-cert-file and --tls-key-file go together")
        IngestPolicy(SHARED, self.agent_service_accounts)  # each --agent-service-accounts entry is ns/name
        if self.tokens_file.exists():  # a bad tokens file is refused before the database is touched
            parse_tokens(self.tokens_file.read_text(), str(self.tokens_file))


class ControllerService:
    """`flotilla controller`: build with Settings, then `serve()` (blocks) or `start()`/`stop()` around an app."""

    def __init__(self, settings: Settings, extra_sinks: Sequence[SampleSink] = ()) -> None:
        settings.check()
        self.settings = settings
        engine = create_engine(settings.db_url)
        upgrade(engine)  # an upgraded controller migrates its database, keeping the history
        self.store = Store(engine)
        self.metrics = ControllerMetrics(self.store)
        sinks: list[SampleSink] = [SampleStoreSink(self.store), *extra_sinks]
        if not settings.tokens_file.exists():
            create_tokens_file(settings.tokens_file)
            log.info("created %s with a new admin token (read it from the file)", settings.tokens_file)
        actions: ClusterActions = OfflineActions()
        reviewer = None
        ingest_policy = IngestPolicy(SHARED, settings.agent_service_accounts)
        self.sync: Sync | None = None
        serving_placement = None
        if settings.kubernetes:
            from flotilla.controller import kube  # only with a cluster: keeps --no-kubernetes free of kubeconfig

            api_client = kube.load_config()
            actions = kube.KubeActions(api_client)
            if settings.tokenreview_admins is not None or settings.ingest_auth == TOKENREVIEW:
                reviewer = kube.token_reviewer(api_client, set(settings.tokenreview_admins or ()),
                                               audience=settings.token_audience,
                                               readers=settings.tokenreview_admins is not None)
            if settings.ingest_auth == TOKENREVIEW:
                ingest_policy = IngestPolicy(TOKENREVIEW, settings.agent_service_accounts,
                                             kube.access_reviewer(api_client))
            self.sync = kube.Sync(api_client, self.store, self.metrics)
            serving_placement = kube.ServingPlacement(api_client)
        self.replanner = (ServingReplanner(actions, self.store, self.metrics, settings.replan_policy)
                          if settings.replan and settings.kubernetes else None)
        self.scraper = (EngineScraper(actions, self.replanner.observe, self.metrics, settings.scrape_interval_s)
                        if self.replanner is not None and settings.scrape_interval_s > 0 else None)
        pod = (settings.pod_namespace, settings.pod_name) if settings.pod_namespace and settings.pod_name else None
        self.health = (HealthResponder(self.store, actions, self.metrics, straggler_action=settings.straggler_action,
                                       budget=TaintBudget(settings.taint_budget), pod=pod)
                       if settings.health else None)
        if self.health is not None:
            sinks.append(self.health)
        self.ingestor = Ingestor(sinks, self.metrics, dead_letters=self.store)
        authenticator = TokenAuthenticator(settings.tokens_file, reviewer)
        self.controller = Controller(
            store=self.store, actions=actions, auth=authenticator, ingest_policy=ingest_policy,
            metrics=self.metrics, ingestor=self.ingestor, policy=settings.policy, body_limit=settings.body_limit,
            ingest_limit=settings.ingest_limit, cors_origins=settings.cors_origins,
            on_return_to_service=self.health.release if self.health is not None else None,
            serving_stats=self.replanner.observe if self.replanner is not None else None,
            conditions=self.health.conditions if self.health is not None else None,
            serving_placement=serving_placement)
        self.app = create_app(self.controller)
        checked = settings.ingest_auth == TOKENREVIEW  # every stream entry's token is reviewed
        self.consumer = (RedisConsumer(settings.redis_url, self.ingestor, f"{socket.gethostname()}-{os.getpid()}",
                                       auth=authenticator if checked else None,
                                       policy=ingest_policy if checked else None) if settings.redis_url else None)
        self.retention = Retention(self.store, settings.sample_retention_s)
        self._stop = threading.Event()

    def _retention_loop(self) -> None:
        while not self._stop.wait(self.settings.retention_every_s):
            try:
                dropped = self.retention.run_once()
                if dropped:
                    log.info("retention: dropped %d samples older than %gs", dropped,
                             self.settings.sample_retention_s)
            except Exception as e:
                if is_outage(e):
                    log.warning("retention: the database is unreachable (%s); next run in %gs", type(e).__name__,
                                self.settings.retention_every_s)
                else:
                    log.exception("retention run failed")

    def start(self) -> None:
        threading.Thread(target=self._retention_loop, name="retention", daemon=True).start()
        if self.consumer is not None:
            threading.Thread(target=self.consumer.run, name="redis-ingest", daemon=True).start()
        if self.sync is not None:
            self.sync.start()
        if self.health is not None:
            threading.Thread(target=self.health.run, name="health-tick", daemon=True).start()
        if self.replanner is not None:
            threading.Thread(target=self.replanner.run, name="serving-replan", daemon=True).start()
        if self.scraper is not None:
            threading.Thread(target=self.scraper.run, name="serving-scrape", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self.consumer is not None:
            self.consumer.stop()
        if self.sync is not None:
            self.sync.stop()
        if self.health is not None:
            self.health.stop()
        if self.replanner is not None:
            self.replanner.stop()
        if self.scraper is not None:
            self.scraper.stop()

    def serve(self) -> None:
        self.start()
        tls = self.settings.tls_cert_file
        if self.settings.ingest_auth == TOKENREVIEW and tls is None:
            log.warning("--ingest-auth tokenreview without --tls-cert-file: agents' tokens cross the network in "
                        "plain HTTP")
        if self.settings.ingest_auth == SHARED:
            log.warning("--ingest-auth shared: any ingest token may post samples for any node and statistics for "
                        "any ServingDeployment (development only; production uses --ingest-auth tokenreview)")
        try:
            uvicorn.run(self.app, host=self.settings.host, port=self.settings.port, log_level="info",
                        access_log=False,  # access logs off: no request line with query strings in logs
                        ssl_certfile=str(tls) if tls else None,
                        ssl_keyfile=str(self.settings.tls_key_file) if tls else None)
        finally:
            self.stop()
