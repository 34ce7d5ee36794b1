"""A lost GPU whose cached counters keep arriving: the node's GPU count, and its measurements' silence."""

from flotilla.health.monitor import HealthMonitor
from flotilla.health.samples import Sample

NODES = [f"n{i}" for i in range(4)]


def batch(t: float, node: str, *, count: float | None, lost: int | None = None) -> list[Sample]:
    out = [Sample(t, node, "heartbeat", 1.0, "j")]
    if count is not None:
        out.append(Sample(t, node, "gpu_count", count, "j"))
    for g in range(4):
        out.append(Sample(t, node, "ecc_uncorrected", 0.0, "j", g))   # served from the exporter's cache
        if g != lost:
            out += [Sample(t, node, "gpu_util", 95.0, "j", g), Sample(t, node, "power", 500.0, "j", g)]
    return out


def drive(m: HealthMonitor, ticks: range, *, count: bool, lost_from: float = 1e9) -> list:
    out = []
    for t in ticks:
        for i, node in enumerate(NODES):
            now = t + 0.1 * i
            gone = node == "n2" and now >= lost_from
            out += m.observe(batch(now, node, count=(3.0 if gone else 4.0) if count else None,
                                   lost=2 if gone else None), now)
    return out


def test_a_drop_in_gpu_count_flags_the_lost_gpu_at_once_and_names_it():
    m = HealthMonitor()
    assert drive(m, range(10), count=True) == []
    [d] = drive(m, range(10, 20), count=True, lost_from=10.0)
    assert (d.node, d.reason, d.ts, d.checkpointable) == ("n2", "gpu-lost", 10.2, False)
    assert d.evidence["gpus"] == [2] and d.evidence["expected"] == 4.0 and d.evidence["value"] == 3.0


def test_without_a_count_the_gpu_is_lost_when_its_measurements_stop_though_its_ecc_counter_goes_on():
    m = HealthMonitor()
    assert drive(m, range(10), count=False) == []
    out = drive(m, range(10, 20), count=False, lost_from=10.0)
    [d] = [d for d in out if d.state == "confirmed"]
    assert (d.node, d.reason, d.evidence["gpus"]) == ("n2", "gpu-lost", [2])
    assert d.ts - 10.0 <= 3.0


def test_a_count_that_rises_is_the_new_expectation_and_a_release_accepts_the_lower_one():
    m = HealthMonitor()
    assert m.observe([Sample(0.0, "n0", "gpu_count", 7.0)], 0.0) == []
    assert m.observe([Sample(1.0, "n0", "gpu_count", 8.0)], 1.0) == []
    [d] = m.observe([Sample(2.0, "n0", "gpu_count", 7.0)], 2.0)
    assert d.evidence["expected"] == 8.0 and "gpus" not in d.evidence   # no measurements to name the GPU by
    m.release("n0")
    assert m.observe([Sample(3.0, "n0", "gpu_count", 7.0)], 3.0) == []
