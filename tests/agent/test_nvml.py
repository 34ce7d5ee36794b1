"""NvmlSource against a fake pynvml module."""

import logging

import pytest

from flotilla.agent.nvml import NvmlSource
from flotilla.agent.sources import SourceUnavailable

from fake_pynvml import NVML_ERROR_GPU_IS_LOST, NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_NOT_SUPPORTED, FakeNvml, \
    NVMLError, gpu


def by_key(samples):
    return {(s.metric, s.gpu): s.value for s in samples}


def test_reads_every_metric_with_units_converted():
    nvml = FakeNvml([gpu(), gpu(temp=80, throttle=0x40, links=[1] * 12 + [0] * 6)])
    values = by_key(NvmlSource("n1", nvml).collect(100.0))
    assert values[("gpu_util", 0)] == 97 and values[("mem_used", 0)] == 60 * 1024
    assert values[("power", 0)] == 550.0 and values[("sm_clock", 0)] == 1980
    assert values[("pcie_tx", 0)] == 1500.0 and values[("pcie_rx", 0)] == 1200.0   # KB/s -> MB/s
    assert values[("pcie_link_width", 0)] == 16 and values[("pcie_link_gen", 0)] == 5
    assert values[("ecc_corrected", 0)] == 3 and values[("ecc_uncorrected", 0)] == 0
    assert values[("throttle_power", 0)] == 1.0 and values[("throttle_thermal", 0)] == 0.0
    assert values[("throttle_thermal", 1)] == 1.0 and values[("temperature", 1)] == 80
    assert values[("nvlink_active", 0)] == 18 and values[("nvlink_active", 1)] == 12
    assert values[("gpu_count", None)] == 2
    assert ("nvlink_tx", 0) not in values        # a rate needs two readings


def test_nvlink_throughput_is_the_rate_of_the_cumulative_counters():
    nvml = FakeNvml([gpu(nvlink_kib=(0, 0))])
    source = NvmlSource("n1", nvml)
    source.collect(10.0)
    nvml.gpus[0]["nvlink_kib"] = (2_000_000, 1_000_000)
    values = by_key(source.collect(12.0))
    assert values[("nvlink_tx", 0)] == pytest.approx(2_000_000 * 1.024 / 1000 / 2)
    assert values[("nvlink_rx", 0)] == pytest.approx(1_000_000 * 1.024 / 1000 / 2)


def test_xid_events_are_drained_without_blocking():
    nvml = FakeNvml([gpu(), gpu()])
    source = NvmlSource("n1", nvml)
    assert nvml.registered == [(0, 0xA), (1, 0xA)]
    nvml.events = [(1, 0x8, 79), (0, 0x2, 0)]
    xids = [(s.gpu, s.value) for s in source.collect(5.0) if s.metric == "xid"]
    assert xids == [(1, 79.0), (0, 48.0)]
    assert not [s for s in source.collect(6.0) if s.metric == "xid"]


def test_unsupported_query_is_skipped_and_a_lost_gpu_stops_counting():
    nvml = FakeNvml([gpu(power_mw=NVMLError(NVML_ERROR_NOT_SUPPORTED), links=[]), gpu()])
    source = NvmlSource("n1", nvml)
    values = by_key(source.collect(1.0))
    assert ("power", 0) not in values and ("nvlink_active", 0) not in values and ("gpu_util", 0) in values
    nvml.gpus[1]["util"] = NVMLError(NVML_ERROR_GPU_IS_LOST)
    values = by_key(source.collect(2.0))
    assert values[("gpu_count", None)] == 1
    assert by_key(source.collect(3.0)).get(("temperature", 1)) is None


@pytest.mark.parametrize("nvml, message", [
    (FakeNvml(init_error=NVML_ERROR_LIBRARY_NOT_FOUND), "NVML did not initialise"),
    (FakeNvml([]), "NVML sees no GPU"),
])
def test_no_driver_or_no_gpu_fails_with_a_clear_reason(nvml, message):
    with pytest.raises(SourceUnavailable, match=message):
        NvmlSource("n1", nvml)


def test_agent_command_falls_back_to_host_metrics_with_one_log_line(caplog, monkeypatch):
    import argparse

    from flotilla.commands import agent

    def no_gpu(node):
        raise SourceUnavailable("NVML did not initialise: library not found")

    monkeypatch.setattr(agent, "NvmlSource", no_gpu)
    no_exporter = "http://127.0.0.1:1/metrics"   # nothing listens on port 1
    args = argparse.Namespace(node="n1", source="auto", dcgm_url=no_exporter)
    with caplog.at_level(logging.WARNING, logger="flotilla.agent"):
        sources = agent._gpu_source(args, 0.0)
    assert [s.name for s in sources] == ["host", "heartbeat"]
    assert len(caplog.records) == 1
    assert "library not found" in caplog.records[0].getMessage() and no_exporter in caplog.records[0].getMessage()
    for source in ("nvml", "dcgm"):
        with pytest.raises(SourceUnavailable):
            agent._gpu_source(argparse.Namespace(node="n1", source=source, dcgm_url=no_exporter), 0.0)


def test_gpu_with_every_nvlink_down_reports_zero_links():
    values = by_key(NvmlSource("n1", FakeNvml([gpu(links=[0] * 18)])).collect(1.0))
    assert values[("nvlink_active", 0)] == 0
