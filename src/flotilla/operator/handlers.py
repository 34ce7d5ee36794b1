"""kopf wiring: watches keep an in-memory view; one loop reconciles the whole view.

Watch events only update the view and wake the loop (kopf handlers stay short).
The handlers are coroutines on purpose: kopf runs plain functions in a thread
pool, and the view must only change on the event loop, between reconcile passes.
The loop is level-based: it reconciles everything it sees, on every wake-up and
at least every `resync` seconds, so a missed event or a restart converges.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes import client, config as kube_config

from flotilla import GROUP, VERSION
from flotilla.allocation import Allocator
from flotilla.operator import training, trim
from flotilla.operator.actions import PatchAnnotations, PatchStatus
from flotilla.operator.kube import Kube, RateLimiter
from flotilla.operator.reconcile import reconcile
from flotilla.pool import PoolPolicy
from flotilla.resources import names

log = logging.getLogger("flotilla.operator")
MANAGED = {names.LABEL_MANAGED_BY: names.MANAGED_BY}


_TRIM = {"jobs": trim.trainingjob, "pods": trim.pod}


@dataclass
class View:
    """What the watches have seen, by namespace/name (name alone for Nodes), trimmed to what planning reads.
    A finished job's pods are dropped (`prune`): nothing plans with them any more."""

    jobs: dict[str, dict] = field(default_factory=dict)
    nodes: dict[str, dict] = field(default_factory=dict)
    pods: dict[str, dict] = field(default_factory=dict)
    servings: dict[str, dict] = field(default_factory=dict)
    deployments: dict[str, dict] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def record(self, kind: str, event: dict[str, Any]) -> None:
        if event.get("type") == "DELETED":
            getattr(self, kind).pop(_key(event["object"]), None)
        else:
            self.put(kind, event["object"])
        self.wake.set()

    def put(self, kind: str, obj: dict[str, Any]) -> None:
        store, key = getattr(self, kind), _key(obj)
        old = store.get(key)
        # Keep the newer copy: the loop may already hold a patch response newer than a late event.
        if old is None or int(obj["metadata"].get("resourceVersion", 0)) >= int(old["metadata"].get("resourceVersion", 0)):
            store[key] = _TRIM.get(kind, trim.other)(obj)

    def prune(self) -> None:
        """Forget the pods of finished jobs: a pass then plans with live ones only. (A job not seen yet
        keeps its pods: at start-up the pods may be listed before the jobs.)"""
        for key, pod in list(self.pods.items()):
            job = (pod["metadata"].get("labels") or {}).get(names.LABEL_JOB)
            body = self.jobs.get(f"{pod['metadata']['namespace']}/{job}") if job else None
            if body is not None and training.is_final(body):
                del self.pods[key]


def _key(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]


@dataclass
class Settings:
    allocator: Allocator
    resync_seconds: float = 10.0
    debounce_seconds: float = 0.2
    concurrency: int = 16
    qps: float = 200.0
    burst: int = 400
    max_restarts: int = 3
    pool: PoolPolicy | None = None  # the unified pool's policy; None: serving only holds what it has


view = View()
settings: Settings | None = None


def configure(s: Settings) -> None:
    global settings
    settings = s


SELECTOR = ",".join(f"{k}={v}" for k, v in MANAGED.items())


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.persistence.finalizer = f"{GROUP}/operator"
    # Only the pods and Deployments Flotilla made: filtered by the API server, not after the fact.
    settings.watching.label_selectors["", "v1", "pods"] = SELECTOR
    settings.watching.label_selectors["apps", "v1", "deployments"] = SELECTOR
    memo.loop_task = asyncio.get_running_loop().create_task(_loop())


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    task = getattr(memo, "loop_task", None)
    if task:
        task.cancel()


@kopf.on.event(GROUP, VERSION, "trainingjobs")
async def on_job(event: dict, **_: Any) -> None:
    view.record("jobs", event)


@kopf.on.event(GROUP, VERSION, "servingdeployments")
async def on_serving(event: dict, **_: Any) -> None:
    view.record("servings", event)


@kopf.on.event("", "v1", "nodes")
async def on_node(event: dict, **_: Any) -> None:
    view.record("nodes", event)


@kopf.on.event("", "v1", "pods", labels=MANAGED)
async def on_pod(event: dict, **_: Any) -> None:
    view.record("pods", event)


@kopf.on.event("apps", "v1", "deployments", labels=MANAGED)
async def on_deployment(event: dict, **_: Any) -> None:
    view.record("deployments", event)


def _api_client(connections: int) -> client.ApiClient:
    try:
        kube_config.load_incluster_config()
    except kube_config.ConfigException:
        kube_config.load_kube_config()
    configuration = client.Configuration.get_default_copy()
    # urllib3 keeps this many connections per host (the client's default is 5 x CPU count): one per call in flight.
    configuration.connection_pool_maxsize = connections
    return client.ApiClient(configuration)


async def _loop() -> None:
    assert settings is not None, "flotilla.operator.handlers.configure() was not called"
    kube = Kube(_api_client(settings.concurrency), concurrency=settings.concurrency,
                limiter=RateLimiter(settings.qps, settings.burst))
    # Let the initial lists arrive before the first decision.
    await asyncio.sleep(1.0)
    log.info("reconcile loop started: policy=%s resync=%ss concurrency=%d qps=%s burst=%d unified pool: %s",
             settings.allocator.name, settings.resync_seconds, settings.concurrency, settings.qps, settings.burst,
             settings.pool or "off")
    plan_seconds = 0.0
    while True:
        try:
            await asyncio.wait_for(view.wake.wait(), timeout=settings.resync_seconds)
        except asyncio.TimeoutError:
            pass
        # Every watch event wakes the loop and a pass re-plans everything: when planning is slow (many jobs,
        # a busy machine), wait as long as it took, so that it takes at most half of the operator's CPU.
        await asyncio.sleep(max(settings.debounce_seconds, plan_seconds))
        view.wake.clear()
        try:
            plan_seconds = await _reconcile_once(kube)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("reconcile pass failed; retrying at the next wake-up")


async def _reconcile_once(kube: Kube) -> float:
    """One pass; returns the seconds it spent planning."""
    assert settings is not None
    started = time.perf_counter()
    view.prune()
    actions = reconcile(time.time(), settings.allocator, view.jobs, view.nodes, view.pods, view.servings,
                        view.deployments, settings.max_restarts, settings.pool)
    planned = time.perf_counter()
    done = await kube.apply(actions) if actions else []
    for action, result in done:
        if isinstance(action, (PatchStatus, PatchAnnotations)) and isinstance(result, dict):
            view.put("jobs" if action.plural == "trainingjobs" else "servings", result)
    # One line per pass (INFO when it acted), parsed by bench/scale.py: re-plan time and API requests so far.
    log.log(logging.INFO if actions else logging.DEBUG,
            "reconcile pass: jobs=%d plan_ms=%.1f actions=%d applied=%d apply_ms=%.1f api_requests=%d "
            "throttled_s=%.1f", len(view.jobs), (planned - started) * 1e3, len(actions), len(done),
            (time.perf_counter() - planned) * 1e3, kube.requests, kube.throttled_seconds)
    return planned - started
