"""The step-time intake: reports with role, rank and sync_step_time over real UDP; malformed ones counted and
dropped; what the reports say about the node stamps its GPU and host samples with job and role."""

import json
import logging
import socket
import time

import pytest

from flotilla.agent.publish import BufferedPublisher
from flotilla.agent.runner import Agent
from flotilla.agent.steps import StepIntake, parse_report
from flotilla.health.samples import Sample
from flotilla.worker.steps import StepReporter


@pytest.fixture
def intake():
    i = StepIntake("n1", port=0, host="127.0.0.1")
    yield i
    i.close()


def send(intake, payload):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(payload if isinstance(payload, bytes) else json.dumps(payload).encode(), intake.address)


def collect(intake, now, expect=1):
    """UDP on loopback is not instant: collect until `expect` samples came (or a second passed)."""
    out, deadline = [], time.monotonic() + 1.0
    while len(out) < expect and time.monotonic() < deadline:
        out += intake.collect(now)
        time.sleep(0.01)
    return out


def test_a_report_with_role_and_sync_step_time_becomes_two_samples_carrying_rank_and_role(intake):
    reporter = StepReporter("team/llm", 5, *intake.address, gpu=1, role="pp1/2")
    assert reporter.report(0.91, sync_step_time=1.02)
    reporter.close()
    assert collect(intake, 7.0, expect=2) == [
        Sample(7.0, "n1", "step_time", 0.91, "team/llm", 1, "pp1/2", 5),
        Sample(7.0, "n1", "sync_step_time", 1.02, "team/llm", 1, "pp1/2", 5)]


@pytest.mark.parametrize("payload, field", [
    (b"not json", "not JSON"),
    ([1, 2], "JSON object"),
    ({"step_time": 1.0}, "'job'"),
    ({"job": "a/b"}, "'step_time'"),
    ({"job": "a/b", "step_time": -1.0}, "'step_time'"),
    ({"job": "a/b", "step_time": "slow"}, "'step_time'"),
    ({"job": "a/b", "step_time": 1.0, "sync_step_time": float("inf")}, "'sync_step_time'"),
    ({"job": "a/b", "step_time": 1.0, "rank": -1}, "'rank'"),
    ({"job": "a/b", "step_time": 1.0, "gpu": True}, "'gpu'"),
    ({"job": "a/b", "step_time": 1.0, "role": ""}, "'role'"),
    ({"job": "a/b", "step_time": 1.0, "role": "x" * 64}, "'role'"),
])
def test_parse_report_names_the_bad_field(payload, field):
    with pytest.raises(ValueError, match=field):
        parse_report(payload if isinstance(payload, bytes) else json.dumps(payload).encode())


def test_malformed_reports_are_counted_and_warned_about_once_a_minute(intake, caplog):
    with caplog.at_level(logging.WARNING, logger="flotilla.agent.steps"):
        for _ in range(3):
            send(intake, {"job": "a/b", "step_time": "slow"})
        send(intake, {"job": "a/b", "step_time": 0.5, "rank": 0})
        good = collect(intake, 1.0)
        send(intake, b"{")
        collect(intake, 70.0, expect=0)
        time.sleep(0.05)
        intake.collect(70.0)
    assert [s.value for s in good] == [0.5]
    assert intake.rejected == 4
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and "(1 rejected so far)" in warnings[0] and "(4 rejected so far)" in warnings[1]


def test_placement_per_gpu_and_for_the_node(intake):
    send(intake, {"job": "t/a", "rank": 0, "gpu": 0, "step_time": 1.0, "role": "pp0/2"})
    send(intake, {"job": "t/a", "rank": 1, "gpu": 1, "step_time": 1.0, "role": "pp1/2"})
    collect(intake, 10.0, expect=2)
    assert intake.placement(0) == ("t/a", "pp0/2") and intake.placement(1) == ("t/a", "pp1/2")
    assert intake.placement(None) == ("t/a", None)       # the node hosts two roles: node metrics get none
    assert intake.placement(7) == ("t/a", None)
    intake.collect(100.0)                                 # no report for a minute: nothing known
    assert intake.placement(0) == (None, None) and intake.job is None


class ListTransport:
    def __init__(self):
        self.batches = []

    def send(self, batch):
        self.batches.append(list(batch))

    def close(self):
        pass


class GpuSource:
    name = "gpu"

    def collect(self, now):
        return [Sample(now, "n1", "gpu_util", 90.0, gpu=g) for g in range(2)] + [Sample(now, "n1", "cpu_util", 20.0)]

    def close(self):
        pass


def test_the_agent_stamps_gpu_and_host_samples_with_the_job_and_role_the_workers_reported(intake):
    transport = ListTransport()
    agent = Agent("n1", [GpuSource()], BufferedPublisher(transport), job=lambda: "fallback/job", intake=intake)
    agent.tick(1.0)
    assert {(s.metric, s.gpu, s.job, s.role) for s in transport.batches[-1]} == {
        ("gpu_util", 0, "fallback/job", None), ("gpu_util", 1, "fallback/job", None),
        ("cpu_util", None, "fallback/job", None)}
    send(intake, {"job": "t/a", "rank": 6, "gpu": 1, "step_time": 1.0, "role": "pp3/4"})
    time.sleep(0.05)
    agent.tick(2.0)
    got = {(s.metric, s.gpu): (s.job, s.role, s.rank) for s in transport.batches[-1]}
    assert got[("gpu_util", 1)] == ("t/a", "pp3/4", None)
    assert got[("step_time", 1)] == ("t/a", "pp3/4", 6)
    # the node's one job is t/a, and its only role there is pp3/4: node metrics and the other GPU get it too
    assert got[("cpu_util", None)] == ("t/a", "pp3/4", None) and got[("gpu_util", 0)] == ("t/a", "pp3/4", None)


def test_the_intake_binds_the_address_it_is_given():
    i = StepIntake("n1", port=0, host="127.0.0.2")     # any loopback address, as a node IP stands for one
    try:
        assert i.address[0] == "127.0.0.2"
        with pytest.raises(OSError):
            StepIntake("n1", port=i.port, host="127.0.0.2")
    finally:
        i.close()


def test_role_and_rank_survive_the_batch_encoding_both_transports_use_and_bad_ones_are_refused():
    from flotilla.health.samples import decode_batch, encode_batch
    sent = [Sample(1.0, "n1", "step_time", 0.9, "t/a", 1, "pp1/4", 9), Sample(1.0, "n1", "gpu_util", 97.0)]
    assert decode_batch(encode_batch(sent)) == sent
    base = {"ts": 1.0, "node": "n1", "metric": "step_time", "value": 1.0}
    for bad, field in (({"role": ""}, "'role'"), ({"role": 7}, "'role'"), ({"rank": -1}, "'rank'"),
                       ({"rank": 2 ** 40}, "'rank'"), ({"rank": True}, "'rank'")):
        with pytest.raises(ValueError, match=field):
            Sample.from_dict({**base, **bad})


def test_reports_from_outside_the_allowed_networks_are_rejected():
    for allow, accepted in ((["10.0.0.0/8", "fd00::/8"], False), (["10.0.0.0/8", "127.0.0.0/8"], True)):
        i = StepIntake("n1", port=0, host="127.0.0.1", allow=allow)
        try:
            send(i, {"job": "a/b", "step_time": 0.5, "rank": 0})
            got = collect(i, 1.0)
            assert (len(got), i.rejected) == ((1, 0) if accepted else (0, 1))
        finally:
            i.close()
    with pytest.raises(ValueError):
        StepIntake("n1", port=0, allow=["pods"])
