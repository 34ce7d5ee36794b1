"""GPU metrics from the DCGM exporter (NVIDIA's dcgm-exporter) on the node: its Prometheus text endpoint.

Most GPU clusters already run dcgm-exporter (the GPU operator installs it); the
agent reads it instead of opening NVML itself when `--dcgm-url` answers. Fields
used (dcgm-exporter's default counters file has all but the PCIe link ones):

| DCGM field | metric | note |
|---|---|---|
| DCGM_FI_DEV_GPU_UTIL | gpu_util (%) | |
| DCGM_FI_DEV_FB_USED | mem_used (MiB) | |
| DCGM_FI_DEV_GPU_TEMP | temperature (C) | |
| DCGM_FI_DEV_POWER_USAGE | power (W) | |
| DCGM_FI_DEV_SM_CLOCK | sm_clock (MHz) | |
| DCGM_FI_PROF_PCIE_TX_BYTES / _RX_BYTES | pcie_tx / pcie_rx (MB/s) | bytes/s |
| DCGM_FI_DEV_PCIE_LINK_WIDTH / _GEN | pcie_link_width / pcie_link_gen | |
| DCGM_FI_PROF_NVLINK_TX_BYTES / _RX_BYTES | nvlink_tx / nvlink_rx (MB/s) | bytes/s |
| DCGM_FI_DEV_ECC_SBE_VOL_TOTAL / _DBE_ | ecc_corrected / ecc_uncorrected | volatile counts, as NVML's |
| DCGM_FI_DEV_CLOCK_THROTTLE_REASONS (or _CLOCKS_EVENT_REASONS) | throttle_thermal, throttle_power | bit mask |
| DCGM_FI_DEV_XID_ERRORS | xid (one sample per new code) | the last XID seen, a gauge |
| DCGM_FI_DEV_PCIE_REPLAY_COUNTER | pcie_replay (1/s) | counter -> rate |
| DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL | nvlink_errors (1/s) | counter -> rate |

Per scrape the source also publishes `gpu_count` (GPUs with series) and
`gpu_source_up` (1; 0 when the scrape failed, so that GPU series falling
silent together with it read as a source outage, not as lost GPUs). A GPU
whose series disappear simply stops having samples (logged once; it comes
back logged too). The first scrape's XID value is a baseline, not an event: it
may be from before the agent started. Two equal XIDs in a row read as one (the
field holds the last code); NVML's event API sees each. MIG instance series
(non-empty GPU_I_ID) are ignored: per-GPU metrics describe whole GPUs.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Iterable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from flotilla.agent.rates import CounterRates
from flotilla.agent.sources import SourceUnavailable
from flotilla.health.samples import Sample

log = logging.getLogger(__name__)

DEFAULT_URL = "http://localhost:9400/metrics"
GAUGES: dict[str, tuple[str, float]] = {   # DCGM field -> (metric, scale)
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_util", 1.0),
    "DCGM_FI_DEV_FB_USED": ("mem_used", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("temperature", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock", 1.0),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("pcie_tx", 1e-6),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("pcie_rx", 1e-6),
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": ("pcie_link_width", 1.0),
    "DCGM_FI_DEV_PCIE_LINK_GEN": ("pcie_link_gen", 1.0),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("nvlink_tx", 1e-6),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("nvlink_rx", 1e-6),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc_corrected", 1.0),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_uncorrected", 1.0),
}
COUNTERS: dict[str, str] = {   # cumulative DCGM field -> rate metric (per second)
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "pcie_replay",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "nvlink_errors",
}
THROTTLE = ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
XID = "DCGM_FI_DEV_XID_ERRORS"
_THERMAL_BITS = 0x20 | 0x40   # SW and HW thermal slowdown, as in NVML
_POWER_CAP_BIT = 0x4


@dataclass
class Scrape:
    """The DCGM series of one scrape: per GPU index, field -> value."""

    gpus: dict[int, dict[str, float]] = field(default_factory=dict)


def parse(text: str) -> Scrape:
    """Prometheus text -> the DCGM fields per GPU. Raises ValueError on text that is not the exposition format.
    Series without a `gpu` label, MIG instance series and non-finite values are skipped."""
    scrape = Scrape()
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                # The parser names a counter's samples `<family>_total`; the DCGM field is the family's name.
                name = family.name if family.type == "counter" and s.name == f"{family.name}_total" else s.name
                if not name.startswith("DCGM_FI_") or s.labels.get("GPU_I_ID"):
                    continue
                gpu = s.labels.get("gpu")
                if gpu is None or not gpu.isdigit() or not math.isfinite(s.value):
                    continue
                scrape.gpus.setdefault(int(gpu), {})[name] = float(s.value)
    except (ValueError, IndexError, KeyError) as e:   # the parser's errors on malformed text
        raise ValueError(f"not Prometheus text: {e}") from None
    return scrape


class DcgmSource:
    name = "dcgm"

    def __init__(self, node: str, url: str = DEFAULT_URL, timeout: float = 2.0,
                 client: httpx.Client | None = None) -> None:
        self.node, self.url = node, url
        self.client = client or httpx.Client(timeout=timeout)
        self._rates = CounterRates()
        self._xid: dict[int, float] = {}
        self._present: set[int] | None = None
        self._down = False
        try:
            first = self._scrape()
        except (httpx.HTTPError, ValueError) as e:
            self.client.close()
            raise SourceUnavailable(f"no DCGM exporter at {url}: {e}") from None
        if not first.gpus:
            self.client.close()
            raise SourceUnavailable(f"{url} has no DCGM GPU series")

    def _scrape(self) -> Scrape:
        r = self.client.get(self.url)
        r.raise_for_status()
        return parse(r.text)

    def collect(self, now: float) -> list[Sample]:
        try:
            scrape = self._scrape()
        except (httpx.HTTPError, ValueError) as e:
            if not self._down:
                log.warning("DCGM exporter at %s does not answer: %s (GPU metrics stop until it does)", self.url, e)
                self._down = True
            return [Sample(now, self.node, "gpu_source_up", 0.0)]
        if self._down:
            log.info("DCGM exporter at %s answers again", self.url)
            self._down = False
        self._note_presence(set(scrape.gpus))
        out = [Sample(now, self.node, "gpu_source_up", 1.0), Sample(now, self.node, "gpu_count", float(len(scrape.gpus)))]
        for gpu, fields in sorted(scrape.gpus.items()):
            out += self._gpu_samples(now, gpu, fields)
        return out

    def _note_presence(self, present: set[int]) -> None:
        if self._present is not None:
            for gpu in sorted(self._present - present):
                log.warning("GPU %d has no series in the DCGM exporter any more (lost, or removed)", gpu)
            for gpu in sorted(present - self._present):
                log.info("GPU %d has series in the DCGM exporter", gpu)
        self._present = present

    def _gpu_samples(self, now: float, gpu: int, fields: dict[str, float]) -> Iterable[Sample]:
        for name, (metric, scale) in GAUGES.items():
            if name in fields:
                yield Sample(now, self.node, metric, fields[name] * scale, gpu=gpu)
        for name, metric in COUNTERS.items():
            if name in fields:
                rate = self._rates.rate((metric, gpu), now, fields[name])
                if rate is not None:
                    yield Sample(now, self.node, metric, rate, gpu=gpu)
        mask = next((fields[n] for n in THROTTLE if n in fields), None)
        if mask is not None:
            yield Sample(now, self.node, "throttle_thermal", float(bool(int(mask) & _THERMAL_BITS)), gpu=gpu)
            yield Sample(now, self.node, "throttle_power", float(bool(int(mask) & _POWER_CAP_BIT)), gpu=gpu)
        if XID in fields:
            code, last = fields[XID], self._xid.get(gpu)
            self._xid[gpu] = code
            if last is not None and code != last and code != 0:
                yield Sample(now, self.node, "xid", code, gpu=gpu)

    def close(self) -> None:
        self.client.close()
