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
