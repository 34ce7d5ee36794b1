"""Applies the operator's actions through the Kubernetes API (kubernetes client, in threads)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from flotilla import GROUP, VERSION
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


class Kube:
    """Thin executor. Idempotent: creating what exists and deleting what is gone are no-ops."""

    def __init__(self, api: client.ApiClient, concurrency: int = 16):
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self._limit = asyncio.Semaphore(concurrency)
        self.requests = 0

    async def apply(self, actions: list[Action]) -> list[tuple[Action, Any]]:
        """Status and annotation patches first, in order (they record intent before pods follow),
        then the rest concurrently. Returns (action, result) for the actions that succeeded."""
        done: list[tuple[Action, Any]] = []
        ordered = (PatchStatus, PatchAnnotations)
        for a in actions:
            if isinstance(a, ordered):
                result = await self._run(a)
                if result is not None:
                    done.append((a, result))
        rest = [a for a in actions if not isinstance(a, ordered)]
        results = await asyncio.gather(*(self._run(a) for a in rest))
        done.extend((a, r) for a, r in zip(rest, results) if r is not None)
        return done

    async def _run(self, action: Action) -> Any:
        async with self._limit:
            self.requests += 1
            try:
                return await asyncio.to_thread(self._call, action)
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
