"""Leader election through a coordination.k8s.io Lease, so that of N operator replicas exactly one acts.

kopf's peering is not leader election (replicas of equal priority all pause), so the operator
waits for the Lease before kopf starts at all. The rules are client-go's:

* a Lease held by someone else is taken over only once its record has not changed for
  `leaseDurationSeconds`, measured on our own monotonic clock from when we last saw it change
  (so clocks on different machines need not agree);
* every write is a replace guarded by the resourceVersion we read, so of two candidates racing
  for the same expired Lease exactly one succeeds;
* the leader renews every `renew_every` seconds and gives up (the process exits) when it has not
  renewed for `renew_deadline` < duration, i.e. before anyone else may take over;
* writes are fenced (`LeaseFence`): each is sent only while less than `renew_deadline` has passed since
  the last successful renewal was sent, with a timeout that ends before the Lease could be taken. A
  process stopped (SIGSTOP, a VM pause) past its Lease finds, on its monotonic clock, that the time
  has passed: its first write after resuming is refused and it steps down;
* on a clean exit the leader releases the Lease (empty holder) so a standby takes over at once.

`next_record` is the pure decision; `LeaseFence` the pure fencing rule; `LeaderElector` is the thin
glue around the Lease API.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Callable

from flotilla.kubeapi import DEFAULT_TIMEOUT_SECONDS, NotLeader

log = logging.getLogger("flotilla.operator.leader")


@dataclass(frozen=True)
class LeaseRecord:
    holder: str  # "" when released
    duration_s: int
    transitions: int = 0
    acquire_time: str | None = None
    renew_time: str | None = None


@dataclass(frozen=True)
class Observed:
    """The Lease as we last read it, and when (our monotonic clock) its record last changed."""

    record: LeaseRecord
    changed_at: float
    resource_version: str


def next_record(observed: Observed | None, me: str, duration_s: int, now_mono: float,
                now_wall: str) -> LeaseRecord | None:
    """The record to write to become or stay leader, or None to wait (someone else holds a live lease)."""
    if observed is None:
        return LeaseRecord(holder=me, duration_s=duration_s, acquire_time=now_wall, renew_time=now_wall)
    current = observed.record
    if current.holder == me:
        return replace(current, duration_s=duration_s, renew_time=now_wall)
    live = current.holder and now_mono - observed.changed_at < current.duration_s
    if live:
        return None
    return LeaseRecord(holder=me, duration_s=duration_s, transitions=current.transitions + 1,
                       acquire_time=now_wall, renew_time=now_wall)


def _micro_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _spec(record: LeaseRecord) -> dict[str, Any]:
    return {"holderIdentity": record.holder, "leaseDurationSeconds": record.duration_s,
            "leaseTransitions": record.transitions, "acquireTime": record.acquire_time,
            "renewTime": record.renew_time}


def _record(spec: dict[str, Any]) -> LeaseRecord:
    return LeaseRecord(holder=spec.get("holderIdentity") or "", duration_s=int(spec.get("leaseDurationSeconds") or 0),
                       transitions=int(spec.get("leaseTransitions") or 0), acquire_time=spec.get("acquireTime"),
                       renew_time=spec.get("renewTime"))


class LeaseFence:
    """Whether our Lease is certainly still ours, on our own monotonic clock.

    Counted from when the last successful renewal was *sent*: the Lease record changed after that, and
    another candidate counts `duration` from when it saw the record change, so the Lease is ours until
    at least sent + duration. Writes stop earlier, at sent + renew_deadline, and a write's timeout ends
    by sent + duration."""

    def __init__(self, duration_s: float, renew_deadline_s: float, clock: Callable[[], float] = time.monotonic):
        self.duration_s, self.renew_deadline_s, self.clock = duration_s, renew_deadline_s, clock
        self.renewed_at: float | None = None

    def renewed(self, sent_at: float) -> None:
        self.renewed_at = sent_at

    def until_deadline(self) -> float:
        """Seconds left before writes stop (negative: past the deadline; -inf: never held)."""
        if self.renewed_at is None:
            return float("-inf")
        return self.renewed_at + self.renew_deadline_s - self.clock()

    def lapse(self) -> str | None:
        """Why no write may be sent now, or None when one may."""
        if self.renewed_at is None:
            return "not held"
        since = self.clock() - self.renewed_at
        if since >= self.renew_deadline_s:
            return f"not renewed for {since:.1f} s (renew deadline {self.renew_deadline_s:.1f} s)"
        return None

    def bound(self, timeout: float) -> float:
        """The timeout a write sent now may have; raises NotLeader when none may be sent."""
        why = self.lapse()
        if why is not None:
            raise NotLeader(f"lease {why}")
        assert self.renewed_at is not None
        return min(timeout, self.renewed_at + self.duration_s - self.clock())


class LostLeadership(Exception):
    pass


class LeaderElector:
    """One candidate. `await acquire()` returns once leader; `await hold()` returns never, or raises
    LostLeadership; `release()` hands the Lease back."""

    def __init__(self, api: Any, namespace: str, name: str, identity: str, duration_s: int = 15,
                 renew_every_s: float = 2.0, renew_deadline_s: float | None = None,
                 retry_every_s: float = 2.0, clock: Callable[[], float] = time.monotonic,
                 api_timeout_s: float = DEFAULT_TIMEOUT_SECONDS):
        """`api` is a kubernetes.client.CoordinationV1Api (on a client of its own: Lease calls are not fenced)."""
        if duration_s < 2:
            raise ValueError("lease duration must be at least 2 seconds")
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.duration_s = duration_s
        self.renew_every_s = renew_every_s
        self.renew_deadline_s = renew_deadline_s if renew_deadline_s is not None else duration_s * 2 / 3
        if not renew_every_s < self.renew_deadline_s < duration_s:
            raise ValueError("need renew interval < renew deadline < lease duration")
        self.retry_every_s = retry_every_s
        self.clock = clock
        self.api_timeout_s = api_timeout_s
        self.fence = LeaseFence(duration_s, self.renew_deadline_s, clock)
        self._observed: Observed | None = None

    def _timeout(self) -> float:
        """A Lease call while leader need not outlast the renew deadline: past it, we step down anyway."""
        left = self.fence.until_deadline()
        return self.api_timeout_s if left == float("-inf") else max(0.1, min(self.api_timeout_s, left))

    def _read(self) -> Observed | None:
        from kubernetes.client.rest import ApiException

        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=self._timeout())
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        raw = self.api.api_client.sanitize_for_serialization(lease)
        record = _record(raw.get("spec") or {})
        changed_at = self.clock()
        if self._observed is not None and self._observed.record == record:
            changed_at = self._observed.changed_at
        return Observed(record, changed_at, raw["metadata"]["resourceVersion"])

    def try_once(self) -> bool:
        """One round: read, decide, write. True when we hold the Lease after it."""
        from kubernetes.client.rest import ApiException

        sent_at = self.clock()
        self._observed = self._read()
        want = next_record(self._observed, self.identity, self.duration_s, self.clock(), _micro_time(time.time()))
        if want is None:
            return False
        body: dict[str, Any] = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                "metadata": {"name": self.name, "namespace": self.namespace}, "spec": _spec(want)}
        try:
            if self._observed is None:
                self.api.create_namespaced_lease(self.namespace, body, _request_timeout=self._timeout())
            else:
                body["metadata"]["resourceVersion"] = self._observed.resource_version
                self.api.replace_namespaced_lease(self.name, self.namespace, body, _request_timeout=self._timeout())
        except ApiException as e:
            if e.status in (409, 422):  # someone else wrote first: re-read next round
                return False
            raise
        self.fence.renewed(sent_at)
        return True

    async def _try(self) -> bool:
        try:
            return await asyncio.to_thread(self.try_once)
        except Exception as e:  # API unreachable or refused: not leader this round
            log.warning("lease %s/%s: %s", self.namespace, self.name, e)
            return False

    async def acquire(self) -> None:
        log.info("waiting for lease %s/%s as %s", self.namespace, self.name, self.identity)
        while not await self._try():
            await asyncio.sleep(self.retry_every_s)
        log.info("became leader: lease %s/%s held by %s", self.namespace, self.name, self.identity)

    async def hold(self) -> None:
        """Renew until the Lease is lost: raises LostLeadership once another holds it, or once it was not
        renewed by the deadline (also after a pause: the monotonic clock counts the time stopped)."""
        assert self.fence.renewed_at is not None, "hold() before acquire()"
        while True:
            await asyncio.sleep(max(0.0, min(self.renew_every_s, self.fence.until_deadline())))
            self._check_deadline()
            if await self._try():
                continue
            holder = self._observed.record.holder if self._observed else self.identity
            if holder != self.identity:
                raise LostLeadership(f"lease {self.namespace}/{self.name} is now held by {holder or 'nobody'}")
            self._check_deadline()

    def _check_deadline(self) -> None:
        why = self.fence.lapse()
        if why is not None:
            raise LostLeadership(f"lease {self.namespace}/{self.name} {why}")

    def release(self) -> None:
        """Hand the Lease back if we still hold it (a clean shutdown), so a standby needs not wait it out."""
        try:
            observed = self._read()
            if observed is None or observed.record.holder != self.identity:
                return
            now = _micro_time(time.time())
            released = replace(observed.record, holder="", duration_s=1, renew_time=now)
            self.api.replace_namespaced_lease(self.name, self.namespace, {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": observed.resource_version},
                "spec": _spec(released)}, _request_timeout=self._timeout())
            log.info("released lease %s/%s", self.namespace, self.name)
        except Exception as e:  # it expires on its own
            log.warning("could not release lease %s/%s: %s", self.namespace, self.name, e)


async def serve_liveness(url: str) -> asyncio.AbstractServer:
    """A minimal `200 ok` HTTP endpoint on the URL's host:port, answered from the event loop (so it also
    says the loop is responsive). Used instead of kopf's probe, which exists only once kopf runs."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if not parts.port:
        raise ValueError(f"--liveness {url!r}: needs an explicit port")

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(answer, parts.hostname or "0.0.0.0", parts.port)


async def run_elected(elector: LeaderElector, main: Callable[[], Any], liveness_url: str | None) -> int:
    """Wait for the Lease, then run `main()` (a coroutine factory) while renewing it. Returns 0 when
    `main` ends, 1 when leadership is lost (main is cancelled: the process should exit and restart)."""
    server = await serve_liveness(liveness_url) if liveness_url else None
    leading = False
    try:
        await elector.acquire()
        leading = True
        work = asyncio.create_task(main())
        keep = asyncio.create_task(elector.hold())
        done, _ = await asyncio.wait({work, keep}, return_when=asyncio.FIRST_COMPLETED)
        if keep in done:
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            # The reconcile loop's writes are already refused by the fence; the process exits 1 and its
            # Deployment restarts it as a standby, which starts again from fresh lists.
            log.error("%s: refusing writes and stepping down", keep.exception())
            leading = False
            return 1
        keep.cancel()
        await work
        return 0
    finally:
        if server is not None:
            server.close()
        if leading:
            await asyncio.to_thread(elector.release)
