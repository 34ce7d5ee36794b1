"""Metric ingest: samples from agents (Redis Streams, or HTTP as the fallback) go to a list of sinks.

A sink is anything with `accept(samples)`: the sample store below, and the
health detectors (plugged in by whoever assembles the controller). The Redis
consumer reads stream `flotilla:metrics` in a consumer group, acks each entry
only after every sink has accepted it, and claims entries left pending by a
consumer that died (XAUTOCLAIM), so a batch is never lost with its consumer.

With `--ingest-auth tokenreview` every stream entry carries its agent's token
(field `TOKEN_FIELD`) and is held to the same rule as POST /v1/ingest: its
samples must all be about the node that token is bound to. An entry that fails
is dropped, counted and logged, and never reaches a sink. When the API server
cannot review the token now, the entry stays pending and is read again.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol, Sequence

import redis

from flotilla.controller.auth import ReviewUnavailable, TokenAuthenticator
from flotilla.controller.ingest_auth import UNAUTHENTICATED_REFUSAL, IngestPolicy, Refusal
from flotilla.controller.metrics import ControllerMetrics
from flotilla.controller.store import Store
from flotilla.health.samples import FIELD, STREAM, TOKEN_FIELD, Sample, decode_batch

log = logging.getLogger(__name__)
GROUP = "flotilla-controller"


class SampleSink(Protocol):
    def accept(self, samples: Sequence[Sample]) -> None: ...


class SampleStoreSink:
    """Keeps samples in the database (node evidence in the API); old ones are dropped by `Retention`."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def accept(self, samples: Sequence[Sample]) -> None:
        self.store.add_samples(samples)


