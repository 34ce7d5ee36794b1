"""One validator for every transport; what can never be stored is dead-lettered (kept, counted, logged once,
acknowledged) and blocks nothing, on SQLite and on a real PostgreSQL server, with a real Redis."""

import json
import uuid

import pytest
import redis

from controller_fixtures import AGENT, NOW, auth
from flotilla.controller.ingest import Ingestor, RedisConsumer, SampleStoreSink
from flotilla.controller.metrics import ControllerMetrics
from flotilla.health.samples import FIELD, Sample, encode_batch

pytestmark = [pytest.mark.redis, pytest.mark.postgres]

GOOD = {"ts": NOW, "node": "a", "metric": "gpu_util", "value": 97.0}
# Each is refused by the one validator, over HTTP (422) and over Redis (dead-lettered), naming the field.
BAD = [
    ({**GOOD, "node": "n" * 300}, "node"),  # PostgreSQL's varchar(253) refused it over Redis only, before
    ({**GOOD, "metric": "m" * 129}, "metric"),
    ({**GOOD, "job": "j" * 513}, "job"),
    ({**GOOD, "metric": "gpu\x00util"}, "metric"),  # PostgreSQL's text refuses NUL, SQLite's keeps it
    ({**GOOD, "value": float("nan")}, "value"),
    ({**GOOD, "gpu": 2 ** 70}, "gpu"),
    ({**GOOD, "rank": -1}, "rank"),
    ({**GOOD, "role": ""}, "role"),
    ({**GOOD, "colour": "red"}, "colour"),
    ({k: v for k, v in GOOD.items() if k != "value"}, "value"),
]


@pytest.fixture
def stream():
    return f"test:metrics:{uuid.uuid4().hex[:8]}"


def consumer(redis_url, stream, store, metrics, name="c1", **kw):
    ingestor = Ingestor([SampleStoreSink(store)], metrics, dead_letters=store)
    return RedisConsumer(redis_url, ingestor, name, stream=stream, block_ms=100, **kw)


def stored(store, node):
    import sqlalchemy as sa
    from flotilla.controller.db import SampleRow
    with store.session() as s:
        return s.scalar(sa.select(sa.func.count()).select_from(SampleRow).where(SampleRow.node == node))


def dead(metrics, transport, reason):
    return metrics.registry.get_sample_value("flotilla_ingest_dead_letters_total",
                                             {"transport": transport, "reason": reason}) or 0


def test_a_malformed_sample_over_redis_is_dead_lettered_and_the_samples_beside_and_behind_it_are_stored(
        redis_url, stream, store, caplog):
    r = redis.Redis.from_url(redis_url)
    metrics = ControllerMetrics(store)
    c = consumer(redis_url, stream, store, metrics)
    c.ensure_group()
    long_node = {**GOOD, "node": "n" * 300}
    r.xadd(stream, {FIELD: json.dumps([{**GOOD, "ts": NOW + i} for i in range(3)])})
    bad_id = r.xadd(stream, {FIELD: json.dumps([{**GOOD, "node": "b"}, long_node, {**GOOD, "node": "b", "ts": NOW + 1}])})
    r.xadd(stream, {FIELD: "not json"})
    r.xadd(stream, {FIELD: encode_batch([Sample(NOW + i, "c", "gpu_util", 1.0) for i in range(4)])})
    assert c.poll() == 3 + 2 + 4
    assert c.pending() == 0  # all acknowledged, the bad ones too
    assert (stored(store, "a"), stored(store, "b"), stored(store, "c")) == (3, 2, 4)
    letters = sorted(store.dead_letters(), key=lambda d: d.id)
    assert [(d.transport, d.source) for d in letters] == [("redis", bad_id.decode()), ("redis", letters[1].source)]
    assert json.loads(letters[0].raw) == long_node and "'node'" in letters[0].reason and "253" in letters[0].reason
    assert letters[1].raw == b"not json" and "JSON" in letters[1].reason
    assert dead(metrics, "redis", "invalid") == 2
    lines = [rec for rec in caplog.records if "dead letter" in rec.getMessage()]
    assert len(lines) == 2 and not any(rec.exc_info for rec in lines)  # one line each, no traceback
    assert c.poll() == 0 and c.claim_stale() == 0 and len(store.dead_letters()) == 2  # never read again


def test_a_sample_the_database_refuses_is_dead_lettered_and_the_others_stored(redis_url, stream, store):
    """Past the validator (a sample made in code), the database's own refusal is found sample by sample."""
    r = redis.Redis.from_url(redis_url)
    metrics = ControllerMetrics(store)
    c = consumer(redis_url, stream, store, metrics)
    c.ensure_group()
    refused = Sample(NOW, "a", "gpu_util", 1.0, gpu=2 ** 70)  # no database's integer column holds it
    r.xadd(stream, {FIELD: encode_batch([Sample(NOW, "a", "gpu_util", 1.0), refused, Sample(NOW + 1, "a", "x", 2.0)])})
    r.xadd(stream, {FIELD: encode_batch([Sample(NOW, "b", "gpu_util", 1.0)])})
    # The consumer validates: the entry's bad sample is refused by the validator first.
    assert c.poll() == 3 and c.pending() == 0
    # Straight to the sinks, as a producer inside the controller would: the database refuses it.
    assert c.ingestor.ingest("redis", [Sample(NOW + 2, "a", "m", 1.0), refused, Sample(NOW + 3, "a", "m", 1.0)],
                             "x-1") == 2
    assert stored(store, "a") == 4 and stored(store, "b") == 1
    newest = store.dead_letters(limit=1)[0]
    assert newest.source == "x-1" and newest.reason.startswith("refused by the database: ")
    assert json.loads(newest.raw)["gpu"] == 2 ** 70
    assert dead(metrics, "redis", "refused") == 1 and dead(metrics, "redis", "invalid") == 1


def test_the_stale_claim_loop_dead_letters_too(redis_url, stream, store):
    r = redis.Redis.from_url(redis_url)
    metrics = ControllerMetrics(store)
    live = consumer(redis_url, stream, store, metrics, name="live", claim_idle_ms=0)
    live.ensure_group()
    r.xadd(stream, {FIELD: json.dumps([{**GOOD, "node": "n" * 300}, GOOD])})
    r.xreadgroup(live.group, "dead", {stream: ">"}, count=10)  # read by a consumer that died
    assert live.claim_stale() == 1 and live.pending() == 0
    assert stored(store, "a") == 1 and len(store.dead_letters()) == 1
    assert live.claim_stale() == 0


@pytest.mark.parametrize("sample,field", BAD, ids=[f for _, f in BAD])
def test_http_and_redis_refuse_the_same_samples(client, controller, redis_url, stream, store, sample, field):
    body = json.dumps({"node": "a", "samples": [sample]})  # json.dumps writes NaN as Python's json reads it
    r = client.post("/v1/ingest", content=body, headers={**auth(AGENT), "Content-Type": "application/json"})
    assert r.status_code == 422 and field in r.json()["error"]["message"], r.text
    rd = redis.Redis.from_url(redis_url)
    c = RedisConsumer(redis_url, Ingestor([SampleStoreSink(store)], dead_letters=store), "c1", stream=stream,
                      block_ms=100)
    c.ensure_group()
    rd.xadd(stream, {FIELD: json.dumps([sample])})
    assert c.poll() == 0 and c.pending() == 0
    [letter] = store.dead_letters()
    assert f"'{field}'" in letter.reason
