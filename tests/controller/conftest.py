"""Fixtures for the controller tests: real SQLite and real PostgreSQL databases, an app with recording actions."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from fastapi.testclient import TestClient

from flotilla.controller.actions import RecordingActions
from flotilla.controller.api import Controller, create_app
from flotilla.controller.auth import TokenAuthenticator
from flotilla.controller.db import create_engine, upgrade
from flotilla.controller.ingest import Ingestor, SampleStoreSink
from flotilla.controller.metrics import ControllerMetrics
from flotilla.controller.store import Store
from flotilla.testing import services
from flotilla.testing.services import create_pg_database
from controller_fixtures import ADMIN, AGENT, NOW, READER


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class PostgresServer(services.PostgresServer):
    """flotilla.testing.services.PostgresServer, the test skipped where PostgreSQL is not installed."""

    def __init__(self) -> None:
        if not (services.PG_BIN / "postgres").exists():
            pytest.skip(f"PostgreSQL binaries not found in {services.PG_BIN} (apt-get install postgresql-15)")
        super().__init__()


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
