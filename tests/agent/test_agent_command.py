"""`flotilla agent` end to end: a simulated node with an injected fault publishing to a real Redis."""

import json
import time

import pytest
import redis

from flotilla.cli import main
from flotilla.health.samples import FIELD, decode_batch


@pytest.mark.redis
def test_simulated_agent_streams_samples_with_the_injected_fault(redis_url, tmp_path):
    truth = tmp_path / "truth.jsonl"
    before = time.time()
    code = main(["agent", "--node", "fake-1", "--source", "sim", "--sim-gpus", "2", "--job", "team/llm",
                 "--redis-url", redis_url, "--stream", "t:agent", "--interval", "0.25", "--duration", "1.6",
                 "--step-port", "0", "--inject", "fell_off_bus@1#1", "--ground-truth", str(truth)])
    assert code == 0
    entries = redis.Redis.from_url(redis_url).xrange("t:agent")
    samples = [s for _id, fields in entries for s in decode_batch(fields[FIELD.encode()])]
    assert len(entries) >= 5 and {s.node for s in samples} == {"fake-1"} and {s.job for s in samples} == {"team/llm"}
    assert sum(s.metric == "heartbeat" for s in samples) == len(entries)
    assert [(s.gpu, s.value) for s in samples if s.metric == "xid"] == [(1, 79.0)]
    assert {s.value for s in samples if s.metric == "gpu_count"} == {2.0, 1.0}
    [row] = [json.loads(line) for line in truth.read_text().splitlines()]
    assert row["fault"] == "fell_off_bus" and row["gpu"] == 1 and row["end"] is None
    assert before + 1 <= row["start"] <= time.time()


def test_inject_without_the_simulated_source_is_refused(capsys):
    assert main(["agent", "--node", "n", "--redis-url", "redis://127.0.0.1:1/0", "--inject", "node_down@1"]) == 2
    assert capsys.readouterr().err == "flotilla agent: error: --inject needs --source sim\n"


@pytest.mark.redis
def test_a_clock_offset_stamps_the_published_samples_off_the_wall_clock(redis_url):
    before = time.time()
    assert main(["agent", "--node", "skewed", "--source", "sim", "--sim-gpus", "1", "--redis-url", redis_url,
                 "--stream", "t:skew", "--interval", "0.25", "--duration", "0.6", "--step-port", "0",
                 "--clock-offset", "-30"]) == 0
    entries = redis.Redis.from_url(redis_url).xrange("t:skew")
    stamps = [s.ts for _id, fields in entries for s in decode_batch(fields[FIELD.encode()]) if s.value]
    assert stamps and all(before - 31 <= ts <= time.time() - 29 for ts in stamps)


def test_a_clock_offset_without_the_simulated_source_is_refused(capsys):
    assert main(["agent", "--node", "n", "--redis-url", "redis://127.0.0.1:1/0", "--clock-offset", "30"]) == 2
    assert capsys.readouterr().err == "flotilla agent: error: --clock-offset needs --source sim\n"


@pytest.mark.redis
def test_dcgm_source_and_step_reports_on_the_bound_address_reach_the_stream(redis_url):
    import socket
    import threading

    from flotilla.worker.steps import StepReporter
    from fake_dcgm_exporter import Exporter, exposition

    exporter = Exporter(exposition([0, 1]))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.3", 0))
        port = s.getsockname()[1]
    stop = threading.Event()

    def worker():   # rank 5 of stage 1, on GPU 1 of this node, reporting until the agent is done
        reporter = StepReporter("team/llm", 5, "127.0.0.3", port, gpu=1, role="pp1/2")
        while not stop.wait(0.05):
            reporter.report(0.4, sync_step_time=0.5)

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert main(["agent", "--node", "gpu-1", "--source", "dcgm", "--dcgm-url", exporter.url,
                     "--redis-url", redis_url, "--stream", "t:dcgm", "--interval", "0.25", "--duration", "1.2",
                     "--step-port", str(port), "--step-bind", "127.0.0.3"]) == 0
    finally:
        stop.set()
        thread.join()
        exporter.close()
    entries = redis.Redis.from_url(redis_url).xrange("t:dcgm")
    samples = [s for _id, fields in entries for s in decode_batch(fields[FIELD.encode()])]
    steps = {(s.metric, s.job, s.gpu, s.role, s.rank) for s in samples if s.metric.endswith("step_time")}
    assert steps == {("step_time", "team/llm", 1, "pp1/2", 5), ("sync_step_time", "team/llm", 1, "pp1/2", 5)}
    gpu1 = {(s.job, s.role) for s in samples if s.metric == "gpu_util" and s.gpu == 1}
    assert ("team/llm", "pp1/2") in gpu1          # the DCGM samples of GPU 1 carry the role reported for it
    assert {s.value for s in samples if s.metric == "gpu_source_up"} == {1.0}


def test_a_step_address_that_cannot_be_bound_is_an_error(caplog):
    assert main(["agent", "--node", "n", "--source", "sim", "--redis-url", "redis://127.0.0.1:1/0",
                 "--step-bind", "192.0.2.1", "--step-port", "9477"]) == 2   # TEST-NET-1: never this machine's
    assert any("cannot bind the step-time port 192.0.2.1:9477" in r.getMessage() for r in caplog.records)
