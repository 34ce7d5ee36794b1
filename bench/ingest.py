"""Ingest throughput: samples per second one controller consumer sustains through real Redis, and two.

Fills stream `flotilla:metrics` of a throw-away redis-server with batches of
samples (as agents publish them), then lets consumer processes of the
controller's consumer group (RedisConsumer + the SQLite sample store, the same
code `flotilla controller --redis-url` runs) drain it. Phase 1: one consumer
(the baseline). Phase 2: a fresh stream and database drained by two consumers
at once. The ratio says how far a second controller replica scales ingest.

    python bench/ingest.py [--quick] [--batches N] [--batch-size S]

Last line: {"samples_per_s_1": a, "samples_per_s_2": b, "ratio": b / a}
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from flotilla.controller.db import create_engine, upgrade  # noqa: E402
from flotilla.controller.ingest import Ingestor, RedisConsumer, SampleStoreSink  # noqa: E402
from flotilla.controller.store import Store  # noqa: E402
from flotilla.health.samples import FIELD, Sample, encode_batch  # noqa: E402
from flotilla.testing.services import redis_server  # noqa: E402


def consume(redis_url: str, db_url: str, stream: str, name: str) -> None:
    """Child process: wait for 'go', drain the stream, print {samples, start, end}."""
    consumer = RedisConsumer(redis_url, Ingestor([SampleStoreSink(Store(create_engine(db_url)))]), name,
                             stream=stream, block_ms=300, count=50)
    r = redis.Redis.from_url(redis_url)
    r.incr(f"{stream}:ready")
    while not r.exists(f"{stream}:go"):
        time.sleep(0.01)
    start = end = time.perf_counter()
    n = 0
    while (got := consumer.poll()) or consumer.pending():
        n += got
        end = time.perf_counter()
    print(json.dumps({"samples": n, "start": start, "end": end}))


def fill(r: redis.Redis, stream: str, batches: int, size: int) -> int:
    now = time.time()
    pipe = r.pipeline(transaction=False)
    for b in range(batches):
        node = f"gpu-{b % 64:03d}"
        pipe.xadd(stream, {FIELD: encode_batch(Sample(now + b, node, ("gpu_util", "sm_clock", "temp")[i % 3],
                                                      float(i), job="default/llama", gpu=i % 8)
                                               for i in range(size))})
    pipe.execute()
    return batches * size


def phase(redis_url: str, tmp: str, consumers: int, batches: int, size: int) -> float:
    stream = f"bench:metrics:{consumers}"
    db_url = f"sqlite:///{tmp}/controller-{consumers}.db"
    upgrade(create_engine(db_url))
    r = redis.Redis.from_url(redis_url)
    total = fill(r, stream, batches, size)
    RedisConsumer(redis_url, Ingestor([]), "setup", stream=stream).ensure_group()
    procs = [subprocess.Popen([sys.executable, __file__, "--consume", redis_url, db_url, stream, f"c{k}"],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
             for k in range(consumers)]
    while int(r.get(f"{stream}:ready") or 0) < consumers:
        time.sleep(0.01)
    r.set(f"{stream}:go", 1)
    results = [json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs]
    handled = sum(x["samples"] for x in results)
    assert handled == total, f"consumed {handled} of {total} samples"
    took = max(x["end"] for x in results) - min(x["start"] for x in results)
    rate = total / took
    print(f"{consumers} consumer(s): {total} samples in {batches} batches in {took:.2f}s = {rate:,.0f} samples/s "
          f"(per consumer: {', '.join(str(x['samples']) for x in results)})", flush=True)
    return rate


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--consume":
        consume(*sys.argv[2:6])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="300 batches per phase")
    ap.add_argument("--batches", type=int, help="batches per phase (default 2000, quick 300)")
    ap.add_argument("--batch-size", type=int, default=100, help="samples per batch (default 100)")
    args = ap.parse_args()
    batches = args.batches or (300 if args.quick else 2000)
    with redis_server() as url, tempfile.TemporaryDirectory(prefix="flotilla-bench-ingest-") as tmp:
        one = phase(url, tmp, 1, batches, args.batch_size)
        two = phase(url, tmp, 2, batches, args.batch_size)
    print(f"ratio two/one consumers: {two / one:.2f}")
    print(json.dumps({"samples_per_s_1": round(one), "samples_per_s_2": round(two), "ratio": round(two / one, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
