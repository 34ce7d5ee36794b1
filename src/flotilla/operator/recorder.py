"""Posts Events as `flotilla.operator.events` decides: the API glue, shared by the operator and the controller."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Mapping

from kubernetes.client.rest import ApiException

from flotilla.kubeapi import as_body
from flotilla.operator.events import Bump, Create, Drop, EventCorrelator

log = logging.getLogger(__name__)


class EventRecorder:
    """`record` one occurrence: a new Event, a count bump of the same Event, or nothing (spam filter).

    A create answered 409 finds this component's Event from before a restart (names are deterministic)
    and continues its count; a bump answered 404 (the Event expired) creates it again. Each API call
    has a timeout; a failed one raises to the caller, which logs it (an Event is never worth a retry).
    `core`: a CoreV1Api, or anything with its three Event calls (the operator's `flotilla.kubeapi.EventsApi`).
    """

    def __init__(self, core: Any, component: str, clock: Callable[[], float] = time.time,
                 correlator: EventCorrelator | None = None, request_timeout: float = 10.0) -> None:
        self.core, self.clock, self.timeout = core, clock, request_timeout
        self.correlator = correlator or EventCorrelator(component)
        self._lock = threading.Lock()  # the executor calls from many threads
        self._warned: dict[tuple[str, str, str, str], float] = {}
        self.dropped = 0

    def record(self, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> Any:
        now = self.clock()
        with self._lock:
            decision = self.correlator.observe(involved, type_, reason, message, now)
            if isinstance(decision, Drop):
                self.dropped += 1
                obj = decision.key.object
                if now - self._warned.get(obj, float("-inf")) >= self.correlator.window_s:
                    self._warned[obj] = now
                    log.warning("dropping Events: %s (first dropped: %s %s)", decision.why, reason, message[:200])
                return True
        log.info("event %s %s/%s: %s", reason, decision.namespace, involved.get("name"), message)
        if isinstance(decision, Create):
            try:
                return _released(self.core.create_namespaced_event(
                    decision.namespace, as_body(decision.body), _request_timeout=self.timeout, _preload_content=False))
            except ApiException as e:
                if e.status != 409:
                    raise
            existing = self.core.read_namespaced_event(decision.name, decision.namespace, _request_timeout=self.timeout)
            count = int(existing.count or 1) + 1
            with self._lock:
                self.correlator.settled(decision.key, count)
            return self._patch(decision.name, decision.namespace,
                               {"count": count, "lastTimestamp": decision.body["lastTimestamp"]})
        assert isinstance(decision, Bump)
        try:
            return self._patch(decision.name, decision.namespace, decision.patch)
        except ApiException as e:
            if e.status != 404:
                raise
        body = self.correlator.body(involved, decision.key, decision.name,
                                    decision.patch.get("message", decision.key.message), now,
                                    count=decision.patch["count"])
        return _released(self.core.create_namespaced_event(decision.namespace, as_body(body),
                                                           _request_timeout=self.timeout, _preload_content=False))

    def _patch(self, name: str, namespace: str, patch: dict[str, Any]) -> Any:
        return _released(self.core.patch_namespaced_event(name, namespace, patch, _request_timeout=self.timeout,
                                                          _preload_content=False))


def _released(response: Any) -> Any:
    """An answer asked for without its typed model (`_preload_content=False`: nobody reads the Event back,
    and building the model costs more CPU than the request): read and its connection given back."""
    if hasattr(response, "release_conn"):  # a urllib3 response (the kubernetes client's transport)
        response.drain_conn()
        response.release_conn()
        return True
    return response
