"""Redis Streams ingest through a consumer group (real Redis), sinks, retention."""

import json
import uuid

import pytest
import redis

from controller_fixtures import NOW
from flotilla.controller.ingest import Ingestor, RedisConsumer, Retention, SampleStoreSink
from flotilla.controller.metrics import ControllerMetrics
from flotilla.health.samples import FIELD, Sample, encode_batch

pytestmark = pytest.mark.redis


class ListSink:
    def __init__(self):
        self.batches = []

    def accept(self, samples):
        self.batches.append(list(samples))


@pytest.fixture
def stream():
    return f"test:metrics:{uuid.uuid4().hex[:8]}"  # one stream per test on the shared server


def counted(counter, **labels):
    return sum(s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total") and s.labels == labels)


def batch(node, n, t0=NOW):
    return [Sample(t0 + i, node, "gpu_util", float(i), gpu=i % 8) for i in range(n)]


def consumer(url, stream, sink, name, **kw):
    return RedisConsumer(url, Ingestor([sink]), name, stream=stream, block_ms=100, **kw)


def test_reads_acks_and_skips_malformed(redis_url, stream):
    r = redis.Redis.from_url(redis_url)
    sink = ListSink()
    c = consumer(redis_url, stream, sink, "c1")
    c.ensure_group()
    c.ensure_group()  # a second controller start finds the group and carries on
    r.xadd(stream, {FIELD: encode_batch(batch("a", 3))})
    r.xadd(stream, {FIELD: "not json"})
    r.xadd(stream, {"other": "x"})
    r.xadd(stream, {FIELD: json.dumps([{"ts": NOW, "node": "b", "metric": "m"}])})
    r.xadd(stream, {FIELD: encode_batch(batch("b", 2))})
    assert c.poll() == 5
    assert [[s.node for s in b] for b in sink.batches] == [["a"] * 3, ["b"] * 2]
    assert c.pending() == 0
    assert c.poll() == 0


def test_stale_entries_of_a_dead_consumer_are_claimed(redis_url, stream):
    r = redis.Redis.from_url(redis_url)
    dead_sink, live_sink = ListSink(), ListSink()
    dead = consumer(redis_url, stream, dead_sink, "dead", claim_idle_ms=0)
    dead.ensure_group()
    r.xadd(stream, {FIELD: encode_batch(batch("a", 4))})
    # "dead" reads the entry and dies before acking: read it without processing.
    r.xreadgroup(dead.group, "dead", {stream: ">"}, count=10)
    assert dead.pending() == 1
    live = consumer(redis_url, stream, live_sink, "live", claim_idle_ms=0)
    assert live.poll() == 0  # new entries only: the pending one is not redelivered by XREADGROUP >
    assert live.claim_stale() == 4
    assert [len(b) for b in live_sink.batches] == [4] and live.pending() == 0


def test_young_pending_entries_are_left_to_their_consumer(redis_url, stream):
    r = redis.Redis.from_url(redis_url)
    live = consumer(redis_url, stream, ListSink(), "live", claim_idle_ms=60_000)
    live.ensure_group()
    r.xadd(stream, {FIELD: encode_batch(batch("a", 1))})
    r.xreadgroup(live.group, "busy", {stream: ">"}, count=10)
    assert live.claim_stale() == 0 and live.pending() == 1


def test_a_database_outage_leaves_the_entry_pending_and_it_is_read_again(redis_url, stream):
    import sqlalchemy as sa

    class Flaky:
        def __init__(self):
            self.down, self.batches = True, []

        def accept(self, samples):
            if self.down:
                raise sa.exc.OperationalError("INSERT", {}, ConnectionRefusedError("connection refused"))
            self.batches.append(list(samples))

    r = redis.Redis.from_url(redis_url)
    sink = Flaky()
    c = consumer(redis_url, stream, sink, "c1")
    c.ensure_group()
    r.xadd(stream, {FIELD: encode_batch(batch("a", 2))})
    r.xadd(stream, {FIELD: encode_batch(batch("b", 1))})
    with pytest.raises(sa.exc.OperationalError):
        c.poll()
    assert c.pending() == 2  # not acked, not dead-lettered: read again when the database answers
    sink.down = False
    assert c.poll() == 3 and c.pending() == 0  # its own pending entries first, at once (no 30 s claim wait)
    assert [[s.node for s in b] for b in sink.batches] == [["a", "a"], ["b"]]


def test_a_sink_failing_otherwise_dead_letters_the_entry_and_blocks_nothing(redis_url, stream):
    class Picky(ListSink):
        def accept(self, samples):
            if samples[0].node == "poison":
                raise RuntimeError("a bug on this data")
            super().accept(samples)

    r = redis.Redis.from_url(redis_url)
    sink = Picky()
    metrics = ControllerMetrics(None)  # its counters only (no scrape of the database's state)
    c = RedisConsumer(redis_url, Ingestor([sink], metrics), "c1", stream=stream, block_ms=100)
    c.ensure_group()
    for node in ("a", "poison", "b"):
        r.xadd(stream, {FIELD: encode_batch(batch(node, 1))})
    assert c.poll() == 2 and c.pending() == 0
    assert [b[0].node for b in sink.batches] == ["a", "b"]
    assert counted(metrics.ingest_dead_letters, transport="redis", reason="sink-failed") == 1


def test_store_sink_metrics_and_retention(redis_url, stream, store, clock):
    r = redis.Redis.from_url(redis_url)
    metrics = ControllerMetrics(store)
    c = RedisConsumer(redis_url, Ingestor([SampleStoreSink(store)], metrics), "c1", stream=stream, block_ms=100)
    c.ensure_group()
    r.xadd(stream, {FIELD: encode_batch(batch("a", 5, t0=NOW - 3600))})
    r.xadd(stream, {FIELD: encode_batch(batch("a", 5, t0=NOW - 10))})
    assert c.poll() == 10
    reg = metrics.registry
    assert reg.get_sample_value("flotilla_ingest_samples_total", {"transport": "redis"}) == 10
    assert reg.get_sample_value("flotilla_ingest_batches_total", {"transport": "redis", "result": "ok"}) == 2
    assert max(s.ts for s in store.latest_samples("a")) == NOW - 6
    assert Retention(store, max_age_s=600).run_once() == 5
    assert len(store.latest_samples("a")) == 5


def test_a_sample_with_an_impossible_gpu_index_is_malformed():
    from flotilla.health.samples import decode_batch

    for gpu in (-1, 2 ** 70):
        with pytest.raises(ValueError, match="'gpu' must be an integer from 0 to 65535"):
            decode_batch(json.dumps([{"ts": NOW, "node": "a", "metric": "m", "value": 1.0, "gpu": gpu}]))


def test_the_consumer_recreates_its_group_when_redis_lost_its_data(redis_url, stream):
    """A Redis restarted without persistence has no stream and no group: the agents' next XADD makes the
    stream again, and the consumer must make its group again rather than fail on NOGROUP forever."""
    import threading
    import time

    r = redis.Redis.from_url(redis_url)
    sink = ListSink()
    c = consumer(redis_url, stream, sink, "c1")
    worker = threading.Thread(target=c.run, kwargs={"claim_every_s": 0.1}, daemon=True)
    worker.start()
    try:
        r.xadd(stream, {FIELD: encode_batch(batch("a", 1))})
        deadline = time.monotonic() + 5
        while not sink.batches and time.monotonic() < deadline:
            time.sleep(0.05)
        r.delete(stream)   # what a restart without persistence leaves: no stream, no group
        r.xadd(stream, {FIELD: encode_batch(batch("b", 2))})
        deadline = time.monotonic() + 5
        while len(sink.batches) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        c.stop()
        worker.join(timeout=5)
    assert [[s.node for s in b] for b in sink.batches] == [["a"], ["b", "b"]]
