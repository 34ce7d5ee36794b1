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

Both transports validate with `Sample.from_dict` (one validator). A sample that can never be stored is
dead-lettered: kept in the `dead_letters` table with the raw sample and why, counted in
`flotilla_ingest_dead_letters_total`, logged once (one line), and acknowledged, so that it never blocks the
samples beside or behind it. That is a sample the validator refuses (a stream entry that is no sample batch at
all is one dead letter), a sample the database refuses (found by storing the batch one sample a
transaction when the batch is refused), and an entry on which a sink fails with anything but an outage. While
the database is unreachable nothing is dead-lettered: the entry stays pending and is read again.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import redis

from flotilla.controller.auth import ReviewUnavailable, TokenAuthenticator
from flotilla.controller.db import is_outage
from flotilla.controller.ingest_auth import UNAUTHENTICATED_REFUSAL, IngestPolicy, Refusal
from flotilla.controller.metrics import ControllerMetrics
from flotilla.controller.store import Store
from flotilla.health.samples import FIELD, STREAM, TOKEN_FIELD, Sample, split_batch

log = logging.getLogger(__name__)
GROUP = "flotilla-controller"


MAX_DEAD_LETTER_BYTES = 64 * 1024  # of a dead letter's raw entry kept


@dataclass(frozen=True)
class DeadLetter:
    """What will never be stored, and why. `kind`: invalid (the validator), refused (the database), sink-failed."""

    transport: str
    source: str  # the stream entry's id; "" over HTTP
    kind: str
    reason: str
    raw: bytes


class SampleSink(Protocol):
    def accept(self, samples: Sequence[Sample]) -> Sequence[tuple[Sample, str]] | None:
        """Take the samples -> those refused for good, with why (None: all taken). An outage raises."""


