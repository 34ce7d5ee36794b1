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
    # Silent past the 2 s timeout at t=7 and still at t=8 (the second evaluation, while the others are heard): confirmed.
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
    # the job declares no roles: its machines are compared on temperature once their peer groups are known
    assert run(m, range(20), overrides=base) == []
    out = run(m, range(20, 26), overrides={**base, **hot}) + run(m, range(26, 34), overrides=base)
    assert [(d.node, d.reason, d.state) for d in out] == [("n3", "outlier:temperature", "confirmed"),
                                                         ("n3", "outlier:temperature", "cleared")]


def test_hard_faults_are_decided_while_a_soft_finding_is_open():
    m = HealthMonitor()
    run(m, range(3))
    run(m, range(3, 8), skip={"n0"})
    assert m.active["n0"].reason == "heartbeat-lost"
    [xid] = m.observe([Sample(8.0, "n0", "xid", 79.0, "j", 0)], 8.0)
    [ecc] = m.observe([Sample(8.5, "n0", "ecc_uncorrected", 1.0, "j", 1)], 8.5)
    assert (xid.reason, ecc.reason) == ("xid-79", "ecc-uncorrectable")
    assert m.active["n0"] is ecc and {d.key for d in m.active_on("n0")} == {"heartbeat-lost", "xid", "ecc"}
    assert m.observe([Sample(9.0, "n0", "xid", 48.0, "j", 0)], 9.0) == []   # one decision per node and kind


def test_a_wrong_soft_finding_clears_and_leaves_the_hard_fault_open():
    m = HealthMonitor(MonitorConfig(window=2, continuity=2, clear_after=3))
    low = {("n1", "nvlink_active", 1): 12.0}
    out = run(m, range(6), overrides=low)
    assert [(d.reason, d.state) for d in out] == [("outlier:nvlink_active", "confirmed")]
    [xid] = m.observe([Sample(6.0, "n1", "xid", 79.0, "j", 0)], 6.0)
    out = run(m, range(7, 15))   # nvlink back among its peers: the soft finding was wrong and clears
    assert [(d.reason, d.state) for d in out] == [("outlier:nvlink_active", "cleared")]
    assert m.active_on("n1") == [xid]


def pipeline_tick(t: float, roles: bool, slow_gpu: tuple | None = None, stopped: set = frozenset()) -> list[Sample]:
    """A 4-stage pipeline job on 12 nodes (node i is stage i % 4): the last stage draws 12 % more power and
    computes 12 % longer."""
    out = []
    for i in range(12):
        n = f"p{i}"
        last = i % 4 == 3
        role = f"pp{i % 4}/4" if roles else None
        out.append(Sample(t, n, "heartbeat", 1.0, "pipe"))
        for g in (0, 1):
            if (n, g) in stopped:
                continue
            wobble = ((i * 7 + g * 3 + int(t) * 5) % 11 - 5) / 5
            out.append(Sample(t, n, "power", 500.0 * (1.12 if last else 1.0) + 3 * wobble, "pipe", g, role))
            out.append(Sample(t, n, "gpu_util", 95.0 + wobble, "pipe", g, role))
            slow = 1.1 if (n, g) == slow_gpu and t >= 40 else 1.0
            step = (1.12 if last else 1.0) * slow * (1 + 0.01 * wobble)
            out.append(Sample(t, n, "step_time", step, "pipe", g, role, rank=2 * i + g))
    return out


def test_pipeline_stages_are_compared_within_their_role():
    with_roles, without = HealthMonitor(), HealthMonitor()
    found = {True: [], False: []}
    for t in range(60):
        found[True] += with_roles.observe(pipeline_tick(float(t), True), float(t))
        found[False] += without.observe(pipeline_tick(float(t), False), float(t))
    assert found[True] == []
    # without roles the last stage would be "slow" and draw "too much" against the job's median; its machines'
    # own behaviour puts them in a group of their own instead, and nobody is flagged
    assert found[False] == []
    labels = dict(zip(without._groups["pipe"].nodes, without._groups["pipe"].labels))
    assert len({labels[n] for n in ("p3", "p7", "p11")}) == 1
    assert {labels[f"p{i}"] for i in range(12) if i % 4 != 3} == {"auto0/2"} != {labels["p3"]}


def test_a_straggler_is_found_without_declared_roles_against_its_inferred_group():
    m = HealthMonitor()
    out = [d for t in range(120) for d in m.observe(pipeline_tick(float(t), False, slow_gpu=("p7", 0)), float(t))]
    assert [(d.node, d.reason) for d in out] == [("p7", "slow-rank")]
    assert out[0].evidence["role"] == m._groups["pipe"].labels[m._groups["pipe"].nodes.index("p7")]
    assert 0.05 < out[0].evidence["slowdown"] < 0.15


def test_straggler_decision_names_the_node_its_rank_and_role():
    m = HealthMonitor()
    out = [d for t in range(120) for d in m.observe(pipeline_tick(float(t), True, slow_gpu=("p3", 1)), float(t))]
    assert [(d.node, d.kind, d.reason) for d in out] == [("p3", "straggler", "slow-rank")]
    ev = out[0].evidence
    assert ev["gpus"] == [1] and ev["ranks"] == [7] and ev["role"] == "pp3/4"
    assert out[0].ts - 40 <= 30 and 0.05 < ev["slowdown"] < 0.15


