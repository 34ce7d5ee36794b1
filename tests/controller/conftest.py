"""Fixtures for the controller tests: real SQLite and real PostgreSQL databases, an app with recording actions."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from flotilla.controller.actions import RecordingActions
from flotilla.controller.api import Controller, create_app
from flotilla.controller.auth import TokenAuthenticator
from flotilla.controller.db import create_engine, upgrade
from flotilla.controller.ingest import Ingestor, SampleStoreSink
from flotilla.controller.metrics import ControllerMetrics
from flotilla.controller.store import Store
from flotilla.testing.services import free_port, wait_for_port
from controller_fixtures import ADMIN, AGENT, NOW, READER

PG_BIN = Path("/usr/lib/postgresql/15/bin")


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class PostgresServer:
    """A throw-away PostgreSQL 15 cluster that can be stopped and started again on the same port and data (run as
    the postgres user: initdb refuses root)."""

    def __init__(self) -> None:
        if not (PG_BIN / "postgres").exists():
            pytest.skip(f"PostgreSQL binaries not found in {PG_BIN} (apt-get install postgresql-15)")
        self.dir = Path(tempfile.mkdtemp(prefix="flotilla-pg-"))
        self.as_postgres: dict[str, Any] = {}
        if os.geteuid() == 0:  # initdb and postgres refuse to run as root
            shutil.chown(self.dir, "postgres", "postgres")
            self.as_postgres = {"user": "postgres", "group": "postgres", "extra_groups": []}
        subprocess.run([str(PG_BIN / "initdb"), "-D", str(self.dir / "data"), "-A", "trust", "-U", "postgres",
                        "--no-sync", "-E", "UTF8"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       **self.as_postgres)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}"

    def start(self) -> "PostgresServer":
        self.proc = subprocess.Popen([str(PG_BIN / "postgres"), "-D", str(self.dir / "data"), "-p", str(self.port),
                                      "-k", str(self.dir), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
                                      "-c", "full_page_writes=off", "-c", "synchronous_commit=off"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **self.as_postgres)
        wait_for_port(self.port, timeout=30, proc=self.proc)
        self._wait_ready(30)
        return self

    def _wait_ready(self, timeout: float) -> None:
        """The port opens before the server takes connections ("the database system is starting up")."""
        import time

        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg.connect(f"postgresql://postgres@127.0.0.1:{self.port}/postgres", connect_timeout=3).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        """Fast shutdown: open connections are closed, new ones refused."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)  # do not wait for pooled connections to close
            self.proc.wait(timeout=30)
            self.proc = None

    def create_database(self) -> str:
        """A new, empty database on this server; -> its URL."""
        return create_pg_database(self.url)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A PostgreSQL server for the session; yields a base URL."""
    server = PostgresServer().start()
    try:
        yield server.url
    finally:
        server.remove()


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of the test's own, to stop and start (the session's is shared)."""
    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.remove()


def create_pg_database(base: str, template: str | None = None) -> str:
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(f"{base}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}" STRATEGY FILE_COPY' if template else "")))
    admin.dispose()
    return f"{base}/{name}"


@pytest.fixture(scope="session")
def postgres_template(postgres_server: str) -> str:
    """A database migrated to head once; tests get copies (CREATE DATABASE ... TEMPLATE is fast)."""
    url = create_pg_database(postgres_server)
    engine = create_engine(url)
    upgrade(engine)
    engine.dispose()
    return url.rsplit("/", 1)[1]


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database of each kind."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'controller.db'}"
    return create_pg_database(request.getfixturevalue("postgres_server"))


@pytest.fixture(params=["sqlite", "postgresql"])
def migrated_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database of each kind with the schema at head."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'controller.db'}"
        engine = create_engine(url)
        upgrade(engine)
        engine.dispose()
        return url
    return create_pg_database(request.getfixturevalue("postgres_server"),
                               template=request.getfixturevalue("postgres_template"))


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(migrated_db_url: str, clock: Clock) -> Iterator[Store]:
    engine = create_engine(migrated_db_url)
    yield Store(engine, clock)
    engine.dispose()


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens"
    path.write_text(f"# test tokens\n{ADMIN},admin,alice\n{READER},read,bob\n{AGENT},ingest,agent-1\n")
    return path


@pytest.fixture
def controller(store: Store, tokens_file: Path) -> Controller:
    metrics = ControllerMetrics(store)
    return Controller(store=store, actions=RecordingActions(), auth=TokenAuthenticator(tokens_file),
                      metrics=metrics, ingestor=Ingestor([SampleStoreSink(store)], metrics),
                      body_limit=4096, ingest_limit=64 * 1024)


@pytest.fixture
def client(controller: Controller) -> Iterator[TestClient]:
    with TestClient(create_app(controller), raise_server_exceptions=False) as c:
        yield c
