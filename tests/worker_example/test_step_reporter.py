"""flotilla.worker's step-time reporter: from the env the operator gives worker pods, to a real UDP socket;
it never raises into the training loop."""

import json
import socket

import pytest

from flotilla.worker.client import JobClient, WorkerIdentity
from flotilla.worker.steps import DEFAULT_PORT, StepReporter


@pytest.fixture
def listener():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.settimeout(2.0)
    yield s
    s.close()


def pod_env(listener, **extra):
    return {"FLOTILLA_JOB": "llm", "FLOTILLA_NAMESPACE": "team", "FLOTILLA_RANK": "3", "FLOTILLA_WORLD_SIZE": "4",
            "FLOTILLA_AGENT_HOST": "127.0.0.1", "FLOTILLA_AGENT_PORT": str(listener.getsockname()[1]), **extra}


def test_from_env_reports_job_rank_role_and_both_step_times(listener):
    reporter = StepReporter.from_env(pod_env(listener, FLOTILLA_ROLE="pp1/2"))
    assert reporter.report(0.5, sync_step_time=0.75)
    assert json.loads(listener.recv(4096)) == {"job": "team/llm", "rank": 3, "gpu": None, "role": "pp1/2",
                                               "step_time": 0.5, "sync_step_time": 0.75}
    assert reporter.report(0.25)
    assert json.loads(listener.recv(4096)) == {"job": "team/llm", "rank": 3, "gpu": None, "role": "pp1/2",
                                               "step_time": 0.25}


def test_a_launcher_rank_and_local_rank_give_the_process_rank_and_gpu(listener):
    reporter = StepReporter.from_env(pod_env(listener, RANK="13", LOCAL_RANK="5"))
    reporter.report(1.0)
    report = json.loads(listener.recv(4096))
    assert (report["rank"], report["gpu"], "role" in report) == (13, 5, False)


def test_no_agent_in_the_env_means_no_reporter():
    assert StepReporter.from_env({"FLOTILLA_JOB": "llm"}) is None
    assert StepReporter.from_env({"FLOTILLA_JOB": "llm", "FLOTILLA_AGENT_HOST": "10.0.0.1",
                                  "FLOTILLA_AGENT_PORT": "not-a-port"}) is None
    assert StepReporter.from_env({"FLOTILLA_JOB": "llm", "FLOTILLA_AGENT_HOST": "10.0.0.1"}).address == (
        "10.0.0.1", DEFAULT_PORT)


def test_report_never_raises_into_the_training_loop():
    reporter = StepReporter("team/llm", 0, "127.0.0.1", 9)
    assert reporter.report(float("nan")) is False
    assert reporter.report(-1.0) is False
    assert reporter.report("slow") is False                  # type: ignore[arg-type]
    unroutable = StepReporter("team/llm", 0, "no-such-host.invalid", 9)
    assert unroutable.report(1.0) is False
    assert reporter.failed == 3 and unroutable.failed == 1
    reporter.close()
    assert reporter.report(1.0) is False                     # even on a closed socket


def test_job_client_reports_step_times_through_the_env(listener, monkeypatch):
    for k, v in pod_env(listener).items():
        monkeypatch.setenv(k, v)
    client = JobClient(WorkerIdentity("llm", "team", 3, 4, 0), api=object())
    assert client.report_step_time(0.4, sync_step_time=0.5)
    assert json.loads(listener.recv(4096))["sync_step_time"] == 0.5
    monkeypatch.delenv("FLOTILLA_AGENT_HOST")
    assert JobClient(WorkerIdentity("llm", "team", 3, 4, 0), api=object()).report_step_time(0.4) is False