class Ingestor:
    """Hands each batch to every sink, in order, and counts it."""

    def __init__(self, sinks: Sequence[SampleSink], metrics: ControllerMetrics | None = None) -> None:
        self.sinks = list(sinks)
        self.metrics = metrics

    def ingest(self, transport: str, samples: Sequence[Sample]) -> None:
        for sink in self.sinks:
            sink.accept(samples)
        if self.metrics is not None:
            self.metrics.ingested(transport, samples, time.time())

    def rejected(self, transport: str, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.rejected(transport, reason)


class RedisConsumer:
    """One consumer of the controller's consumer group on the metrics stream."""

    def __init__(self, url: str, ingestor: Ingestor, consumer: str, *, group: str = GROUP, stream: str = STREAM,
                 count: int = 100, block_ms: int = 1000, claim_idle_ms: int = 30_000,
                 auth: TokenAuthenticator | None = None, policy: IngestPolicy | None = None) -> None:
        self.redis = redis.Redis.from_url(url)
        self.ingestor = ingestor
        self.consumer, self.group, self.stream = consumer, group, stream
        self.count, self.block_ms, self.claim_idle_ms = count, block_ms, claim_idle_ms
        # Both set: every entry must carry a token that may speak for its samples' node (tokenreview mode).
        self.auth, self.policy = auth, policy
        self._reread_own = False  # entries of ours left pending because a review could not be made
        self._stop = threading.Event()

    def _refusal(self, fields: dict[bytes, bytes], samples: Sequence[Sample]) -> tuple[str, Refusal] | None:
        """-> (who, why) when the entry's token may not speak for its samples; raises ReviewUnavailable."""
        if self.auth is None or self.policy is None:
            return None
        token = fields.get(TOKEN_FIELD.encode())
        who = self.auth.identify(token.decode("utf-8", "replace")) if token else None
        if who is None:
            return "an unknown caller", UNAUTHENTICATED_REFUSAL
        refusal = self.policy.samples(who, {s.node for s in samples})
        return (who.name, refusal) if refusal is not None else None

    def ensure_group(self) -> None:
        try:
            self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    def _handle(self, entries: Sequence[tuple[bytes, dict[bytes, bytes]]]) -> int:
        """Process entries and ack them; a malformed or unauthorised entry is logged, counted and acked (it would
        never pass). Stops at an entry whose token cannot be reviewed now (ReviewUnavailable): it and the rest
        stay pending, and are read again."""
        done: list[bytes] = []
        n = 0
        try:
            for entry_id, fields in entries:
                if fields is None:  # deleted from the stream while pending
                    done.append(entry_id)
                    continue
                try:
                    samples = decode_batch(fields[FIELD.encode()])
                except (KeyError, ValueError) as e:
                    log.warning("dropping stream entry %s: %s", entry_id.decode(), e)
                    self.ingestor.rejected("redis", "malformed")
                else:
                    refused = self._refusal(fields, samples)
                    if refused is not None:
                        who, why = refused
                        log.warning("dropping stream entry %s from %s (%s): %s", entry_id.decode(), who, why.reason,
                                    why.message)
                        self.ingestor.rejected("redis", why.reason)
                    else:
                        self.ingestor.ingest("redis", samples)
                        n += len(samples)
                done.append(entry_id)
        except ReviewUnavailable:
            self._reread_own = True
            raise
        finally:
            if done:
                self.redis.xack(self.stream, self.group, *done)
        return n

    def claim_stale(self) -> int:
        """Take over entries another consumer read but did not ack within claim_idle_ms; -> samples handled."""
        n, start = 0, "0-0"
        while True:
            start_raw, entries, *_ = self.redis.xautoclaim(self.stream, self.group, self.consumer,
                                                           self.claim_idle_ms, start, count=self.count)
            n += self._handle(entries)
            start = start_raw.decode() if isinstance(start_raw, bytes) else start_raw
            if start == "0-0" or not entries:
                return n

    def poll(self) -> int:
        """Read and process one round of new entries (first our own pending ones, after a review failed);
        -> samples handled."""
        if self._reread_own:
            reply = self.redis.xreadgroup(self.group, self.consumer, {self.stream: "0"}, count=self.count)
            if not any(entries for _, entries in reply or []):
                self._reread_own = False
                return 0
        else:
            reply = self.redis.xreadgroup(self.group, self.consumer, {self.stream: ">"}, count=self.count,
                                          block=self.block_ms)
        return sum(self._handle(entries) for _, entries in reply or [])

    def pending(self) -> int:
        return int(self.redis.xpending(self.stream, self.group)["pending"])

    def run(self, claim_every_s: float = 10.0) -> None:
        self.ensure_group()
        next_claim = 0.0
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_claim:
                    self.claim_stale()
                    next_claim = time.monotonic() + claim_every_s
                    if self.ingestor.metrics is not None:
                        self.ingestor.metrics.ingest_pending.set(self.pending())
                self.poll()
            except redis.ResponseError as e:
                if "NOGROUP" not in str(e):
                    log.warning("redis ingest: %s; retrying in 1 s", e)
                    self._stop.wait(1.0)
                    continue
                # Redis lost its data (a restart without persistence): the agents' next XADD makes the
                # stream again; the group must be made again too, or nothing is ever consumed.
                log.warning("redis ingest: the consumer group is gone (%s); creating it again", e)
                try:
                    self.ensure_group()
                except redis.RedisError as again:
                    log.warning("redis ingest: %s; retrying in 1 s", again)
                    self._stop.wait(1.0)
            except (redis.RedisError, ReviewUnavailable) as e:
                log.warning("redis ingest: %s; retrying in 1 s", e)
                self._stop.wait(1.0)
            except Exception:  # a sink failed: the entries stay pending (claimed again later); ingest goes on
                log.exception("redis ingest: a sink failed; the batch stays pending, retrying in 1 s")
                self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()


class Retention:
    """Drops samples older than max_age_s, and stored idempotency answers older than a day; decisions are kept."""

    ANSWERS_KEPT_S = 86_400.0

    def __init__(self, store: Store, max_age_s: float) -> None:
        self.store = store
        self.max_age_s = max_age_s

    def run_once(self) -> int:
        now = self.store.clock()
        self.store.drop_answers_before(now - self.ANSWERS_KEPT_S)
        return self.store.drop_samples_before(now - self.max_age_s)
