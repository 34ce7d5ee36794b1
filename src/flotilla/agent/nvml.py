"""GPU metrics from NVML through nvidia-ml-py (`import pynvml`).

Per GPU: utilisation, memory used, temperature, power, SM clock, PCIe
throughput and link width/generation, NVLink links up and throughput (where
the GPU has NVLink), volatile ECC counters, throttle reasons, and XID events
(NVML event API, drained without blocking at every collect). A query the GPU
does not support is skipped for good after its first NotSupported; a GPU that
reports "GPU is lost" stops counting in `gpu_count`.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType
from typing import Any, Callable, TypeVar

from flotilla.agent.rates import CounterRates
from flotilla.agent.sources import SourceUnavailable
from flotilla.health.samples import Sample

T = TypeVar("T")
log = logging.getLogger(__name__)

_THERMAL_BITS = 0x20 | 0x40          # SW and HW thermal slowdown
_POWER_CAP_BIT = 0x4
_ALL_LINKS = 0xFFFFFFFF            # field-value scope: the sum over every NVLink link


class NvmlSource:
    name = "nvml"

    def __init__(self, node: str, nvml: ModuleType | None = None) -> None:
        try:
            self.nvml = nvml or importlib.import_module("pynvml")
        except ImportError as e:
            raise SourceUnavailable(f"nvidia-ml-py is not installed ({e})") from None
        try:
            self.nvml.nvmlInit()
            count = self.nvml.nvmlDeviceGetCount()
            self.handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except self.nvml.NVMLError as e:
            raise SourceUnavailable(f"NVML did not initialise: {e} (no NVIDIA driver or GPU visible)") from None
        if not self.handles:
            raise SourceUnavailable("NVML sees no GPU")
        self.node = node
        self._unsupported: set[tuple[int, str]] = set()
        self._lost: set[int] = set()
        self._rates = CounterRates()
        self._events = self._register_events()

    def _register_events(self) -> Any:
        n = self.nvml
        try:
            events = n.nvmlEventSetCreate()
        except n.NVMLError as e:
            log.warning("NVML event set unavailable, XID events will not be reported: %s", e)
            return None
        for handle in self.handles:
            try:
                n.nvmlDeviceRegisterEvents(handle, n.nvmlEventTypeXidCriticalError | n.nvmlEventTypeDoubleBitEccError,
                                           events)
            except n.NVMLError as e:
                log.warning("cannot register XID events on a GPU: %s", e)
        return events

    def _query(self, gpu: int, name: str, fn: Callable[[], T]) -> T | None:
        if (gpu, name) in self._unsupported or gpu in self._lost:
            return None
        try:
            return fn()
        except self.nvml.NVMLError as e:
            code = getattr(e, "value", None)
            if code == self.nvml.NVML_ERROR_GPU_IS_LOST:
                log.error("GPU %d is lost", gpu)
                self._lost.add(gpu)
            elif code == self.nvml.NVML_ERROR_NOT_SUPPORTED:
                self._unsupported.add((gpu, name))
            else:
                log.debug("NVML %s on GPU %d failed: %s", name, gpu, e)
            return None

    def _gpu_values(self, gpu: int, h: Any, now: float) -> dict[str, float | None]:
        n = self.nvml
        q = self._query
        throttle = q(gpu, "throttle", lambda: n.nvmlDeviceGetCurrentClocksThrottleReasons(h))
        values = {
            "gpu_util": q(gpu, "gpu_util", lambda: n.nvmlDeviceGetUtilizationRates(h).gpu),
            "mem_used": q(gpu, "mem_used", lambda: n.nvmlDeviceGetMemoryInfo(h).used / 2**20),
            "temperature": q(gpu, "temperature", lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
            "power": q(gpu, "power", lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0),
            "sm_clock": q(gpu, "sm_clock", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
            # NVML reports PCIe throughput in KB/s
            "pcie_tx": q(gpu, "pcie_tx", lambda: n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_TX_BYTES) / 1000.0),
            "pcie_rx": q(gpu, "pcie_rx", lambda: n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_RX_BYTES) / 1000.0),
            "pcie_link_width": q(gpu, "pcie_link_width", lambda: n.nvmlDeviceGetCurrPcieLinkWidth(h)),
            "pcie_link_gen": q(gpu, "pcie_link_gen", lambda: n.nvmlDeviceGetCurrPcieLinkGeneration(h)),
            "ecc_corrected": q(gpu, "ecc_corrected", lambda: n.nvmlDeviceGetTotalEccErrors(
                h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC)),
            "ecc_uncorrected": q(gpu, "ecc_uncorrected", lambda: n.nvmlDeviceGetTotalEccErrors(
                h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)),
            "throttle_thermal": None if throttle is None else float(bool(int(throttle) & _THERMAL_BITS)),
            "throttle_power": None if throttle is None else float(bool(int(throttle) & _POWER_CAP_BIT)),
        }
        values.update(self._nvlink(gpu, h, now))
        return values

    def _nvlink(self, gpu: int, h: Any, now: float) -> dict[str, float | None]:
        n = self.nvml
        if (gpu, "nvlink") in self._unsupported or gpu in self._lost:
            return {}
        links = active = 0
        for link in range(n.NVML_NVLINK_MAX_LINKS):
            try:
                state = n.nvmlDeviceGetNvLinkState(h, link)
            except n.NVMLError:
                break   # links are numbered densely; the first error is past the last link
            links += 1
            active += int(state == 1)
        if links == 0:
            self._unsupported.add((gpu, "nvlink"))
            return {}
        out: dict[str, float | None] = {"nvlink_active": float(active)}
        counters = self._query(gpu, "nvlink_throughput", lambda: n.nvmlDeviceGetFieldValues(
            h, [(n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _ALL_LINKS), (n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _ALL_LINKS)]))
        if counters is not None and all(v.nvmlReturn == 0 for v in counters):
            for metric, v in zip(("nvlink_tx", "nvlink_rx"), counters):   # cumulative KiB -> MB/s
                rate = self._rates.rate((metric, gpu), now, float(v.value.ullVal))
                if rate is not None:
                    out[metric] = rate * 1.024 / 1000
        return out

    def _xid_events(self, now: float) -> list[Sample]:
        n = self.nvml
        out: list[Sample] = []
        if self._events is None:
            return out
        while True:
            try:
                event = n.nvmlEventSetWait_v2(self._events, 0)
            except n.NVMLError as e:
                if getattr(e, "value", None) != n.NVML_ERROR_TIMEOUT:
                    log.debug("NVML event wait failed: %s", e)
                return out
            gpu = next((i for i, h in enumerate(self.handles) if h == event.device), None)
            if event.eventType & n.nvmlEventTypeXidCriticalError:
                out.append(Sample(now, self.node, "xid", float(event.eventData), gpu=gpu))
            elif event.eventType & n.nvmlEventTypeDoubleBitEccError:
                out.append(Sample(now, self.node, "xid", 48.0, gpu=gpu))

    def collect(self, now: float) -> list[Sample]:
        out: list[Sample] = []
        for gpu, handle in enumerate(self.handles):
            for metric, value in self._gpu_values(gpu, handle, now).items():
                if value is not None:
                    out.append(Sample(now, self.node, metric, float(value), gpu=gpu))
        out.append(Sample(now, self.node, "gpu_count", float(len(self.handles) - len(self._lost))))
        return out + self._xid_events(now)

    def close(self) -> None:
        try:
            if self._events is not None:
                self.nvml.nvmlEventSetFree(self._events)
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError as e:
            log.debug("NVML shutdown: %s", e)
