"""The simulated fleet: fault specs, seeded schedules, ground truth, signatures."""

import json

import numpy as np
import pytest

from flotilla.agent.simulated import FAULTS, Fault, Fleet, SimulatedSource, parse_fault, random_schedule, \
    write_ground_truth
from flotilla.health.metrics import COMPARED_INDEX


@pytest.mark.parametrize("text, expected", [
    ("nvlink_down@30", Fault("n1", "nvlink_down", 30.0)),
    ("thermal_throttle@10+60#3", Fault("n1", "thermal_throttle", 10.0, 70.0, 3)),
])
def test_parse_fault(text, expected):
    assert parse_fault("n1", text) == expected


@pytest.mark.parametrize("text, message", [("melted@3", "must be one of"), ("nvlink_down", "TYPE@START"),
                                           ("slow_host@5+-1", "'end' must be after")])
def test_bad_fault_spec_is_explained(text, message):
    with pytest.raises(ValueError, match=message):
        parse_fault("n1", text)


def test_schedule_is_seeded_covers_every_type_and_is_written_as_ground_truth(tmp_path):
    nodes = [f"n{i}" for i in range(40)]
    a, b = random_schedule(nodes, 3600, 2, seed=5), random_schedule(nodes, 3600, 2, seed=5)
    assert a == b and a != random_schedule(nodes, 3600, 2, seed=6)
    assert sorted(f.fault for f in a) == sorted(FAULTS * 2)
    assert len({f.node for f in a}) == len(a)
    write_ground_truth(a, tmp_path / "gt.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "gt.jsonl").read_text().splitlines()]
    assert rows[0] == {"node": a[0].node, "fault": a[0].fault, "start": a[0].start, "end": a[0].end,
                       "gpu": a[0].gpu, "hard": a[0].hard}


def frame_at(fleet, t):
    frames, hard = fleet.tick(t)
    return frames[0], hard


@pytest.mark.parametrize("fault, metric, direction", [
    ("nvlink_down", "nvlink_active", -1), ("pcie_downgrade", "pcie_rx", -1), ("thermal_throttle", "temperature", 1),
    ("slow_network", "net_rx", -1), ("slow_host", "cpu_util", 1),
])
def test_soft_fault_moves_its_signature_metric_against_the_peers(fault, metric, direction):
    fleet = Fleet([(f"n{i}", "j") for i in range(8)], seed=1, faults=[Fault("n2", fault, 0.0, gpu=1)], jitter=False)
    frame, _ = frame_at(fleet, 60.0)
    column = frame.values[:, COMPARED_INDEX[metric]]
    others = np.delete(column, 2)
    assert direction * (column[2] - np.median(others)) > 5 * others.std()


def test_hard_faults_show_as_hard_signals():
    faults = [Fault("n0", "fell_off_bus", 5.0, gpu=2), Fault("n1", "ecc_error", 5.0, gpu=0),
              Fault("n2", "node_down", 5.0)]
    fleet = Fleet([(f"n{i}", "j") for i in range(4)], gpus=4, seed=1, faults=faults)
    fleet.tick(4.0)
    frame, hard = frame_at(fleet, 5.0)
    got = {(s.node, s.metric, s.value) for s in hard if s.metric != "heartbeat"}
    assert got == {("n0", "gpu_count", 3.0), ("n0", "xid", 79.0), ("n1", "ecc_uncorrected", 1.0),
                   ("n1", "xid", 94.0)}
    assert {s.node for s in hard if s.metric == "heartbeat"} == {"n0", "n1", "n3"}
    assert np.isnan(frame.values[2]).all()


def test_simulated_source_stamps_wall_time_and_goes_silent_when_down():
    source = SimulatedSource("n1", "j", start=1000.0, faults=[Fault("n1", "node_down", 3.0)], gpus=2)
    first = source.collect(1001.0)
    assert {s.ts for s in first} == {1001.0} and {s.job for s in first} == {"j"}
    assert {s.gpu for s in first if s.metric == "gpu_util"} == {0, 1}
    assert source.collect(1003.0) == []


def test_simulated_source_with_a_clock_offset_stamps_skewed_time_but_keeps_its_fault_schedule():
    faults = [Fault("n1", "node_down", 3.0)]
    skewed = SimulatedSource("n1", "j", start=1000.0, faults=faults, gpus=2, clock_offset=-30.0)
    assert {s.ts for s in skewed.collect(1001.0)} == {971.0}
    assert skewed.collect(1003.0) == []   # faults stay timed from the agent's real start
