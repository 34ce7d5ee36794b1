"""Serving statistics pulled from the engines: the controller scrapes their Prometheus endpoints.

Every `--scrape-interval` seconds, for each ServingDeployment, the controller lists the Ready pods its decode
Service selects (`flotilla.dev/serving`, `flotilla.dev/role: decode`) and GETs `http://<pod IP>:<spec.endpoint.port>
/metrics` from each (vLLM's metric names, flotilla.controller.vllm). Pods rather than the Service's
EndpointSlices: the same addresses, and the e2e tests' loopback pod IPs are refused in EndpointSlices. Decode instances see every request from arrival to its
last token (a decode instance calls a prefill instance first), so their counters are the deployment's;
prefill instances are not added in (that would count each request twice).

Two scrapes make a window: per pod, the difference between this scrape and the one before, summed over
pods. A pod seen for the first time started within the window, so its counters count whole; a pod
whose previous scrape failed, or whose counters went down (a restart), only gives a baseline this
time. The window goes to the re-planner (`ServingReplanner.observe`), as a pushed one does: pushing
stays for routers that aggregate. A failed scrape (no endpoints, connection, HTTP status, text that is
not the exposition format) is logged and counted (`flotilla_serving_scrape_failures_total`) and never
stops the loop.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import httpx

from flotilla.controller import vllm
from flotilla.controller.actions import ClusterActionError, ClusterActions
from flotilla.controller.metrics import ControllerMetrics
from flotilla.resources import names
from flotilla.serving.replan import ObservedWindow

log = logging.getLogger(__name__)
PLURAL = "servingdeployments"


class ScrapeError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def http_get(timeout: float) -> Callable[[str], str]:
    client = httpx.Client(timeout=timeout)

    def get(url: str) -> str:
        try:
            r = client.get(url)
        except httpx.HTTPError as e:
            raise ScrapeError("connect", f"{url}: {e or type(e).__name__}") from None
        if r.status_code != 200:
            raise ScrapeError("http", f"{url}: HTTP {r.status_code}")
        return r.text

    return get


@dataclass
class _Last:
    time: float
    pods: dict[str, vllm.Scrape] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)  # every pod scraped once, ever


def combine(previous: _Last | None, scrapes: dict[str, vllm.Scrape], now: float) -> ObservedWindow | None:
    """The window from the previous round to this one (None on the first round, or with nothing new)."""
    if previous is None:
        return None
    old, new = vllm.Scrape(previous.time), vllm.Scrape(now)
    for pod, s in scrapes.items():
        before = previous.pods.get(pod)
        if before is None and pod in previous.seen:
            continue  # its last scrape failed: no baseline this round
        if before is not None and s.requests < before.requests:
            continue  # restarted: counters went back
        vllm.add(new, s)
        if before is not None:
            vllm.add(old, before)
    return vllm.window(old, new)


class EngineScraper:
    def __init__(self, actions: ClusterActions, observe: Callable[[str, ObservedWindow], None],
                 metrics: ControllerMetrics, interval: float, get: Callable[[str], str] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.actions, self.observe, self.metrics, self.interval = actions, observe, metrics, interval
        self.get = get or http_get(timeout=max(1.0, min(5.0, interval / 2)))
        self.clock = clock
        self._last: dict[str, _Last] = {}
        self._stop = threading.Event()

    def step(self) -> None:
        live = set()
        for body in self.actions.list_objects(PLURAL):
            meta = body["metadata"]
            key = f"{meta['namespace']}/{meta['name']}"
            live.add(key)
            try:
                self._scrape_one(key, meta["namespace"], meta["name"],
                                 int((body["spec"].get("endpoint") or {}).get("port") or names.ENGINE_PORT))
            except ClusterActionError as e:
                self._failed("endpoints", f"{key}: {e}")
        for gone in set(self._last) - live:
            del self._last[gone]

    def _scrape_one(self, key: str, namespace: str, name: str, port: int) -> None:
        targets = self.actions.ready_pods(namespace, {names.LABEL_SERVING: name, names.LABEL_ROLE: names.ROLE_DECODE})
        now = self.clock()
        scrapes: dict[str, vllm.Scrape] = {}
        for pod, ip in targets:
            address = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
            try:
                scrapes[pod] = vllm.parse(self.get(f"http://{address}/metrics"), now)
            except ScrapeError as e:
                self._failed(e.reason, f"{key}: {e}")
                continue
            except ValueError as e:
                self._failed("parse", f"{key}: {address}/metrics is not Prometheus text: {e}")
                continue
            self.metrics.serving_scrapes.labels("ok").inc()
        previous = self._last.get(key)
        window = combine(previous, scrapes, now)
        self._last[key] = _Last(now, scrapes, (previous.seen if previous else set()) | set(scrapes))
        if window is not None:
            self.observe(key, window)

    def _failed(self, reason: str, message: str) -> None:
        log.warning("serving scrape failed (%s): %s", reason, message)
        self.metrics.serving_scrapes.labels("failed").inc()
        self.metrics.serving_scrape_failures.labels(reason).inc()

    def run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.step()
            except Exception:
                log.exception("serving scrape pass failed")

    def stop(self) -> None:
        self._stop.set()
