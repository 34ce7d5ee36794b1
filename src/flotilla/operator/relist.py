"""Full lists of what the operator watches, to reconcile its view with.

An object deleted while no watch was looking would stay in the view for good (a ghost: a pod that is never
recreated, a node that receives placements). The watches (flotilla.operator.watch) list each kind before
the first pass (a new leader starts from fresh lists, not a cache) and again whenever a watch cannot resume
where it was; on top of that every kind is listed every `--relist-seconds` (longer when a list is slow:
RELIST_SHARE), and `View.relisted` drops what a list lacks.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from flotilla import GROUP, VERSION
from flotilla.kubeapi import send
from flotilla.operator.view import View

log = logging.getLogger("flotilla.operator.relist")
KINDS = ("nodes", "jobs", "servings", "deployments", "pods", "queues")
# Kinds whose CRD may not be installed (a chart upgrade does not upgrade CRDs): none of them, not an error.
OPTIONAL = ("queues",)
PAGE = 500
RETRY_SECONDS = 5.0
# A full re-list takes at most this share of the wall clock: at 15,000 jobs one lists ~30,000 objects and
# costs seconds of the operator's CPU (and the API server's), so the period stretches beyond `every_s`.
RELIST_SHARE = 0.05


# (namespace, its list call) per namespace watched (the alias: a method below is named `list`)
Sources = list[tuple[str | None, Callable[..., Any]]]


class Lister:
    """Lists one kind, all pages, as plain dicts (with apiVersion and kind, as watch events have them),
    with the same namespaces and label selector as the operator's watches. Requests go out as such
    (`flotilla.kubeapi.send`), not through the client's typed API classes."""

    def __init__(self, api: client.ApiClient, namespaces: list[str], selector: str):
        self.api, self.namespaces, self.selector = api, list(namespaces), selector

    def list(self, kind: str) -> list[dict[str, Any]]:
        try:
            return [item for _, call in self.sources(kind) for item in list_pages(call)[0]]
        except ApiException as e:
            if e.status == 404 and kind in OPTIONAL:
                return []
            raise

    def sources(self, kind: str) -> Sources:
        """(namespace, the list call) for each namespace watched (None: all, or a cluster-scoped kind); each
        call takes the list's or the watch's own parameters (the typed client's names: limit, _continue,
        watch, resource_version, allow_watch_bookmarks, timeout_seconds, _request_timeout) and answers
        the reply unread."""
        if kind == "nodes":
            return [(None, self._getter("/api/v1/nodes"))]
        if kind == "queues":  # cluster-scoped: one watch whatever namespaces the operator serves
            return [(None, self._getter(f"/apis/{GROUP}/{VERSION}/queues"))]
        selector = {"label_selector": self.selector} if kind in ("pods", "deployments") else {}
        collection = {"jobs": f"/apis/{GROUP}/{VERSION}/{{}}trainingjobs",
                      "servings": f"/apis/{GROUP}/{VERSION}/{{}}servingdeployments",
                      "pods": "/api/v1/{}pods", "deployments": "/apis/apps/v1/{}deployments"}.get(kind)
        if collection is None:
            raise ValueError(f"unknown kind {kind!r}")
        if not self.namespaces:
            return [(None, self._getter(collection.format(""), **selector))]
        return [(ns, self._getter(collection.format(f"namespaces/{ns}/"), **selector)) for ns in self.namespaces]

    def _getter(self, path: str, **fixed: Any) -> Callable[..., Any]:
        def call(**kw: Any) -> Any:
            timeout = kw.pop("_request_timeout", None)
            kw.pop("_preload_content", None)
            query = [(_QUERY[k], str(v).lower() if isinstance(v, bool) else v)
                     for k, v in {**fixed, **kw}.items() if v is not None]
            return send(self.api, "GET", path, query=query, timeout=timeout)
        return call


_QUERY = {"limit": "limit", "_continue": "continue", "label_selector": "labelSelector", "watch": "watch",
          "resource_version": "resourceVersion", "allow_watch_bookmarks": "allowWatchBookmarks",
          "timeout_seconds": "timeoutSeconds"}


def list_pages(call: Callable[..., Any]) -> tuple[list[dict[str, Any]], str]:
    """All pages of a list, as plain dicts (with apiVersion and kind, as watch events have them), and the
    list's resourceVersion (every page of a list is of the same version)."""
    items: list[dict[str, Any]] = []
    token = None
    while True:
        response = call(limit=PAGE, _continue=token, _preload_content=False)
        body = json.loads(response.data)
        kind = str(body.get("kind") or "").removesuffix("List")
        for item in body.get("items") or []:
            item.setdefault("apiVersion", body.get("apiVersion"))
            item.setdefault("kind", kind)
            items.append(item)
        meta = body.get("metadata") or {}
        token = meta.get("continue")
        if not token:
            return items, str(meta.get("resourceVersion") or "")


class Relister:
    """Lists kinds in a thread of its own and reconciles the view with them on the event loop."""

    def __init__(self, view: View, lister: Lister, every_s: float):
        self.view, self.lister, self.every_s = view, lister, every_s
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relist")
        # For the operator's metrics: lists by (kind, ok | failed), and ghosts dropped by kind.
        self.counts: Counter[tuple[str, str]] = Counter()
        self.ghosts: Counter[str] = Counter()

    async def relist(self, kinds: tuple[str, ...] = KINDS) -> list[str]:
        """Lists and reconciles each kind; returns the kinds whose list failed (logged)."""
        failed = []
        for kind in kinds:
            requested_at = self.view.clock()
            try:
                objects = await asyncio.get_running_loop().run_in_executor(self._thread, self.lister.list, kind)
            except Exception as e:  # the API server is down or slow: the watches keep what they have
                log.warning("could not re-list %s (%s); trying again in %.0f s", kind, _reason(e), RETRY_SECONDS)
                failed.append(kind)
                self.counts[(kind, "failed")] += 1
                continue
            dropped = self.view.relisted(kind, objects, requested_at)
            self.counts[(kind, "ok")] += 1
            self.ghosts[kind] += len(dropped)
            level = logging.WARNING if dropped else logging.DEBUG
            log.log(level, "re-listed %s: %d listed, %d ghosts dropped%s", kind, len(objects), len(dropped),
                    f" ({', '.join(dropped[:5])}{', ...' if len(dropped) > 5 else ''})" if dropped else "")
        return failed

    async def run(self) -> None:
        """Re-list every `every_s`, or longer while a re-list takes more than RELIST_SHARE of that (at once
        when `view.relist_wake` is set), and every RETRY_SECONDS while a list fails."""
        view, failed, took = self.view, set[str](), 0.0
        while True:
            wait = RETRY_SECONDS if failed else self.period(took)
            try:
                await asyncio.wait_for(view.relist_wake.wait(), timeout=wait)
            except asyncio.TimeoutError:
                pass
            view.relist_wake.clear()
            kinds = tuple(k for k in KINDS if k in failed) or KINDS
            started = view.clock()
            failed = set(await self.relist(kinds))
            if kinds == KINDS:
                took = view.clock() - started
                log.debug("re-listed every kind in %.1f s; the next full re-list in %.0f s", took, self.period(took))

    def period(self, took: float) -> float:
        """Seconds from one full re-list to the next when the last took `took` seconds."""
        return max(self.every_s, took * (1 - RELIST_SHARE) / RELIST_SHARE)


def _reason(e: Exception) -> str:
    status = getattr(e, "status", None)
    return f"{status} {getattr(e, 'reason', '')}".strip() if status else f"{type(e).__name__}: {e}"
