"""Host (/proc), step-time intake, heartbeat and the agent loop."""

import socket
import threading
import time

from flotilla.agent.host import HostSource
from flotilla.agent.publish import BufferedPublisher
from flotilla.agent.runner import Agent, HeartbeatSource
from flotilla.agent.steps import StepIntake
from flotilla.worker.steps import StepReporter
from flotilla.health.samples import Sample

NET_HEADER = "Inter-|   Receive  |  Transmit\n face |bytes packets errs drop fifo frame compressed multicast|bytes ...\n"


def write_proc(root, busy, idle, eth_rx, eth_tx, errs):
    (root / "net").mkdir(exist_ok=True)
    (root / "stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 2 3 4\n")
    (root / "meminfo").write_text("MemTotal: 1000 kB\nMemAvailable:    2048 kB\n")
    (root / "net" / "dev").write_text(
        NET_HEADER
        + "    lo: 999999 1 0 0 0 0 0 0 999999 1 0 0 0 0 0 0\n"
        + f"  eth0: {eth_rx} 10 {errs} 1 0 0 0 0 {eth_tx} 10 0 0 0 0 0 0\n")


def test_host_source_reports_rates_from_proc_deltas(tmp_path):
    write_proc(tmp_path, busy=100, idle=900, eth_rx=0, eth_tx=0, errs=0)
    source = HostSource("n1", tmp_path, sys=tmp_path / "no-sysfs")   # no sysfs: every NIC but lo
    assert {s.metric: s.value for s in source.collect(10.0)} == {"mem_available": 2.0}
    write_proc(tmp_path, busy=400, idle=1600, eth_rx=4_000_000, eth_tx=2_000_000, errs=5)
    values = {s.metric: s.value for s in source.collect(12.0)}
    assert values == {"mem_available": 2.0, "cpu_util": 30.0, "net_rx": 2.0, "net_tx": 1.0, "net_errors": 2.5}


def test_host_network_counts_only_physical_nics_when_sysfs_shows_them(tmp_path):
    proc, sys = tmp_path / "proc", tmp_path / "sys"
    proc.mkdir()
    for nic, physical in (("eth0", True), ("veth1a2b", False), ("cni0", False), ("ib0", True)):
        (sys / "class" / "net" / nic).mkdir(parents=True)
        if physical:
            (sys / "class" / "net" / nic / "device").mkdir()

    def write(rx, veth_drops):
        write_proc(proc, busy=100, idle=900, eth_rx=rx, eth_tx=0, errs=0)
        with open(proc / "net" / "dev", "a") as f:
            f.write(f"veth1a2b: {rx} 1 0 {veth_drops} 0 0 0 0 {rx} 1 0 0 0 0 0 0\n")
            f.write(f"  cni0: {rx} 1 0 0 0 0 0 0 {rx} 1 0 0 0 0 0 0\n")
            f.write(f"   ib0: {2 * rx} 1 0 0 0 0 0 0 0 1 0 0 0 0 0 0\n")

    source = HostSource("n1", proc, sys)
    write(0, 0)
    source.collect(10.0)
    write(1_000_000, 500)            # a pod went away: its veth dropped packets; the pods' traffic crossed the bridge
    values = {s.metric: s.value for s in source.collect(11.0)}
    assert values["net_rx"] == 3.0 and values["net_errors"] == 0.0   # eth0 + ib0 only; eth0's 1 drop is constant


def test_step_intake_turns_datagrams_into_step_time_samples_and_knows_the_job():
    intake = StepIntake("n1", port=0)
    try:
        assert StepReporter("team/llm", 3, "127.0.0.1", intake.port, gpu=3).report(0.9)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b'{"job": "team/llm", "step_time": "slow"}', ("127.0.0.1", intake.port))
        time.sleep(0.05)
        assert intake.collect(5.0) == [Sample(5.0, "n1", "step_time", 0.9, "team/llm", 3, rank=3)]
        assert intake.rejected == 1 and intake.job == "team/llm"
        assert intake.collect(70.0) == [] and intake.job is None    # no report for a minute
    finally:
        intake.close()


class ListTransport:
    def __init__(self):
        self.batches = []
        self.closed = False

    def send(self, batch):
        self.batches.append(list(batch))

    def close(self):
        self.closed = True


class Broken:
    name = "broken"

    def collect(self, now):
        raise OSError("sensor gone")

    def close(self):
        pass


def test_agent_tick_labels_unlabelled_samples_and_survives_a_broken_source():
    transport = ListTransport()
    agent = Agent("n1", [Broken(), HeartbeatSource("n1")], BufferedPublisher(transport), job=lambda: "team/llm")
    agent.tick(3.0)
    assert transport.batches == [[Sample(3.0, "n1", "heartbeat", 1.0, "team/llm")]]


def test_agent_runs_for_its_duration_and_closes_the_transport():
    transport = ListTransport()
    agent = Agent("n1", [HeartbeatSource("n1")], BufferedPublisher(transport))
    agent.run(0.05, threading.Event(), duration=0.2)
    assert 2 <= len(transport.batches) <= 6 and transport.closed
    beats = [s.value for batch in transport.batches for s in batch if s.metric == "heartbeat"]
    assert beats[-1] == 0.0 and set(beats[:-1]) == {1.0}  # a clean stop says goodbye
