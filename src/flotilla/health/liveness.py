"""Liveness judged by arrival, and silences that belong to the metric pipeline rather than to a node.

A node is alive while its heartbeats *arrive* at the controller: the controller's
clock (`now`) decides, never the sample's own timestamp (agent clocks drift or are
set wrong). A silence many nodes share is not many node faults: the bus, the
controller's ingest or a rack's switch stopped. The rule follows the Kubernetes node
lifecycle controller's zone states (unhealthyZoneThreshold 0.55, and more than two
nodes): in a scope (the cluster, or one topology domain) where at least
`shared_fraction` of the watched nodes and at least `shared_min_nodes` of them are
silent, or where every watched node of the cluster is silent, the silence is a
*pipeline* fault. No node in such a scope is judged; the scope's pipeline fault opens
and, once delivery resumes, every node of the scope is judged afresh (its silence
clock restarts at the resumption). A controller that did not run (a gap between
calls longer than the heartbeat timeout) restarts every silence clock the same way.

Nodes report once per `interval`, at phases spread over the interval, so when the
pipeline stops the first node's silence crosses the timeout up to one interval before
the last one's. A node's silence is therefore confirmed only at the second
evaluation past the timeout (the monitor evaluates every half interval), while its
scopes show no shared *quiet* (more than 1.5 intervals without a heartbeat, i.e. one
beat missed).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal, Mapping

CLUSTER = "cluster"


PipelineReason = Literal["no-delivery", "shared-silence", "controller-stalled"]


@dataclass(frozen=True, slots=True)
class PipelineFinding:
    """A silence of the metric pipeline (not of nodes): opened, or closed when delivery resumed.

    `scope` is "cluster" or "domain/<name>"; `reason` is "no-delivery" (nothing arrived from any node),
    "shared-silence" (a large share of the scope's nodes fell silent together) or "controller-stalled"
    (the controller itself did not run from `since` to `ts`; reported closed at once)."""

    ts: float
    scope: str
    reason: PipelineReason
    silent: tuple[str, ...]
    watched: int
    since: float
    state: Literal["open", "closed"] = "open"

    @property
    def message(self) -> str:
        lasted = round(self.ts - self.since, 1)
        if self.reason == "controller-stalled":
            return f"the controller did not run for {lasted} s; every node's silence clock restarted"
        what = f"{len(self.silent)} of {self.watched} watched nodes ({self.scope}) silent"
        if self.state == "open":
            return f"{self.reason}: {what}; no node is judged on its silence until delivery resumes"
        return f"{self.reason} over after {lasted} s ({what} at the end); nodes are judged afresh from now"


class ClockOffsets:
    """Per node, the smallest `arrival - ts` over the last `window` seconds of arrivals: the agent's clock
    offset plus the fastest delivery. A sample's age at arrival is its own `arrival - ts` minus that, so an
    agent clock set 30 s off changes nothing, and a backlog replayed after a stall shows its age.

    A controller that has just started knows no offset yet, and a backlog replayed to it looks current
    (each entry is the newest seen so far). So an offset counts as *settled* only once it has not dropped
    by more than `tolerance` for `tolerance` seconds of arrivals: while a backlog is being caught up, the
    smallest lag keeps dropping faster than that."""

    def __init__(self, window: float, tolerance: float) -> None:
        self.window, self.tolerance = window, tolerance
        self._lags: dict[str, deque[tuple[float, float]]] = {}
        self._anchor: dict[str, tuple[float, float]] = {}   # node -> (lag it settled on, since when)

    def update(self, node: str, now: float, lag: float) -> None:
        q = self._lags.setdefault(node, deque())
        while q and q[-1][1] >= lag:
            q.pop()
        q.append((now, lag))
        while q[0][0] < now - self.window:
            q.popleft()
        anchor = self._anchor.get(node)
        if anchor is None or q[0][1] < anchor[0] - self.tolerance:
            self._anchor[node] = (q[0][1], now)

    def age(self, node: str, now: float, ts: float) -> float:
        """Seconds the sample took beyond the node's fastest delivery; infinite while the offset is unsettled."""
        anchor = self._anchor.get(node)
        if anchor is None or now - anchor[1] < self.tolerance:
            return float("inf")
        return (now - ts) - self._lags[node][0][1]


class Liveness:
    def __init__(self, *, interval: float, timeout: float, shared_fraction: float, shared_min_nodes: int) -> None:
        self.interval, self.timeout = interval, timeout
        self.shared_fraction, self.shared_min_nodes = shared_fraction, shared_min_nodes
        self.quiet_after = min(1.5 * interval, timeout)
        self._since: dict[str, float] = {}     # node -> start of its current silence (arrival or resumption)
        self._overdue: set[str] = set()        # silent past the timeout at the previous evaluation
        self.open: dict[str, PipelineFinding] = {}   # scope -> open pipeline fault
        self._last_call: float | None = None

    def beat(self, node: str, now: float) -> None:
        self._since[node] = max(now, self._since.get(node, now))

    def forget(self, node: str) -> None:
        """The agent said goodbye, or an admin returned the node to service: not watched until it beats."""
        self._since.pop(node, None)
        self._overdue.discard(node)

    def watched(self, node: str) -> bool:
        return node in self._since

    def silence(self, node: str, now: float) -> float:
        return now - self._since[node]

    def called(self, now: float) -> list[PipelineFinding]:
        """Every call of the monitor: a gap longer than the timeout is the controller's own stall."""
        last, self._last_call = self._last_call, now
        if last is None or now - last <= self.timeout or not self._since:
            return []
        for node in self._since:
            self._since[node] = max(self._since[node], now)
        self._overdue.clear()
        return [PipelineFinding(now, CLUSTER, "controller-stalled", (), len(self._since), last, "closed")]

    def evaluate(self, now: float, domains: Mapping[str, str]) -> tuple[list[str], list[PipelineFinding]]:
        """-> (nodes whose own silence is confirmed now, pipeline findings opened or closed)."""
        silence = {n: now - since for n, since in self._since.items()}
        scopes: dict[str, list[str]] = {CLUSTER: list(silence)}
        for node in silence:
            if node in domains:
                scopes.setdefault(f"domain/{domains[node]}", []).append(node)
        findings: list[PipelineFinding] = []
        held: set[str] = set()
        for scope, members in scopes.items():   # the cluster first: a fault of all of it covers its domains
            if scope != CLUSTER and CLUSTER in self.open:
                continue
            silent = sorted(n for n in members if silence[n] > self.timeout)
            quiet = [n for n in members if silence[n] > self.quiet_after]
            is_cluster = scope == CLUSTER
            current = self.open.get(scope)
            if self._shared(len(silent), len(members), is_cluster):
                held.update(members)
                if current is None:
                    # nothing has arrived from any node for more than a beat: no delivery at all
                    reason: PipelineReason = ("no-delivery" if is_cluster and len(quiet) == len(members)
                                              else "shared-silence")
                    started = now - min(silence[n] for n in silent)
                    self.open[scope] = f = PipelineFinding(now, scope, reason, tuple(silent), len(members), started)
                    findings.append(f)
                continue
            if current is not None:  # delivery resumed: the scope's nodes are judged afresh from now
                del self.open[scope]
                for node in members:
                    self._since[node] = now
                    silence[node] = 0.0
                held.update(members)
                findings.append(PipelineFinding(now, scope, current.reason, tuple(silent), len(members),
                                                current.since, "closed"))
            elif self._shared(len(quiet), len(members), is_cluster):
                held.update(members)
        for scope in [s for s in self.open if s not in scopes]:  # its nodes said goodbye or were released
            current = self.open.pop(scope)
            findings.append(PipelineFinding(now, scope, current.reason, (), 0, current.since, "closed"))
        overdue = {n for n, s in silence.items() if s > self.timeout}
        lost = sorted(n for n in overdue & self._overdue if n not in held)
        self._overdue = overdue - held
        return lost, findings

    def _shared(self, silent: int, members: int, is_cluster: bool) -> bool:
        if silent == 0:
            return False
        if is_cluster and silent == members:
            return True
        return silent >= self.shared_min_nodes and silent >= self.shared_fraction * members

