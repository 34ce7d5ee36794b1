"""The DCGM exporter source: Prometheus text parsed, fields mapped, counters turned into rates, XIDs as events,
GPUs whose series vanish simply stop, an exporter outage said once. Served by a real HTTP server."""

import logging

import pytest
from fake_dcgm_exporter import Exporter, exposition

from flotilla.agent.dcgm import DcgmSource, parse
from flotilla.agent.sources import SourceUnavailable


@pytest.fixture
def exporter():
    e = Exporter(exposition([0, 1]))
    yield e
    e.close()


def by_key(samples):
    return {(s.metric, s.gpu): s.value for s in samples}


def test_parse_keeps_dcgm_fields_per_gpu_and_skips_mig_and_unlabelled_series():
    scrape = parse(exposition([0, 3]))
    assert sorted(scrape.gpus) == [0, 3]
    assert scrape.gpus[0]["DCGM_FI_DEV_GPU_UTIL"] == 97.0 and scrape.gpus[3]["DCGM_FI_DEV_POWER_USAGE"] == 650.5


def test_parse_rejects_text_that_is_not_the_exposition_format():
    with pytest.raises(ValueError, match="not Prometheus text"):
        parse("<html><body>502 Bad Gateway</body></html>")


def test_fields_map_to_the_agents_metric_names_and_units(exporter):
    source = DcgmSource("n1", exporter.url)
    values = by_key(source.collect(10.0))
    assert values[("gpu_util", 0)] == 97.0 and values[("mem_used", 1)] == 40000.0
    assert values[("temperature", 0)] == 60.0 and values[("power", 1)] == 650.5
    assert values[("nvlink_tx", 0)] == 2500.0            # bytes/s -> MB/s, as the NVML source reports it
    assert values[("ecc_uncorrected", 1)] == 0.0
    assert values[("throttle_thermal", 0)] == 0.0 and values[("throttle_power", 0)] == 0.0
    assert values[("gpu_count", None)] == 2.0 and values[("gpu_source_up", None)] == 1.0
    assert ("pcie_replay", 0) not in values              # a counter's first sample has no rate
    assert all(s.node == "n1" and s.job is None for s in source.collect(11.0))
    source.close()


def test_counters_become_rates_and_a_reset_is_not_negative(exporter):
    source = DcgmSource("n1", exporter.url)
    source.collect(10.0)
    exporter.text = exposition([0, 1], replay={0: 30})
    assert by_key(source.collect(12.0))[("pcie_replay", 0)] == 15.0
    exporter.text = exposition([0, 1], replay={0: 4})     # the exporter restarted: the counter is back near 0
    assert by_key(source.collect(13.0))[("pcie_replay", 0)] == 4.0


def test_an_xid_is_one_event_when_the_last_code_changes_and_the_first_scrape_is_a_baseline():
    e = Exporter(exposition([0, 1], xid={1: 13}))         # an XID from before the agent started
    try:
        source = DcgmSource("n1", e.url)
        assert [s for s in source.collect(1.0) if s.metric == "xid"] == []
        e.text = exposition([0, 1], xid={1: 79}, throttle={0: 0x40})
        new = source.collect(2.0)
        assert [(s.gpu, s.value) for s in new if s.metric == "xid"] == [(1, 79.0)]
        assert by_key(new)[("throttle_thermal", 0)] == 1.0
        assert [s for s in source.collect(3.0) if s.metric == "xid"] == []    # same code: no new event
    finally:
        e.close()


def test_a_gpu_whose_series_vanish_stops_having_samples_logged_once(exporter, caplog):
    source = DcgmSource("n1", exporter.url)
    source.collect(1.0)
    exporter.text = exposition([0])
    with caplog.at_level(logging.INFO, logger="flotilla.agent.dcgm"):
        gone = source.collect(2.0)
        again = source.collect(3.0)
    assert {s.gpu for s in gone + again if s.gpu is not None} == {0}
    assert by_key(again)[("gpu_count", None)] == 1.0
    lost = [r for r in caplog.records if "GPU 1 has no series" in r.getMessage()]
    assert len(lost) == 1


def test_an_exporter_outage_is_said_once_and_publishes_source_down(exporter, caplog):
    source = DcgmSource("n1", exporter.url)
    exporter.status = 503
    with caplog.at_level(logging.WARNING, logger="flotilla.agent.dcgm"):
        down = [source.collect(t) for t in (1.0, 2.0, 3.0)]
    assert all(by_key(batch) == {("gpu_source_up", None): 0.0} for batch in down)
    assert len([r for r in caplog.records if "does not answer" in r.getMessage()]) == 1
    exporter.status = 200
    assert by_key(source.collect(4.0))[("gpu_source_up", None)] == 1.0


def test_no_exporter_or_no_gpu_series_is_source_unavailable(exporter):
    with pytest.raises(SourceUnavailable, match="no DCGM exporter"):
        DcgmSource("n1", "http://127.0.0.1:1/metrics")
    exporter.text = "# nothing from DCGM here\nprocess_cpu_seconds_total 3\n"
    with pytest.raises(SourceUnavailable, match="no DCGM GPU series"):
        DcgmSource("n1", exporter.url)