def test_a_node_alone_in_its_role_is_watched_against_its_own_history():
    m = HealthMonitor(MonitorConfig(history_warmup=10))
    out = []
    for t in range(80):
        batch = pipeline_tick(float(t), True)
        # a third role with one node: its NVLink falls to a third at t=50
        batch += [Sample(float(t), "solo", "heartbeat", 1.0, "pipe")]
        batch += [Sample(float(t), "solo", "nvlink_tx", (30000.0 if t < 50 else 10000.0) + 100 * (t % 3), "pipe", g,
                         "solo/1") for g in (0, 1)]
        out += m.observe(batch, float(t))
    [d] = out
    assert (d.node, d.reason, d.evidence["basis"]) == ("solo", "outlier:nvlink_tx", "own-history")
    assert 50 < d.ts <= 62


def test_a_gpu_whose_series_stop_while_its_node_reports_is_lost():
    m = HealthMonitor()
    out = [d for t in range(10) for d in m.observe(pipeline_tick(float(t), True), float(t))]
    out += [d for t in range(10, 20) for d in m.observe(pipeline_tick(float(t), True, stopped={("p2", 1)}), float(t))]
    [d] = out
    assert (d.node, d.reason, d.evidence["gpus"], d.checkpointable) == ("p2", "gpu-lost", [1], False)
    assert d.ts <= 12.0   # last seen at 9: lost once 1.5 s of the node's other series went on without it


def test_a_silent_node_is_no_lost_gpu_and_its_first_batch_back_neither():
    m = HealthMonitor()
    out = [d for t in range(10) for d in m.observe(pipeline_tick(float(t), True), float(t))]
    for t in range(10, 16):
        out += m.observe([s for s in pipeline_tick(float(t), True) if s.node != "p2"], float(t))
    out += m.observe([Sample(16.0, "p2", "heartbeat", 1.0, "pipe")], 16.0)   # back, its GPUs not yet
    out += [d for t in range(17, 25) for d in m.observe(pipeline_tick(float(t), True), float(t))]
    assert [(d.node, d.reason) for d in out if d.state == "confirmed"] == [("p2", "heartbeat-lost")]


def test_nodes_without_a_job_are_not_compared():
    m = HealthMonitor(MonitorConfig(window=1, continuity=1))
    assert run(m, range(5), job=None, overrides={("n1", "gpu_util", 0): 0.0}) == []


@pytest.mark.parametrize("field, value", [("window", 0), ("threshold", 0.0), ("interval", -1.0)])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        MonitorConfig(**{field: value})


def test_gpus_silent_because_the_agents_gpu_source_is_down_are_not_lost():
    m = HealthMonitor()
    out = [d for t in range(10) for d in m.observe(pipeline_tick(float(t), True), float(t))]
    for t in range(10, 20):  # p2's DCGM exporter is down: the agent sends its host series and says so
        batch = [s for s in pipeline_tick(float(t), True) if s.node != "p2" or s.gpu is None]
        out += m.observe(batch + [Sample(float(t), "p2", "gpu_source_up", 0.0)], float(t))
    out += [d for t in range(20, 30) for d in m.observe(pipeline_tick(float(t), True), float(t))]
    assert [(d.node, d.reason) for d in out if d.state == "confirmed"] == []


def small_pipeline_tick(t: float, nvlink: dict | None = None, cpu: dict | None = None, stages: int = 2) -> list[Sample]:
    """A pipeline of `stages` stages x 2 replicas (node s<i> is stage i % stages): role groups of two, judged
    against own history. `nvlink` / `cpu`: node -> factor on its NVLink throughput / CPU."""
    out = []
    for i in range(2 * stages):
        n, role = f"s{i}", f"pp{i % stages}/{stages}"
        wobble = ((i * 7 + int(t) * 5) % 11 - 5) / 5
        out += [Sample(t, n, "heartbeat", 1.0, "small"),
                Sample(t, n, "cpu_util", (48.0 if i % 2 == 0 else 30.0) * (cpu or {}).get(n, 1.0) + wobble, "small",
                       None, role)]
        out += [Sample(t, n, "nvlink_tx", 30000.0 * (nvlink or {}).get(n, 1.0) + 300 * wobble, "small", g, role)
                for g in (0, 1)]
    return out


