"""Liveness by arrival: agent clocks, pipeline stalls, controller pauses and replayed backlogs are no node faults."""

import pytest

from flotilla.health.monitor import HealthMonitor, MonitorConfig
from flotilla.health.samples import Sample

NODES = [f"n{i}" for i in range(8)]


def batch(t: float, nodes=NODES, skew: dict | None = None, job: str = "j", nvlink: dict | None = None) -> list[Sample]:
    """One report per node, stamped by the node's own clock (t + its skew)."""
    out = []
    for n in nodes:
        ts = t + (skew or {}).get(n, 0.0)
        out += [Sample(ts, n, "heartbeat", 1.0, job), Sample(ts, n, "gpu_count", 2.0, job)]
        out += [Sample(ts, n, "nvlink_active", (nvlink or {}).get(n, 18.0), job, g) for g in (0, 1)]
        out += [Sample(ts, n, "gpu_util", 95.0 + (hash((n, g, t)) % 3), job, g) for g in (0, 1)]
    return out


def live(m: HealthMonitor, start: float, stop: float, step: float = 1.0, **kw) -> list:
    """Each node reports once a second; the controller calls the monitor with each arrival."""
    out, t = [], start
    while t < stop:
        out += m.observe(batch(t, **kw), t)
        t += step
    return out


def idle(m: HealthMonitor, start: float, stop: float, step: float = 1.0) -> list:
    """Nothing arrives; the controller's tick still calls the monitor once a second."""
    out, t = [], start
    while t < stop:
        out += m.observe([], t)
        t += step
    return out


def phased(m: HealthMonitor, start: float, stop: float, up_to: float | None = None) -> list:
    """Nodes report at phases spread over the second (node i at +i/8 s); the controller ticks every 0.1 s.
    Nothing is delivered at or after `up_to`."""
    out = []
    for k in range(round(start * 10), round(stop * 10)):
        t = k / 10
        due = [n for i, n in enumerate(NODES) if (k - i) % 10 == 0 and (up_to is None or t < up_to)]
        out += m.observe(batch(t, due) if due else [], t)
    return out


@pytest.mark.parametrize("skew", [30.0, -30.0])
def test_agent_clocks_skewed_by_30_s_decide_nothing(skew):
    m = HealthMonitor()
    assert live(m, 0, 60, skew={n: skew for n in NODES[::2]}) == []
    assert m.take_pipeline_findings() == []


def test_a_real_fault_on_a_node_whose_clock_is_30_s_behind_is_still_compared_and_found():
    m = HealthMonitor(MonitorConfig(window=2, continuity=2))
    out = live(m, 0, 10, skew={"n3": -30.0}, nvlink={"n3": 12.0})
    assert [(d.node, d.reason) for d in out] == [("n3", "outlier:nvlink_active")]


@pytest.mark.parametrize("gap", [5.0, 60.0])
def test_every_node_silent_is_a_pipeline_fault_and_no_node_fault(gap):
    m = HealthMonitor()
    assert live(m, 0, 10) == []
    assert idle(m, 10, 10 + gap) == []                      # Redis or ingest stalled
    [opened] = m.take_pipeline_findings()
    assert (opened.state, opened.scope, opened.reason, len(opened.silent)) == ("open", "cluster", "no-delivery", 8)
    assert m.liveness.open
    assert live(m, 10 + gap, 60 + gap) == []                # delivery resumes: nodes judged afresh, nothing
    [closed] = m.take_pipeline_findings()
    assert (closed.state, closed.scope) == ("closed", "cluster") and closed.ts - closed.since >= gap - 3
    assert not m.liveness.open


def test_a_stop_at_spread_phases_is_a_pipeline_fault_not_the_first_node_to_cross_the_timeout():
    m = HealthMonitor()
    assert phased(m, 0, 10) == []
    assert phased(m, 10, 20, up_to=10.05) == []
    assert [(f.state, f.reason) for f in m.take_pipeline_findings()] == [("open", "no-delivery")]


def test_one_silent_node_among_reporting_ones_is_lost_alone():
    m = HealthMonitor()
    live(m, 0, 5)
    out = live(m, 5, 12, nodes=NODES[1:])
    assert [(d.node, d.reason) for d in out] == [("n0", "heartbeat-lost")]
    assert m.take_pipeline_findings() == []


def test_one_silent_node_at_spread_phases_is_lost_alone():
    m = HealthMonitor()
    phased(m, 0, 10)
    out = []
    for k in range(100, 200):  # n0 stops; the others go on
        t = k / 10
        due = [n for i, n in enumerate(NODES) if (k - i) % 10 == 0 and n != "n0"]
        out += m.observe(batch(t, due) if due else [], t)
    assert [(d.node, d.reason) for d in out] == [("n0", "heartbeat-lost")]


def test_a_silent_rack_is_a_pipeline_fault_of_its_domain_and_other_nodes_are_still_judged():
    m = HealthMonitor()
    m.domains = {n: ("r1" if i < 4 else "r2") for i, n in enumerate(NODES)}
    live(m, 0, 5)
    out = live(m, 5, 20, nodes=NODES[4:])              # rack r1's switch is down
    assert out == []
    [f] = m.take_pipeline_findings()
    assert (f.scope, f.reason, f.silent) == ("domain/r1", "shared-silence", tuple(NODES[:4]))
    out = live(m, 20, 30, nodes=NODES[:4] + NODES[5:])  # r1 back; n4 of r2 dies for real
    assert [(d.node, d.reason) for d in out] == [("n4", "heartbeat-lost")]


def test_a_controller_pause_is_no_node_silence():
    m = HealthMonitor()
    live(m, 0, 10)
    assert live(m, 16, 40) == []                        # nothing called the monitor for 6 s
    [f] = m.take_pipeline_findings()
    assert (f.reason, f.state, f.since, f.ts) == ("controller-stalled", "closed", 9.0, 16.0)


def test_a_replayed_backlog_after_a_restart_confirms_no_silence_but_its_xid_79_is_decided():
    m = HealthMonitor(MonitorConfig(window=2, continuity=2))   # a fresh controller
    backlog = [s for t in range(0, 20) for s in batch(float(t), nvlink={"n2": 12.0} if t < 15 else None)]
    backlog.insert(40, Sample(3.0, "n5", "xid", 79.0, "j", 1))
    out = []
    for i in range(0, len(backlog), 50):                 # the consumer catches up, 50 entries a read
        out += m.observe(backlog[i:i + 50], 20.0 + i / 1000)
    assert [(d.node, d.reason, d.ts) for d in out] == [("n5", "xid-79", 3.0)]
    assert live(m, 20.5, 40) == []                      # the old nvlink outlier drove no window
    assert m.take_pipeline_findings() == []


def test_a_backlog_replayed_after_a_stall_confirms_no_silence():
    m = HealthMonitor()
    live(m, 0, 10)
    idle(m, 10, 30)                                      # Redis paused 20 s; agents buffered
    backlog = [s for t in range(10, 30) for s in batch(float(t))]
    assert m.observe(backlog, 30.0) == []
    assert live(m, 31, 60) == []
    assert [f.state for f in m.take_pipeline_findings()] == ["open", "closed"]
