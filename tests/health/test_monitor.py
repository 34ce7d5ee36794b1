"""HealthMonitor: hard signals, heartbeats, transient findings that clear by rule, release, the sample path."""

import pytest

from flotilla.health.monitor import HealthMonitor, MonitorConfig
from flotilla.health.samples import Sample

NODES = [f"n{i}" for i in range(6)]


def tick(t: float, job: str = "j", overrides: dict | None = None, skip: set = frozenset()) -> list[Sample]:
    """Per node: heartbeat, gpu_count 2, and two GPUs' nvlink_active/gpu_util; `overrides[(node, metric, gpu)]`."""
    values = {(n, metric, g): value for n in NODES for g in (0, 1)
              for metric, value in (("nvlink_active", 18.0), ("gpu_util", 95.0 + (hash((n, g, t)) % 3)))}
    values.update(overrides or {})
    out = [s for n in NODES if n not in skip
           for s in (Sample(t, n, "heartbeat", 1.0, job), Sample(t, n, "gpu_count", 2.0, job))]
    return out + [Sample(t, n, metric, value, job, g) for (n, metric, g), value in values.items() if n not in skip]


def run(monitor: HealthMonitor, ticks: range, **kw) -> list:
    return [d for t in ticks for d in monitor.observe(tick(float(t), **kw), float(t))]


@pytest.mark.parametrize("sample, reason, checkpointable", [
    (Sample(5.0, "n2", "xid", 79.0, "j", 1), "xid-79", False),
    (Sample(5.0, "n2", "xid", 94.0, "j", 1), "xid-94", True),
    (Sample(5.0, "n2", "ecc_uncorrected", 2.0, "j", 0), "ecc-uncorrectable", True),
    (Sample(5.0, "n2", "gpu_count", 1.0, "j"), "gpu-lost", False),
])
def test_hard_signals_confirm_on_the_sample_that_shows_them(sample, reason, checkpointable):
    m = HealthMonitor()
    run(m, range(5))
    [d] = m.observe([sample], 5.0)
    assert (d.ts, d.node, d.kind, d.reason, d.checkpointable, d.job) == (5.0, "n2", "fault", reason, checkpointable, "j")
    assert {"metric", "window", "score"} <= d.evidence.keys()
    assert m.observe([sample], 5.5) == []   # one decision per node


def test_application_xid_is_not_a_hardware_fault():
    m = HealthMonitor()
    assert m.observe([Sample(1.0, "n0", "xid", 13.0, "j", 0)], 1.0) == []


def test_lost_heartbeat_confirms_after_the_timeout_and_clears_when_heartbeats_return():
    m = HealthMonitor(MonitorConfig(clear_after=3))
    run(m, range(5))
    out = run(m, range(5, 9), skip={"n4"})
    lost = [d for d in out if d.node == "n4"]
    # Silent past 2.5 s at t=7 and still at t=8 (the second evaluation, while the others are heard): confirmed.
    assert [(d.ts, d.reason, d.transient, d.checkpointable) for d in lost] == [(8.0, "heartbeat-lost", True, False)]
    back = [d for d in run(m, range(9, 14)) if d.node == "n4"]
    assert [(d.ts, d.state) for d in back] == [(11.0, "cleared")]
    run(m, range(14, 20), skip={"n4"})
    m.release("n4")                                   # e.g. the node was taken away for repair
    assert run(m, range(20, 25), skip={"n4"}) == []   # silence is not reported again until it beats


def test_an_agent_that_says_goodbye_is_not_a_lost_heartbeat():
    m = HealthMonitor()
    run(m, range(5))
    assert m.observe([Sample(5.0, "n4", "heartbeat", 0.0)], 5.0) == []   # the agent stops on purpose
    assert [d for d in run(m, range(5, 12), skip={"n4"}) if d.node == "n4"] == []


def test_one_bad_gpu_makes_its_machine_the_outlier_and_release_returns_it():
    m = HealthMonitor(MonitorConfig(window=2, continuity=2))
    run(m, range(3))
    out = run(m, range(3, 10), overrides={("n1", "nvlink_active", 1): 12.0})
    # z clips at 8: the 2-sample window mean is 4 > 3 at t=3 already; continuity 2 confirms at t=4
    assert [(d.ts, d.node, d.reason, d.transient) for d in out] == [(4.0, "n1", "outlier:nvlink_active", False)]
    assert out[0].evidence["value"] == 12.0 and out[0].evidence["peer_median"] == 18.0
    assert run(m, range(10, 15), overrides={("n1", "nvlink_active", 1): 12.0}) == []   # stays until released
    m.release("n1")
    assert [d.node for d in run(m, range(15, 20), overrides={("n1", "nvlink_active", 1): 12.0})] == ["n1"]


def test_transient_outlier_clears_by_rule():
    cfg = MonitorConfig(window=2, continuity=2, clear_after=3)
    m = HealthMonitor(cfg)
    hot = {("n3", "temperature", 0): 95.0}
    base = {(n, "temperature", 0): 60.0 for n in NODES}
    out = run(m, range(6), overrides={**base, **hot}) + run(m, range(6, 14), overrides=base)
    assert [(d.node, d.reason, d.state) for d in out] == [("n3", "outlier:temperature", "confirmed"),
                                                         ("n3", "outlier:temperature", "cleared")]


def test_lasting_fault_replaces_a_transient_one_but_not_the_reverse():
    m = HealthMonitor()
    run(m, range(3))
    run(m, range(3, 8), skip={"n0"})
    assert m.active["n0"].reason == "heartbeat-lost"
    [d] = m.observe([Sample(8.0, "n0", "xid", 79.0, "j", 0)], 8.0)
    assert m.active["n0"] is d and not d.transient


def test_straggler_decision_names_the_node_and_its_slow_ranks():
    m = HealthMonitor(MonitorConfig(straggler_window=3, straggler_continuity=2))
    out = []
    for t in range(8):
        batch = [Sample(float(t), n, "step_time", 1.3 if (n, g) in {("n5", 0), ("n5", 1)} else 1.0, "j", g)
                 for n in NODES for g in (0, 1)]
        out += m.observe(batch, float(t))
    assert [(d.node, d.kind, d.reason) for d in out] == [("n5", "straggler", "slow-rank")]
    assert out[0].evidence["gpus"] == [0, 1] and out[0].evidence["score"] == pytest.approx(1.3)


def test_nodes_without_a_job_are_not_compared():
    m = HealthMonitor(MonitorConfig(window=1, continuity=1))
    assert run(m, range(5), job=None, overrides={("n1", "gpu_util", 0): 0.0}) == []


@pytest.mark.parametrize("field, value", [("window", 0), ("threshold", 0.0), ("interval", -1.0)])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        MonitorConfig(**{field: value})