def test_a_job_wide_change_is_nobodys_fault_while_most_of_a_small_job_carries_findings():
    m = HealthMonitor(MonitorConfig(history_warmup=10))
    out = [d for t in range(40) for d in m.observe(small_pipeline_tick(float(t)), float(t))]
    out += m.observe([Sample(40.0, "s0", "ecc_uncorrected", 1.0, "small", 0),
                      Sample(40.0, "s1", "xid", 79.0, "small", 1)], 40.0)
    assert [(d.node, d.reason) for d in out] == [("s0", "ecc-uncorrectable"), ("s1", "xid-79")]
    # a slow data loader: every machine's NVLink traffic falls by a quarter; two of four still healthy
    slow = dict.fromkeys(["s0", "s1", "s2", "s3"], 0.75)
    assert [d for t in range(41, 90) for d in m.observe(small_pipeline_tick(float(t), nvlink=slow), float(t))] == []
    # the loader recovers; one machine's own fall is found (during the job-wide excursion nothing is judged)
    solo = {"s2": 0.3}
    found = [d for t in range(90, 120) for d in m.observe(small_pipeline_tick(float(t), nvlink=solo), float(t))]
    assert [(d.node, d.reason, d.evidence["basis"]) for d in found] == [("s2", "outlier:nvlink_tx", "own-history")]


def test_a_change_of_one_role_is_no_fault_of_its_two_machines_but_one_machines_change_is():
    m = HealthMonitor(MonitorConfig(history_warmup=10))
    assert [d for t in range(40) for d in m.observe(small_pipeline_tick(float(t), stages=3), float(t))] == []
    # the first stage (s0, s3) feeds from a slow data loader: its CPU rises by 40 %, the other stages' does not
    first = {"s0": 1.4, "s3": 1.4}
    assert [d for t in range(40, 90) for d in m.observe(small_pipeline_tick(float(t), cpu=first, stages=3),
                                                        float(t))] == []
    found = [d for t in range(90, 120)
             for d in m.observe(small_pipeline_tick(float(t), cpu={**first, "s4": 2.0}, stages=3), float(t))]
    assert [(d.node, d.reason, d.evidence["basis"]) for d in found] == [("s4", "outlier:cpu_util", "own-history")]


def test_a_machine_running_a_few_degrees_hotter_than_its_role_peers_is_no_fault_a_heating_gpu_is():
    m = HealthMonitor()
    def temps(t: float, heat: float = 0.0) -> list[Sample]:
        out = []
        for i in range(5):
            base = 70.0 + (8.0 if i == 0 else 0.0) + (heat if i == 3 else 0.0)   # n0: 8 C hotter, always
            out += [Sample(t, f"h{i}", "heartbeat", 1.0, "hot")]
            out += [Sample(t, f"h{i}", "temperature", base + ((i + g + int(t)) % 3 - 1) * 0.5, "hot", g, "pp0/1")
                    for g in (0, 1)]
        return out
    assert [d for t in range(120) for d in m.observe(temps(float(t)), float(t))] == []
    found = [d for t in range(120, 160) for d in m.observe(temps(float(t), heat=20.0), float(t))]
    assert [(d.node, d.reason) for d in found] == [("h3", "outlier:temperature")]


def test_a_dead_node_at_spread_phases_is_confirmed_within_three_and_a_half_seconds_of_its_last_beat():
    nodes = [f"d{i}" for i in range(10)]
    m = HealthMonitor()
    out = []
    for k in range(0, 300):   # node i reports at +i/10 s; the controller is called with each arrival
        t = k / 10
        due = [n for i, n in enumerate(nodes) if (k - i) % 10 == 0 and not (n == "d4" and t > 20.5)]
        out += m.observe([Sample(t, n, "heartbeat", 1.0, "j") for n in due], t)
    [d] = out
    # last beat at 20.4: past the 2 s timeout at one liveness evaluation (every half second) and the next
    assert (d.node, d.reason) == ("d4", "heartbeat-lost") and 20.4 + 2.0 < d.ts <= 20.4 + 3.0


def test_a_finding_is_not_cleared_by_evaluations_that_could_not_judge_it():
    """A machine judged against its own history is not judged during a job-wide excursion (a checkpoint, an
    evaluation phase): those evaluations are no evidence that it recovered. Counting them as calm cleared a
    lasting NVLink fault after 30 s of excursion, then found it again: flag, clear, flag."""
    m = HealthMonitor(MonitorConfig(history_warmup=10))
    assert [d for t in range(40) for d in m.observe(small_pipeline_tick(float(t)), float(t))] == []
    solo = {"s2": 0.3}
    found = [d for t in range(40, 60) for d in m.observe(small_pipeline_tick(float(t), nvlink=solo), float(t))]
    assert [(d.node, d.reason, d.state) for d in found] == [("s2", "outlier:nvlink_tx", "confirmed")]
    phase = {n: 0.4 * solo.get(n, 1.0) for n in ("s0", "s1", "s2", "s3")}   # everyone's traffic falls for 60 s
    during = [d for t in range(60, 120) for d in m.observe(small_pipeline_tick(float(t), nvlink=phase), float(t))]
    after = [d for t in range(120, 150) for d in m.observe(small_pipeline_tick(float(t), nvlink=solo), float(t))]
    assert during == [] and after == [], [(d.node, d.reason, d.state) for d in during + after]
    # it recovers: judged normal again for clear_after evaluations, it clears
    healed = [d for t in range(150, 200) for d in m.observe(small_pipeline_tick(float(t)), float(t))]
    assert [(d.node, d.state) for d in healed] == [("s2", "cleared")]
