"""Start real servers (redis-server, ...) on loopback ports for tests and benchmarks."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float = 15.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listened on 127.0.0.1:{port} within {timeout}s")


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 20.0,
                 group: bool = False) -> None:
    """Send `sig` to a child that still runs, wait up to `timeout` s, then kill it. With `group` (a child started
    with `start_new_session=True`, so leading its own process group) the whole group is signalled and, once the
    child is gone, whatever is left of the group (a load generator's worker processes) is killed: nothing outlives
    it."""
    pgid = proc.pid if group else None
    if proc.poll() is None:
        _signal(proc, pgid, sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _signal(proc, pgid, signal.SIGKILL)
            proc.wait()
    if pgid is not None:
        _signal(proc, pgid, signal.SIGKILL)


def _signal(proc: subprocess.Popen, pgid: int | None, sig: int) -> None:
    try:
        if pgid is not None:
            os.killpg(pgid, sig)
        else:
            proc.send_signal(sig)
    except ProcessLookupError:
        pass


class RedisServer:
    """A throw-away redis-server on a loopback port (free unless given), no persistence. The chaos suite
    pauses it (SIGSTOP: a hung server), kills it (SIGKILL: its data is gone) and restarts it on the same port."""

    def __init__(self, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not found: apt-get install redis-server")
        self.binary, self.port = binary, port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="flotilla-redis-")

    def start(self) -> "RedisServer":
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self._dir.name, "--logfile", str(Path(self._dir.name) / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, proc=self.proc)
        return self

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None:
            self.resume()
            stop_process(self.proc, timeout=10)
        self._dir.cleanup()


@contextmanager
def redis_server() -> Iterator[str]:
    """A throw-away redis-server on a free loopback port; yields its URL."""
    server = RedisServer()
    try:
        yield server.start().url
    finally:
        server.stop()


@contextmanager
def controller_without_kubernetes(db_url: str, read_token: str) -> Iterator[str]:
    """`flotilla controller --no-kubernetes` serving `db_url` on a free loopback port, `read_token` its one
    read token; yields its base URL. For benches of the REST API and the console."""
    with tempfile.TemporaryDirectory(prefix="flotilla-controller-") as tmp:
        tokens = Path(tmp) / "tokens"
        tokens.write_text(f"{read_token},read,bench\n")
        port = free_port()
        src = str(Path(__file__).resolve().parents[2])
        server = subprocess.Popen([sys.executable, "-m", "flotilla.cli", "controller", "--no-kubernetes",
                                   "--db-url", db_url, "--tokens-file", str(tokens), "--port", str(port)],
                                  env={**os.environ, "PYTHONPATH": src},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_port(port, timeout=60, proc=server)
            yield f"http://127.0.0.1:{port}"
        finally:
            stop_process(server, timeout=30)


PG_BIN = Path("/usr/lib/postgresql/15/bin")


class PostgresServer:
    """A throw-away PostgreSQL 15 cluster that can be stopped and started again on the same port and data (run as
    the postgres user: initdb refuses root)."""

    def __init__(self) -> None:
        if not (PG_BIN / "postgres").exists():
            raise FileNotFoundError(f"PostgreSQL binaries not found in {PG_BIN} (apt-get install postgresql-15)")
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


def create_pg_database(base: str, template: str | None = None) -> str:
    """A new, empty database on the PostgreSQL server at `base` (a copy of `template` if given); -> its URL."""
    import uuid

    import sqlalchemy as sa

    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(f"{base}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}" STRATEGY FILE_COPY' if template else "")))
    admin.dispose()
    return f"{base}/{name}"
