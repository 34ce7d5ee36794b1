"""Applies the operator's actions through the Kubernetes API (kubernetes client, in threads)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from kubernetes import client
from kubernetes.client.rest import ApiException

from flotilla import GROUP, VERSION
from flotilla.kubeapi import DEFAULT_TIMEOUT_SECONDS, MERGE_PATCH, EventsApi, NotLeader, Wire, send
from flotilla.operator import failpoints
from flotilla.operator.actions import (
    Action,
    ApplyDeployment,
    ApplyObject,
    CreatePod,
    DeletePod,
    PatchAnnotations,
    PatchStatus,
    PostEvent,
)
from flotilla.operator.pods import controller_ref
from flotilla.operator.recorder import EventRecorder
from flotilla.resources import names

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
    `concurrency` in flight and no faster than the rate limiter allows. Each call has a timeout (the
    client's, see flotilla.kubeapi, bounded by the Lease when fenced); should the client not keep it, the
    call is given up `TIMEOUT_GRACE_SECONDS` later anyway, so that an object is never in flight for good.
    """

    TIMEOUT_GRACE_SECONDS = 5.0

    def __init__(self, api: client.ApiClient, concurrency: int = 16, limiter: RateLimiter | None = None,
                 timeout: float = DEFAULT_TIMEOUT_SECONDS):
        self.wire = Wire(api, FIELD_MANAGER)
        self._limit = asyncio.Semaphore(concurrency)
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="kube")
        self._limiter = limiter or RateLimiter(0, 0)
        self.timeout = timeout
        self.events = EventRecorder(EventsApi(self.wire), FIELD_MANAGER, request_timeout=timeout)
        # Read by the operator's metrics at scrape time (flotilla.operator.metrics).
        self.requests = 0
        self.throttled_seconds = 0.0
        self.in_flight = 0  # sent, not answered
        self.errors: Counter[str] = Counter()  # failed writes by `metrics.api_error_reason`

    async def apply(self, actions: list[Action]) -> list[tuple[Action, Any]]:
        """Runs different objects' chains concurrently; within a chain, the status and annotation
        patches first, in order (they record intent before pods follow), then its pod deletions, then the
        rest concurrently.
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
        # Pods to delete go before pods to create: a worker set's old pods are asked to go before its new ones
        # exist, so that an operator killed in between never leaves two generations running side by side.
        deletes = [a for a in rest if isinstance(a, DeletePod)]
        for batch in (deletes, [a for a in rest if not isinstance(a, DeletePod)]):
            results = await asyncio.gather(*(self._run(a) for a in batch))
            done.extend((a, r) for a, r in zip(batch, results) if r is not None)
        return done

    async def _run(self, action: Action) -> Any:
        async with self._limit:
            wait = self._limiter.delay()
            if wait:
                self.throttled_seconds += wait
                await asyncio.sleep(wait)
            self.requests += 1
            self.in_flight += 1
            try:
                failpoints.hit("before", action)
                call = asyncio.get_running_loop().run_in_executor(self._pool, self._call, action)
                result = await asyncio.wait_for(call, self.timeout + self.TIMEOUT_GRACE_SECONDS)
                failpoints.hit("after", action)
                return result
            except NotLeader as e:  # fenced: not sent
                self.errors["not-leader"] += 1
                log.warning("%s not sent: %s", type(action).__name__, e)
            except TimeoutError as e:  # the client's (ApiTimeout) or, should it not keep it, ours
                self.errors["timeout"] += 1
                log.warning("%s %s timed out (%s); it is planned again on a later pass", type(action).__name__,
                            _target(action), e or f"no answer within {self.timeout + self.TIMEOUT_GRACE_SECONDS:.0f} s")
            except ApiException as e:
                self.errors[f"http-{e.status}"] += 1
                message = _api_message(e)
                # Objects in a namespace being deleted: expected while it goes, not worth a warning.
                level = logging.DEBUG if e.status == 403 and "being terminated" in message else logging.WARNING
                log.log(level, "%s failed: %s %s", type(action).__name__, e.status, message)
            except Exception:  # a network fault must not kill the reconcile loop
                self.errors["other"] += 1
                log.exception("%s failed", type(action).__name__)
            finally:
                self.in_flight -= 1
            return None

    def _call(self, a: Action) -> Any:
        wire = self.wire
        if isinstance(a, PatchStatus):
            return wire.send("PATCH", f"{_custom(a.plural, a.namespace)}/{a.name}/status", {"status": a.status},
                             content_type=MERGE_PATCH, answer=True)
        if isinstance(a, PatchAnnotations):
            return wire.send("PATCH", f"{_custom(a.plural, a.namespace)}/{a.name}",
                             {"metadata": {"annotations": a.annotations}}, content_type=MERGE_PATCH, answer=True)
        if isinstance(a, CreatePod):
            meta = a.manifest["metadata"]
            try:
                wire.send("POST", f"/api/v1/namespaces/{meta['namespace']}/pods", a.manifest,
                          query=[("fieldManager", FIELD_MANAGER)])
                log.info("created pod %s/%s", meta["namespace"], meta["name"])
            except ApiException as e:
                if e.status != 409:
                    raise
                return self._existing_pod_is_ours(a)
            return True
        if isinstance(a, DeletePod):
            # No grace period override: the pod's own terminationGracePeriodSeconds, so that the API server
            # (and the scheduler, which counts its GPUs) keeps it until its containers are gone.
            options = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": a.uid}} if a.uid else None
            try:
                wire.send("DELETE", f"/api/v1/namespaces/{a.namespace}/pods/{a.name}", options)
                log.info("deleted pod %s/%s", a.namespace, a.name)
            except ApiException as e:
                # 404: gone already; 409: the UID precondition failed, the pod planning saw is gone.
                if e.status not in (404, 409):
                    raise
            return True
        if isinstance(a, ApplyDeployment):
            meta = a.manifest["metadata"]
            wire.apply(f"/apis/apps/v1/namespaces/{meta['namespace']}/deployments/{meta['name']}", a.manifest)
            log.info("applied deployment %s/%s replicas=%s", meta["namespace"], meta["name"],
                     a.manifest["spec"]["replicas"])
            return True
        if isinstance(a, ApplyObject):
            return self._apply_object(a.manifest)
        if isinstance(a, PostEvent):
            return self._event(a)
        raise TypeError(f"unknown action {a!r}")

    def _apply_object(self, manifest: dict[str, Any]) -> Any:
        """Server-side apply of a Service or an InferencePool (an endpoint's objects)."""
        meta = manifest["metadata"]
        if manifest["kind"] == "Service":
            path = f"/api/v1/namespaces/{meta['namespace']}/services/{meta['name']}"
        elif manifest["kind"] == "InferencePool":
            path = (f"/apis/{names.INFERENCE_POOL_GROUP}/{names.INFERENCE_POOL_VERSION}/namespaces/{meta['namespace']}"
                    f"/{names.INFERENCE_POOL_PLURAL}/{meta['name']}")
        else:
            raise TypeError(f"no apply for a {manifest['kind']}")
        self.wire.apply(path, manifest)
        log.info("applied %s %s/%s", manifest["kind"], meta["namespace"], meta["name"])
        return True

    def _existing_pod_is_ours(self, a: CreatePod) -> bool | None:
        """A create answered 409: the pod is there. It counts as created only if the owner we would have
        given it controls it; another's (an orphan, a deleted job's of the same name) is never ours."""
        meta = a.manifest["metadata"]
        owner = controller_ref(a.manifest)
        existing = self.wire.send("GET", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", answer=True)
        found = controller_ref(existing)
        if owner is not None and found is not None and found.get("uid") == owner.get("uid"):
            return True
        whose = f"{found.get('kind')} uid {found.get('uid')}" if found else "no controller (an orphan)"
        message = (f"cannot create worker pod {meta['name']}: a pod of that name exists and belongs to {whose}, "
                   f"not to this {owner.get('kind') if owner else 'object'}; it is left alone and not counted")
        log.error("%s/%s: %s", meta["namespace"], meta["name"], message)
        if owner is not None:
            self._event(PostEvent({"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                   "namespace": meta["namespace"], "name": owner["name"], "uid": owner["uid"]},
                                  "Warning", names.Reason.POD_NAME_CONFLICT, message))
        return None

    def _event(self, a: PostEvent) -> Any:
        return self.events.record(a.involved, a.type, a.reason, a.message)


def _custom(plural: str, namespace: str) -> str:
    """The collection; a cluster-scoped one (Queues) when `namespace` is empty."""
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{plural}" if namespace else f"/apis/{GROUP}/{VERSION}/{plural}"


def inference_pools_served(api: client.ApiClient, timeout: float) -> bool:
    """The API server serves InferencePools (the Gateway API Inference Extension's CRD is installed):
    API discovery, which every authenticated client may read."""
    try:
        response = send(api, "GET", f"/apis/{names.INFERENCE_POOL_GROUP}/{names.INFERENCE_POOL_VERSION}",
                        timeout=timeout)
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    try:
        found = json.loads(response.data)
    finally:
        response.release_conn()
    return any(r.get("name") == names.INFERENCE_POOL_PLURAL for r in found.get("resources") or [])


def _target(a: Action) -> str:
    meta = getattr(a, "manifest", None)
    if meta is not None:
        return f"{meta['metadata'].get('namespace')}/{meta['metadata'].get('name')}"
    if isinstance(a, PostEvent):
        return f"{a.involved.get('namespace')}/{a.involved.get('name')}"
    return f"{getattr(a, 'namespace', '')}/{getattr(a, 'name', '')}"


def _api_message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "").get("message", ""))
    except (TypeError, ValueError):
        return str(e.reason)
