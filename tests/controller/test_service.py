"""The assembled controller process (--no-kubernetes): first start creates database and tokens; Redis ingest runs."""

import time

import pytest
import redis
from fastapi.testclient import TestClient

from controller_fixtures import NOW, auth
from flotilla.controller.auth import parse_tokens
from flotilla.controller.service import ControllerService, Settings
from flotilla.health.samples import FIELD, STREAM, Sample, encode_batch


@pytest.mark.redis
def test_first_start_and_redis_ingest(tmp_path, redis_url):
    settings = Settings(db_url=f"sqlite:///{tmp_path / 'data' / 'controller.db'}", tokens_file=tmp_path / "tokens",
                        redis_url=redis_url, kubernetes=False)
    service = ControllerService(settings)
    assert (tmp_path / "data" / "controller.db").exists()
    [(_, who)] = parse_tokens(settings.tokens_file.read_text())
    token = [ln for ln in settings.tokens_file.read_text().splitlines() if ",admin," in ln][0].split(",")[0]
    assert who.role == "admin"
    service.start()
    try:
        redis.Redis.from_url(redis_url).xadd(STREAM, {FIELD: encode_batch([Sample(NOW, "n1", "gpu_util", 42.0)])})
        deadline = time.monotonic() + 10
        while not service.store.latest_samples("n1") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [s.value for s in service.store.latest_samples("n1")] == [42.0]
        with TestClient(service.app) as client:
            assert client.get("/readyz").status_code == 200
            r = client.post("/v1/nodes/n1/drain", headers=auth(token))
            assert r.status_code == 404  # no node mirrored without a cluster
    finally:
        service.stop()
    ControllerService(settings)  # a second start keeps the database and the tokens
    assert parse_tokens(settings.tokens_file.read_text())[0][1] == who


@pytest.mark.parametrize("changes, message", [
    ({"ingest_auth": "tokenreview", "kubernetes": False}, "--ingest-auth tokenreview needs the Kubernetes API"),
    ({"tls_cert_file": "tls.crt"}, "--tls-cert-file and --tls-key-file go together"),
    ({"agent_service_accounts": frozenset({"flotilla-agent"})}, "expected namespace/name"),
])
def test_settings_that_cannot_work_are_refused_at_start(tmp_path, changes, message):
    settings = Settings(db_url=f"sqlite:///{tmp_path / 'c.db'}", tokens_file=tmp_path / "tokens", kubernetes=False)
    for key, value in changes.items():
        setattr(settings, key, value)
    with pytest.raises(ValueError, match=message):
        ControllerService(settings)
    assert not (tmp_path / "c.db").exists()  # refused before anything was created


def test_controller_serves_https_with_the_given_certificate(tmp_path):
    import os
    import subprocess
    import sys

    import httpx

    from flotilla.testing.services import free_port, wait_for_port
    from tests.agent.test_publish import make_ca_and_server_cert

    ca, cert, key = make_ca_and_server_cert(tmp_path)
    port = free_port()
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    env = {**os.environ, "FLOTILLA_DATA": str(tmp_path), "PYTHONPATH": os.path.abspath(src)}
    proc = subprocess.Popen([sys.executable, "-m", "flotilla.cli", "controller", "--no-kubernetes", "--port", str(port),
                             "--tls-cert-file", str(cert), "--tls-key-file", str(key)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for_port(port, timeout=30, proc=proc)
        assert httpx.get(f"https://127.0.0.1:{port}/healthz", verify=ssl_context(ca)).json() == {"status": "ok"}
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"https://127.0.0.1:{port}/healthz")  # not a CA the system trusts
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/healthz")  # no plain HTTP on the TLS port
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def ssl_context(ca):
    import ssl

    return ssl.create_default_context(cafile=str(ca))
