"""Start real servers (redis-server, ...) on loopback ports for tests and benchmarks."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
    """Send `sig` to a child that still runs, wait up to `timeout` s, then kill it."""
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def redis_server() -> Iterator[str]:
    """A throw-away redis-server on a free loopback port; yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server not found: apt-get install redis-server")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="flotilla-redis-") as tmp:
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", tmp, "--logfile", str(Path(tmp) / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            wait_for_port(port, proc=proc)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            stop_process(proc, timeout=10)