class SampleStoreSink:
    """Keeps samples in the database (node evidence in the API); old ones are dropped by `Retention`."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def accept(self, samples: Sequence[Sample]) -> list[tuple[Sample, str]]:
        return self.store.add_samples_or_refuse(samples)


class Ingestor:
    """Hands each batch to every sink, in order, and counts it; what a sink refuses goes to no later sink but to
    the dead letters (kept in `dead_letters`' store when one is given)."""

    def __init__(self, sinks: Sequence[SampleSink], metrics: ControllerMetrics | None = None,
                 dead_letters: Store | None = None) -> None:
        self.sinks = list(sinks)
        self.metrics = metrics
        self.keeper = dead_letters

    def ingest(self, transport: str, samples: Sequence[Sample], source: str = "") -> int:
        """-> the samples every sink took."""
        kept = list(samples)
        for sink in self.sinks:
            if not kept:
                break
            refused = sink.accept(kept) or ()
            if refused:
                self.dead_letter([DeadLetter(transport, source, "refused", f"refused by the database: {why}",
                                             json.dumps(s.to_dict()).encode()) for s, why in refused])
                gone = {id(s) for s, _ in refused}
                kept = [s for s in kept if id(s) not in gone]
        if self.metrics is not None:
            self.metrics.ingested(transport, kept, time.time())
        return len(kept)

    def dead_letter(self, letters: Sequence[DeadLetter]) -> None:
        """Keep (an outage raises: the caller retries), then count and log each once."""
        if self.keeper is not None and letters:
            self.keeper.add_dead_letters((d.transport, d.source[:64], d.reason, d.raw[:MAX_DEAD_LETTER_BYTES])
                                         for d in letters)
        for d in letters:
            if self.metrics is not None:
                self.metrics.ingest_dead_letters.labels(d.transport, d.kind).inc()
            log.warning("dead letter from %s%s: %s", d.transport, f" entry {d.source}" if d.source else "", d.reason)

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
        """Process entries and ack them; an unauthorised entry is logged, counted and acked (it would never pass),
        what can never be stored is dead-lettered and acked. Stops at an entry whose token cannot be reviewed now
        (ReviewUnavailable) or while the database is unreachable: it and the rest stay pending, and are read
        again."""
        done: list[bytes] = []
        n = 0
        try:
            for entry_id, fields in entries:
                if fields is not None:  # None: deleted from the stream while pending
                    n += self._entry(entry_id.decode(), fields)
                done.append(entry_id)
        except Exception as e:
            if isinstance(e, ReviewUnavailable) or is_outage(e):
                self._reread_own = True
            raise
        finally:
            if done:
                self.redis.xack(self.stream, self.group, *done)
        return n

    def _entry(self, source: str, fields: dict[bytes, bytes]) -> int:
        payload = fields.get(FIELD.encode())
        try:
            if payload is None:
                raise ValueError(f"stream entry has no field {FIELD!r}")
            samples, invalid = split_batch(payload)
        except ValueError as e:
            samples = []
            letters = [DeadLetter("redis", source, "invalid", str(e), payload or _shown(fields))]
        else:
            letters = [DeadLetter("redis", source, "invalid", why, item.encode()) for item, why in invalid]
        refused = self._refusal(fields, samples)
        if refused is not None:
            who, why = refused
            log.warning("dropping stream entry %s from %s (%s): %s", source, who, why.reason, why.message)
            self.ingestor.rejected("redis", why.reason)
            return 0
        try:
            n = self.ingestor.ingest("redis", samples, source) if samples else 0
        except Exception as e:
            if is_outage(e) or isinstance(e, (ReviewUnavailable, redis.RedisError)):
                raise
            # Not the database being away: the same entry would fail the same way every time it is read again.
            log.error("a sink failed on stream entry %s; dead-lettered", source, exc_info=True)
            n, letters = 0, [*letters, DeadLetter("redis", source, "sink-failed",
                                                  f"a sink failed: {type(e).__name__}: {e}", payload or b"")]
        if any(d.kind == "invalid" for d in letters):
            self.ingestor.rejected("redis", "malformed")
        self.ingestor.dead_letter(letters)
        return n

    def claim_stale(self) -> int:
        """Take over entries another consumer read but did not ack within claim_idle_ms; -> samples handled."""
        n, start = 0, "0-0"
        while True:
            claimed: Any = self.redis.xautoclaim(self.stream, self.group, self.consumer, self.claim_idle_ms, start,
                                                 count=self.count)  # (the sync client's replies are typed loosely)
            start_raw, entries, *_ = claimed
            n += self._handle(entries)
            start = start_raw.decode() if isinstance(start_raw, bytes) else start_raw
            if start == "0-0" or not entries:
                return n

    def poll(self) -> int:
        """Read and process one round of new entries (first our own pending ones, after a review failed);
        -> samples handled."""
        reply: Any
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
        summary: Any = self.redis.xpending(self.stream, self.group)
        return int(summary["pending"])

    def run(self, claim_every_s: float = 10.0) -> None:
        self.ensure_group()
        next_claim = 0.0
        outage_since: float | None = None
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
            except Exception as e:
                if not is_outage(e):
                    log.exception("redis ingest failed; retrying in 1 s")
                    self._stop.wait(1.0)
                    continue
                if outage_since is None:  # one line when it starts and one when it ends, not one a second
                    outage_since = time.monotonic()
                    log.warning("redis ingest: the database is unreachable (%s); entries stay pending and are "
                                "read again when it answers", type(e).__name__)
                self._stop.wait(1.0)
            else:
                if outage_since is not None:
                    log.info("redis ingest: the database answers again after %.0f s",
                             time.monotonic() - outage_since)
                    outage_since = None

    def stop(self) -> None:
        self._stop.set()


class Retention:
    """Drops samples older than max_age_s, stored idempotency answers older than a day and dead letters older than
    a week; decisions are kept."""

    ANSWERS_KEPT_S = 86_400.0
    DEAD_LETTERS_KEPT_S = 7 * 86_400.0

    def __init__(self, store: Store, max_age_s: float) -> None:
        self.store = store
        self.max_age_s = max_age_s

    def run_once(self) -> int:
        now = self.store.clock()
        self.store.drop_answers_before(now - self.ANSWERS_KEPT_S)
        self.store.drop_dead_letters_before(now - self.DEAD_LETTERS_KEPT_S)
        return self.store.drop_samples_before(now - self.max_age_s)


def _shown(fields: dict[bytes, bytes]) -> bytes:
    """A stream entry's fields as JSON, without its token."""
    return json.dumps({k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in fields.items()
                       if k != TOKEN_FIELD.encode()}).encode()
