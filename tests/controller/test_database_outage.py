"""A real PostgreSQL stopped under load and started again, behind a real controller process (uvicorn, Redis
ingest): every answer is 200/202 or 503 with Retry-After (never a 500, never a dropped connection), GET
/v1/cluster says so in its conditions, and nothing acknowledged is lost (HTTP 202s and Redis XADDs)."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import redis
import sqlalchemy as sa

from controller_fixtures import ADMIN, AGENT, READER, auth
from flotilla.controller.db import SampleRow, create_engine, upgrade
from flotilla.health.samples import FIELD, STREAM, Sample, encode_batch
from flotilla.testing.services import free_port, redis_server, stop_process, wait_for_port

pytestmark = [pytest.mark.postgres, pytest.mark.redis]
SRC = Path(__file__).resolve().parents[2] / "src"


class Load:
    """Posts samples over HTTP and Redis and reads the cluster view, each in a loop, until stopped."""

    def __init__(self, base: str, redis_url: str) -> None:
        self.base, self.redis_url = base, redis_url
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.answers: list[tuple[str, int, str | None, float]] = []  # (route, status, Retry-After, when)
        self.errors: list[str] = []  # connection errors, timeouts: what a client cannot read
        self.acked_http: set[int] = set()
        self.acked_redis: set[int] = set()
        self.unavailable_bodies: list[dict] = []

    def _answer(self, route: str, r: httpx.Response) -> None:
        with self.lock:
            self.answers.append((route, r.status_code, r.headers.get("Retry-After"), time.monotonic()))
            if route == "cluster" and r.status_code == 503:
                self.unavailable_bodies.append(r.json())

    def post(self) -> None:
        seq = 0
        with httpx.Client(base_url=self.base, timeout=15) as c:
            while not self.stop.is_set():
                seq += 1
                body = {"node": "http-node", "samples": [{"ts": float(seq), "node": "http-node", "metric": "m",
                                                          "value": 1.0}]}
                try:
                    r = c.post("/v1/ingest", json=body, headers=auth(AGENT))
                except httpx.HTTPError as e:
                    self.errors.append(f"ingest: {type(e).__name__}: {e}")
                    continue
                self._answer("ingest", r)
                if r.status_code == 202:
                    self.acked_http.add(seq)
                time.sleep(0.02)

    def read(self) -> None:
        with httpx.Client(base_url=self.base, timeout=15) as c:
            while not self.stop.is_set():
                try:
                    r = c.get("/v1/cluster", headers=auth(READER))
                except httpx.HTTPError as e:
                    self.errors.append(f"cluster: {type(e).__name__}: {e}")
                    continue
                self._answer("cluster", r)
                time.sleep(0.02)

    def publish(self) -> None:
        client = redis.Redis.from_url(self.redis_url)
        seq = 0
        while not self.stop.is_set():
            seq += 1
            client.xadd(STREAM, {FIELD: encode_batch([Sample(float(seq), "redis-node", "m", 1.0)])})
            self.acked_redis.add(seq)
            time.sleep(0.02)

    def seen(self, route: str, status: int, after: float = 0.0) -> bool:
        with self.lock:
            return any(a[0] == route and a[1] == status and a[3] > after for a in self.answers)


def wait_until(what, timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, message
        time.sleep(0.05)


def stored(engine: sa.Engine, node: str) -> set[int]:
    with engine.connect() as c:
        return {int(ts) for ts in c.scalars(sa.select(SampleRow.ts).where(SampleRow.node == node))}


def test_postgres_stopped_under_load_answers_503_and_loses_nothing_acknowledged(own_postgres, tmp_path):
    db_url = own_postgres.create_database()
    engine = create_engine(db_url)
    upgrade(engine)
    (tmp_path / "tokens").write_text(f"{ADMIN},admin,alice\n{READER},read,bob\n{AGENT},ingest,agent-1\n")
    port = free_port()
    with redis_server() as redis_url:
        log_path = tmp_path / "controller.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "flotilla.cli", "controller", "--no-kubernetes", "--port", str(port),
                 "--db-url", db_url, "--redis-url", redis_url, "--tokens-file", str(tmp_path / "tokens")],
                env={**os.environ, "FLOTILLA_DATA": str(tmp_path), "PYTHONPATH": str(SRC)}, stdout=log,
                stderr=subprocess.STDOUT)
        load = Load(f"http://127.0.0.1:{port}", redis_url)
        threads = [threading.Thread(target=f, daemon=True) for f in (load.post, load.read, load.publish)]
        try:
            try:
                wait_for_port(port, timeout=60, proc=proc)
                for t in threads:
                    t.start()
                wait_until(lambda: load.seen("ingest", 202) and load.seen("cluster", 200), 30, "no service before")
                own_postgres.stop()
                wait_until(lambda: load.seen("ingest", 503) and load.seen("cluster", 503), 30,
                           f"no 503 while the database is down: {load.answers[-5:]} {load.errors[-3:]}")
                time.sleep(1.0)  # a second of outage under load
                own_postgres.start()
                restarted = time.monotonic()
                wait_until(lambda: load.seen("ingest", 202, restarted) and load.seen("cluster", 200, restarted), 60,
                           "service did not come back with the database")
                time.sleep(0.5)
            finally:
                load.stop.set()
                for t in threads:
                    if t.ident is not None:
                        t.join(timeout=20)
            # Everything acknowledged is stored: HTTP's 202s at once, Redis's entries once re-read.
            assert load.acked_http <= stored(engine, "http-node")
            wait_until(lambda: load.acked_redis <= stored(engine, "redis-node"), 60,
                       f"{len(load.acked_redis - stored(engine, 'redis-node'))} acknowledged Redis entries lost")
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=15) as c:
                cluster = c.get("/v1/cluster", headers=auth(READER)).json()
                metrics = c.get("/metrics", headers=auth(READER)).text
        finally:
            stop_process(proc)
            engine.dispose()
    statuses = {(route, status) for route, status, _, _ in load.answers}
    assert statuses <= {("ingest", 202), ("ingest", 503), ("cluster", 200), ("cluster", 503)}, statuses
    assert load.errors == []  # no dropped connection, no timeout
    assert all(retry == "5" for _, status, retry, _ in load.answers if status == 503)
    [down] = [c for c in load.unavailable_bodies[0]["conditions"] if c["type"] == "DatabaseAvailable"]
    assert (down["status"], down["reason"]) == ("False", "Unreachable")
    [up] = [c for c in cluster["conditions"] if c["type"] == "DatabaseAvailable"]
    assert (up["status"], up["reason"]) == ("True", "Answering") and "again" in up["message"]
    assert "flotilla_api_database_unavailable_total" in metrics
    text = log_path.read_text()
    assert "Traceback" not in text, text[-3000:]  # an outage is a line or two, not a traceback a request
    print(f"answers {len(load.answers)} (503: {sum(1 for a in load.answers if a[1] == 503)}), "
          f"HTTP acked {len(load.acked_http)}, Redis acked {len(load.acked_redis)}")


def test_every_route_answers_503_with_retry_after_while_the_database_is_unreachable(tokens_file):
    """In process, against a PostgreSQL port nothing listens on: reads, ingest and metrics answer 503 (never a
    500) with the DatabaseAvailable condition; liveness still answers."""
    from fastapi.testclient import TestClient

    from flotilla.controller.actions import RecordingActions
    from flotilla.controller.api import Controller, create_app
    from flotilla.controller.auth import TokenAuthenticator
    from flotilla.controller.ingest import Ingestor, SampleStoreSink
    from flotilla.controller.metrics import ControllerMetrics
    from flotilla.controller.store import Store

    engine = create_engine(f"postgresql://postgres@127.0.0.1:{free_port()}/flotilla")
    store = Store(engine)
    metrics = ControllerMetrics(store)
    ctl = Controller(store=store, actions=RecordingActions(), auth=TokenAuthenticator(tokens_file), metrics=metrics,
                     ingestor=Ingestor([SampleStoreSink(store)], metrics, dead_letters=store))
    sample = {"ts": 1.0, "node": "a", "metric": "m", "value": 1.0}
    with TestClient(create_app(ctl), raise_server_exceptions=False) as client:
        answers = [client.get("/v1/cluster", headers=auth(READER)), client.get("/v1/jobs", headers=auth(READER)),
                   client.get("/v1/nodes/a", headers=auth(READER)), client.get("/metrics", headers=auth(READER)),
                   client.post("/v1/ingest", json={"node": "a", "samples": [sample]}, headers=auth(AGENT)),
                   client.post("/v1/nodes/a/drain", headers=auth(ADMIN))]
        assert [r.status_code for r in answers] == [503] * len(answers)
        assert {r.headers["Retry-After"] for r in answers} == {"5"}
        [condition] = answers[0].json()["conditions"]
        assert (condition["type"], condition["status"], condition["reason"]) == (
            "DatabaseAvailable", "False", "Unreachable")
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.headers["Retry-After"] == "5"
        assert client.get("/healthz").status_code == 200
    counted = [s.value for m in metrics.database_unavailable.collect() for s in m.samples if s.name.endswith("_total")]
    assert counted == [len(answers)]  # the counter alone: a scrape of the registry would read the database
    engine.dispose()
