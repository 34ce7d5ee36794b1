"""Failpoints (the chaos suite's test-only hook): which writes they match, and that a match kills."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flotilla.operator import failpoints
from flotilla.operator.actions import CreatePod, DeletePod, PatchAnnotations, PatchStatus
from flotilla.operator.failpoints import Failpoint, matching, parse


def pod(generation):
    return CreatePod({"metadata": {"namespace": "ns", "name": f"j-g{generation}-w0",
                                   "labels": {"flotilla.dev/generation": str(generation)}}})


def test_parse_reads_when_action_and_the_optional_text_which_may_hold_colons():
    assert parse("") == ()
    assert parse('before:DeletePod, after:CreatePod:"flotilla.dev/generation":"1"') == (
        Failpoint("before", "DeletePod"), Failpoint("after", "CreatePod", '"flotilla.dev/generation":"1"'))


@pytest.mark.parametrize("spec", ["DeletePod", "during:DeletePod", "after:", "after"])
def test_a_malformed_entry_is_refused_rather_than_silently_never_hit(spec):
    with pytest.raises(ValueError, match="WHEN:ACTION"):
        parse(spec)


def test_a_failpoint_matches_its_point_action_type_and_text_only():
    points = parse('after:CreatePod:"flotilla.dev/generation":"1",after:PatchStatus:"reshards":1')
    assert matching("after", pod(1), points) == points[0]
    assert matching("after", pod(0), points) is None  # the first worker set, not the reshard's
    assert matching("before", pod(1), points) is None
    assert matching("after", DeletePod("ns", "j-g1-w0"), points) is None
    assert matching("after", PatchStatus("trainingjobs", "ns", "j", {"reshards": 1, "phase": "Resharding"}),
                    points) == points[1]
    assert matching("after", PatchStatus("trainingjobs", "ns", "j", {"phase": "Running"}), points) is None
    assert matching("after", PatchAnnotations("trainingjobs", "ns", "j", {"reshards": "1"}), points) is None


def test_unarmed_hooks_do_nothing():
    assert failpoints._ARMED == ()
    failpoints.hit("after", pod(1))  # still here


def test_an_armed_failpoint_sigkills_the_process_at_its_point():
    code = ("from flotilla.operator import failpoints\n"
            "from flotilla.operator.actions import DeletePod\n"
            "failpoints.hit('after', DeletePod('ns', 'p'))\n"
            "print('survived after')\n"
            "failpoints.hit('before', DeletePod('ns', 'p'))\n"
            "print('survived before')\n")
    src = str(Path(failpoints.__file__).resolve().parents[2])  # this checkout's code, not the venv's
    env = {**os.environ, failpoints.ENV: "before:DeletePod", "PYTHONPATH": src}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == -signal.SIGKILL
    assert r.stdout.splitlines() == ["survived after"]


def test_the_executor_passes_every_write_through_the_hook_before_it_is_sent_and_after_it_succeeded(monkeypatch):
    import asyncio

    from kubernetes import client

    from flotilla.operator.kube import Kube

    seen = []
    monkeypatch.setattr(failpoints, "hit", lambda when, action: seen.append((when, action)))
    kube = Kube(client.ApiClient(), concurrency=1)

    def call(a):
        seen.append(("sent", a))
        if a.name == "gone":
            raise client.ApiException(status=500, reason="boom")
        return True

    kube._call = call
    ok, failing = DeletePod("ns", "p"), DeletePod("ns", "gone")
    asyncio.run(kube.apply([ok, failing]))
    assert seen == [("before", ok), ("sent", ok), ("after", ok), ("before", failing), ("sent", failing)]


def test_with_sigstop_the_process_freezes_at_its_point_and_goes_on_once_continued():
    code = ("from flotilla.operator import failpoints\n"
            "from flotilla.operator.actions import DeletePod\n"
            "failpoints.hit('before', DeletePod('ns', 'p'))\n"
            "print('continued', flush=True)\n"
            "failpoints.hit('before', DeletePod('ns', 'p'))\n"  # fires once
            "print('not stopped again', flush=True)\n")
    src = str(Path(failpoints.__file__).resolve().parents[2])
    env = {**os.environ, failpoints.ENV: "before:DeletePod", failpoints.SIGNAL_ENV: "STOP", "PYTHONPATH": src}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{proc.pid}/stat").read_text().split(")")[-1].split()[0] != "T":
            assert time.monotonic() < deadline, "the process did not stop at its failpoint"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGCONT)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0 and out.splitlines() == ["continued", "not stopped again"]


def test_an_unknown_signal_is_refused():
    with pytest.raises(ValueError, match="TERM"):
        failpoints.signal_of({failpoints.SIGNAL_ENV: "TERM"})
