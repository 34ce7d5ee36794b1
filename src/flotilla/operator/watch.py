"""The operator's watches (client-go's informer): list each kind, then watch it from the list's version.

kopf took every watch event through its handler machinery (a per-object memory, a deep copy of the object
for its diff base, progress storage, loggers) although the operator only records the object: at 1,000 jobs
that was most of the operator's CPU. Here an event costs a JSON parse and `View.record` on the event loop.

Each (kind, namespace) is watched in a thread of its own with the blocking client the lists use; its events
reach the loop in batches. A watch the server ends (`WATCH_SECONDS`) or that breaks (a dropped connection,
an API server restart) resumes from the last resourceVersion it saw, so no event is missed, deletions
included. When the server no longer has that version (410 Gone: compacted, or its watch cache restarted)
the kind is listed afresh and the view is reconciled with the list (`View.relisted` drops what the list
lacks: objects deleted during the gap), then watched from the list's version. Every request has a timeout:
a list the API timeout, a watch's read the server's timeout plus the API timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any, Callable, Iterator

from kubernetes.client.exceptions import ApiException

from flotilla.operator.relist import KINDS, OPTIONAL, Lister, list_pages
from flotilla.operator.view import View

log = logging.getLogger("flotilla.operator.watch")
WATCH_SECONDS = 300  # the API server ends each watch after this long; it is resumed from where it was
RETRY_SECONDS = 5.0
ABSENT_SECONDS = 60.0  # how often a kind whose CRD is not installed is looked for again


class Gone(Exception):
    """The watch's resourceVersion is too old: only a new list can resume it."""


class Informer:
    """Lists and watches one kind in one namespace (None: all, or a cluster-scoped kind) into `view`."""

    def __init__(self, view: View, kind: str, namespace: str | None, call: Callable[..., Any],
                 loop: asyncio.AbstractEventLoop, api_timeout: float):
        self.view, self.kind, self.namespace, self.call = view, kind, namespace, call
        self.loop, self.api_timeout = loop, api_timeout
        self.synced = asyncio.Event()  # set on the loop once the first list is in the view
        self.stopped = threading.Event()
        self.events = self.lists = 0
        self._lock = threading.Lock()
        self._queue: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []  # calls for the loop, in order
        self._scheduled = False  # a `_drain` is on its way to the loop
        self._thread = threading.Thread(target=self._run, name=f"watch-{kind}-{namespace or 'all'}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stopped.set()

    def _run(self) -> None:
        version: str | None = None
        while not self.stopped.is_set():
            try:
                if version is None:
                    version = self._list()
                for event in self._watch(version):
                    if event.get("type") == "BOOKMARK":
                        version = event["object"]["metadata"]["resourceVersion"]
                        continue
                    version = event["object"]["metadata"].get("resourceVersion") or version
                    self.events += 1
                    self._on_loop(self.view.record, self.kind, event)
            except Gone:
                log.info("watch of %s%s: version %s is gone; listing afresh", self.kind, self._where(), version)
                version = None
            except RuntimeError:  # the event loop is closed: the operator is stopping
                return
            except ApiException as e:
                if e.status != 404 or self.kind not in OPTIONAL:
                    log.warning("watch of %s%s broke (%s); resuming in %.0f s", self.kind, self._where(), _reason(e),
                                RETRY_SECONDS)
                    self.stopped.wait(RETRY_SECONDS)
                    continue
                # Its CRD is not installed: there are none (the first pass need not wait); looked for again later.
                if not self.synced.is_set():
                    log.info("%s are not served (their CRD is not installed): none, looked for every %.0f s",
                             self.kind, ABSENT_SECONDS)
                self._on_loop(self._relisted, [], self.view.clock())
                version = None
                self.stopped.wait(ABSENT_SECONDS)
            except Exception as e:  # the API server away or slow: resume from the same version
                log.warning("watch of %s%s broke (%s); resuming in %.0f s", self.kind, self._where(), _reason(e),
                            RETRY_SECONDS)
                self.stopped.wait(RETRY_SECONDS)

    def _list(self) -> str:
        requested_at = self.view.clock()
        items, version = list_pages(self.call)
        self.lists += 1
        self._on_loop(self._relisted, items, requested_at)
        return version

    def _relisted(self, items: list[dict[str, Any]], requested_at: float) -> None:
        dropped = self.view.relisted(self.kind, items, requested_at, namespace=self.namespace)
        log.log(logging.WARNING if dropped else logging.DEBUG, "listed %s%s: %d objects, %d ghosts dropped%s",
                self.kind, self._where(), len(items), len(dropped),
                f" ({', '.join(dropped[:5])}{', ...' if len(dropped) > 5 else ''})" if dropped else "")
        self.synced.set()

    def _watch(self, version: str) -> Iterator[dict[str, Any]]:
        try:
            response = self.call(watch=True, resource_version=version, allow_watch_bookmarks=True,
                                 timeout_seconds=WATCH_SECONDS, _preload_content=False,
                                 _request_timeout=(self.api_timeout, WATCH_SECONDS + self.api_timeout))
        except ApiException as e:
            if e.status == 410:
                raise Gone() from e
            raise
        try:
            for line in response:
                if self.stopped.is_set():
                    return
                if not line.strip():
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    if status.get("code") == 410:
                        raise Gone()
                    raise ApiException(status=status.get("code"), reason=status.get("message"))
                yield event
        finally:
            response.release_conn()

    def _on_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run `fn(*args)` on the event loop, in order. Calls are handed over in batches: waking the loop
        once per event (a write to its self-pipe, a turn of its selector) cost more than taking the event."""
        with self._lock:
            self._queue.append((fn, args))
            if self._scheduled:
                return
            self._scheduled = True
        self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            batch, self._queue, self._scheduled = self._queue, [], False
        for fn, args in batch:
            fn(*args)

    def _where(self) -> str:
        return f" in {self.namespace}" if self.namespace else ""


def informers(view: View, lister: Lister, loop: asyncio.AbstractEventLoop, api_timeout: float) -> list[Informer]:
    """One per kind the operator watches and namespace it watches (one for all when it watches all)."""
    return [Informer(view, kind, namespace, call, loop, api_timeout)
            for kind in KINDS for namespace, call in lister.sources(kind)]


def _reason(e: Exception) -> str:
    status = getattr(e, "status", None)
    return f"{status} {getattr(e, 'reason', '')}".strip() if status else f"{type(e).__name__}: {e}"
