"""Applies the operator's actions through the Kubernetes API (kubernetes client, in threads)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from kubernetes import client
from kubernetes.client.rest import ApiException

from flotilla import GROUP, VERSION
from flotilla.operator import failpoints
from flotilla.operator.actions import (
    Action,
    ApplyDeployment,
    CreatePod,
    DeletePod,
    PatchAnnotations,
    PatchStatus,
    PostEvent,
)
from flotilla.operator.timeutil import rfc3339

log = logging.getLogger(__name__)
FIELD_MANAGER = "flotilla-operator"


class RateLimiter:
    """Token bucket: `qps` requests per second on average, bursts of up to `burst`. qps <= 0: no limit."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic):
        if qps > 0 and burst < 1:
            raise ValueError(f"burst must be at least 1 when qps is set, got {burst}")
        self.qps, self.burst, self._clock = qps, burst, clock
        self._tokens, self._at = float(burst), clock()

    def delay(self) -> float:
        """Take one token; seconds to wait before using it (0 when one was there)."""
        if self.qps <= 0:
            return 0.0
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps)
        self._at = now
        self._tokens -= 1.0  # may go negative: later callers queue behind the ones already waiting
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps


ORDERED = (PatchStatus, PatchAnnotations)


def chains(actions: list[Action]) -> list[list[Action]]:
    """Split a pass's actions into chains that may run concurrently with each other.

    Planning emits each object's actions together, its status and annotation patches first
    (`reconcile` concatenates per-object plans). A chain starts at a patch of an object other
    than the current chain's, so every action stays behind the patches that preceded it in
    its object's plan; actions before the first patch form a chain of their own.
    """
    out: list[list[Action]] = []
    owner: tuple[str, str, str] | None = None
    for a in actions:
        if isinstance(a, ORDERED):
            this = (a.plural, a.namespace, a.name)
            if this != owner or not out:
                out.append([])
                owner = this
        elif not out:
            out.append([])
        out[-1].append(a)
    return out


class Kube:
    """Thin executor. Idempotent: creating what exists and deleting what is gone are no-ops.

    Calls run in a thread pool of `concurrency` threads (the client is synchronous), at most
    `concurrency` in flight and no faster than the rate limiter allows.
    """

    def __init__(self, api: client.ApiClient, concurrency: int = 16, limiter: RateLimiter | None = None):
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self._limit = asyncio.Semaphore(concurrency)
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="kube")
        self._limiter = limiter or RateLimiter(0, 0)
        self.requests = 0
        self.throttled_seconds = 0.0

    async def apply(self, actions: list[Action]) -> list[tuple[Action, Any]]:
        """Runs different objects' chains concurrently; within a chain, the status and annotation
        patches first, in order (they record intent before pods follow), then the rest concurrently.
        A chain whose patch failed stops there. Returns (action, result) for the actions that succeeded."""
        done = await asyncio.gather(*(self._chain(c) for c in chains(actions)))
        return [pair for chain in done for pair in chain]

    async def _chain(self, actions: list[Action]) -> list[tuple[Action, Any]]:
        done: list[tuple[Action, Any]] = []
        for a in actions:
            if isinstance(a, ORDERED):
                result = await self._run(a)
                if result is None:
                    return done
                done.append((a, result))
        rest = [a for a in actions if not isinstance(a, ORDERED)]
        results = await asyncio.gather(*(self._run(a) for a in rest))
        done.extend((a, r) for a, r in zip(rest, results) if r is not None)
        return done

    async def _run(self, action: Action) -> Any:
        async with self._limit:
            wait = self._limiter.delay()
            if wait:
                self.throttled_seconds += wait
                await asyncio.sleep(wait)
            self.requests += 1
            try:
                failpoints.hit("before", action)
                result = await asyncio.get_running_loop().run_in_executor(self._pool, self._call, action)
                failpoints.hit("after", action)
                return result
            except ApiException as e:
                message = _api_message(e)
                # Objects in a namespace being deleted: expected while it goes, not worth a warning.
                level = logging.DEBUG if e.status == 403 and "being terminated" in message else logging.WARNING
                log.log(level, "%s failed: %s %s", type(action).__name__, e.status, message)
            except Exception:  # a network fault must not kill the reconcile loop
                log.exception("%s failed", type(action).__name__)
            return None

    def _call(self, a: Action) -> Any:
        if isinstance(a, PatchStatus):
            return self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, a.namespace, a.plural, a.name, {"status": a.status})
        if isinstance(a, PatchAnnotations):
            return self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, a.namespace, a.plural, a.name, {"metadata": {"annotations": a.annotations}})
        if isinstance(a, CreatePod):
            meta = a.manifest["metadata"]
            try:
                self.core.create_namespaced_pod(meta["namespace"], a.manifest, field_manager=FIELD_MANAGER)
                log.info("created pod %s/%s", meta["namespace"], meta["name"])
            except ApiException as e:
                if e.status != 409:
                    raise
            return True
        if isinstance(a, DeletePod):
            try:
                self.core.delete_namespaced_pod(a.name, a.namespace, grace_period_seconds=0)
                log.info("deleted pod %s/%s", a.namespace, a.name)
            except ApiException as e:
                if e.status != 404:
                    raise
            return True
        if isinstance(a, ApplyDeployment):
            meta = a.manifest["metadata"]
            result = self.apps.patch_namespaced_deployment(
                meta["name"], meta["namespace"], a.manifest, field_manager=FIELD_MANAGER, force=True,
                _content_type="application/apply-patch+yaml")
            log.info("applied deployment %s/%s replicas=%s", meta["namespace"], meta["name"],
                     a.manifest["spec"]["replicas"])
            return result
        if isinstance(a, PostEvent):
            return self._event(a)
        raise TypeError(f"unknown action {a!r}")

    def _event(self, a: PostEvent) -> Any:
        now = rfc3339(time.time())
        ns = a.involved.get("namespace") or "default"
        body = {
            "metadata": {"name": f"{a.involved['name']}.{uuid.uuid4().hex[:12]}", "namespace": ns},
            "involvedObject": a.involved,
            "reason": a.reason,
            "message": a.message[:1024],
            "type": a.type,
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        log.info("event %s %s/%s: %s", a.reason, ns, a.involved["name"], a.message)
        return self.core.create_namespaced_event(ns, body)


def _api_message(e: ApiException) -> str:
    import json

    try:
        return json.loads(e.body).get("message", "")
    except (TypeError, ValueError):
        return str(e.reason)
