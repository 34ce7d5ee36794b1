"""Full lists of what the operator watches, to reconcile its view with (client-go's informer re-list).

kopf re-lists after a watch restart (410 Gone after an API server restart, a failed list) but only
reports what it lists: an object deleted while the watch was not looking stays in the view for good
(a ghost: a pod that is never recreated, a node that receives placements). So the operator lists each
kind itself: before its first pass (a new leader starts from fresh lists, not a cache), soon after
kopf re-lists a kind, and every `--relist-seconds`, and `View.relisted` drops what the list lacks.
"""

from __future__ import annotations

import asyncio
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from kubernetes import client

from flotilla import GROUP, VERSION
from flotilla.operator.view import View

log = logging.getLogger("flotilla.operator.relist")
KINDS = ("nodes", "jobs", "servings", "deployments", "pods")
PAGE = 500
# kopf re-lists in a burst of events: the operator's own list starts once the burst has been quiet this long.
SETTLE_SECONDS = 1.0
RETRY_SECONDS = 5.0


ListCalls = list[Callable[..., Any]]  # one list call per namespace (a method below is named `list`)


class Lister:
    """Lists one kind, all pages, as plain dicts (with apiVersion and kind, as watch events have them),
    with the same namespaces and label selector as the operator's watches."""

    def __init__(self, api: client.ApiClient, namespaces: list[str], selector: str):
        self.core, self.apps, self.custom = client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api)
        self.namespaces, self.selector = list(namespaces), selector

    def list(self, kind: str) -> list[dict[str, Any]]:
        if kind == "nodes":
            return _pages(self.core.list_node)
        return [item for call in self._calls(kind) for item in _pages(call)]

    def _calls(self, kind: str) -> ListCalls:
        def per_namespace(namespaced: Callable[..., Any], everywhere: Callable[..., Any], **kw: Any) -> ListCalls:
            if not self.namespaces:
                return [lambda **more: everywhere(**kw, **more)]
            return [lambda ns=ns, **more: namespaced(ns, **kw, **more) for ns in self.namespaces]

        if kind in ("jobs", "servings"):
            plural = {"jobs": "trainingjobs", "servings": "servingdeployments"}[kind]
            return per_namespace(lambda ns, **kw: self.custom.list_namespaced_custom_object(GROUP, VERSION, ns,
                                                                                            plural, **kw),
                                 lambda **kw: self.custom.list_cluster_custom_object(GROUP, VERSION, plural, **kw))
        if kind == "pods":
            return per_namespace(self.core.list_namespaced_pod, self.core.list_pod_for_all_namespaces,
                                 label_selector=self.selector)
        if kind == "deployments":
            return per_namespace(self.apps.list_namespaced_deployment, self.apps.list_deployment_for_all_namespaces,
                                 label_selector=self.selector)
        raise ValueError(f"unknown kind {kind!r}")


def _pages(call: Callable[..., Any]) -> list[dict[str, Any]]:
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
        token = (body.get("metadata") or {}).get("continue")
        if not token:
            return items


class Relister:
    """Lists kinds in a thread of its own and reconciles the view with them on the event loop."""

    def __init__(self, view: View, lister: Lister, every_s: float):
        self.view, self.lister, self.every_s = view, lister, every_s
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relist")

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
                continue
            dropped = self.view.relisted(kind, objects, requested_at)
            level = logging.WARNING if dropped else logging.DEBUG
            log.log(level, "re-listed %s: %d listed, %d ghosts dropped%s", kind, len(objects), len(dropped),
                    f" ({', '.join(dropped[:5])}{', ...' if len(dropped) > 5 else ''})" if dropped else "")
        return failed

    async def sync(self) -> None:
        """The first full list of every kind; retried until it succeeds."""
        kinds: tuple[str, ...] = KINDS
        while kinds := tuple(await self.relist(kinds)):
            await asyncio.sleep(RETRY_SECONDS)

    async def run(self) -> None:
        """Re-list every `every_s`, soon after kopf re-listed a kind, and every RETRY_SECONDS while a list fails."""
        view, failed = self.view, set[str]()
        while True:
            wait = RETRY_SECONDS if failed else self.every_s
            try:
                await asyncio.wait_for(view.relist_wake.wait(), timeout=wait)
            except asyncio.TimeoutError:
                pass
            view.relist_wake.clear()
            while (quiet := view.clock() - view.listing_seen_at) < SETTLE_SECONDS:
                await asyncio.sleep(SETTLE_SECONDS - quiet)
            if view.relist_wanted or failed:
                kinds = tuple(k for k in KINDS if k in view.relist_wanted or k in failed)
                log.info("re-listing %s: the watch re-listed or a list failed", ", ".join(kinds))
            else:
                kinds = KINDS
            view.relist_wanted.clear()
            failed = set(await self.relist(kinds))


def _reason(e: Exception) -> str:
    status = getattr(e, "status", None)
    return f"{status} {getattr(e, 'reason', '')}".strip() if status else f"{type(e).__name__}: {e}"
