"""A stand-in for the `pynvml` module with the calls NvmlSource makes; GPUs are dicts of readings."""

from __future__ import annotations

from types import SimpleNamespace

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_NVLINK_MAX_LINKS = 18
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
nvmlEventTypeDoubleBitEccError = 0x2
nvmlEventTypeXidCriticalError = 0x8


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNvml:
    """Build with a list of GPU reading dicts; `events` is a queue of (gpu index, event type, data)."""

    def __init__(self, gpus: list[dict] | None = None, init_error: int | None = None) -> None:
        self.gpus = gpus or []
        self.init_error = init_error
        self.events: list[tuple[int, int, int]] = []
        self.registered: list[tuple[int, int]] = []
        self.shut_down = False
        for name, value in globals().items():
            if name.startswith(("NVML_", "nvmlEventType")):
                setattr(self, name, value)
        self.NVMLError = NVMLError

    def _read(self, h, key):
        value = self.gpus[h][key]
        if isinstance(value, NVMLError):
            raise value
        return value

    def nvmlInit(self):
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self):
        self.shut_down = True

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self._read(h, "util"))

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=self._read(h, "mem_bytes"))

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._read(h, "temp")

    def nvmlDeviceGetPowerUsage(self, h):
        return self._read(h, "power_mw")

    def nvmlDeviceGetClockInfo(self, h, clock):
        return self._read(h, "sm_mhz")

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        return self._read(h, "pcie_kbps")[counter]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self._read(h, "width")

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self._read(h, "gen")

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        return self._read(h, "ecc")[kind]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return self._read(h, "throttle")

    def nvmlDeviceGetNvLinkState(self, h, link):
        links = self._read(h, "links")
        if link >= len(links):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return links[link]

    def nvmlDeviceGetFieldValues(self, h, ids):
        assert ids == [(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF),
                       (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0xFFFFFFFF)], "expected the all-links scope"
        return [SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(ullVal=v)) for v in self._read(h, "nvlink_kib")]

    def nvmlEventSetCreate(self):
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h, types, event_set):
        self.registered.append((h, types))

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        if not self.events:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        gpu, kind, data = self.events.pop(0)
        return SimpleNamespace(device=gpu, eventType=kind, eventData=data)

    def nvmlEventSetFree(self, event_set):
        pass


def gpu(**overrides) -> dict:
    readings = {"util": 97, "mem_bytes": 60 * 2**30, "temp": 65, "power_mw": 550_000, "sm_mhz": 1980,
                "pcie_kbps": (1_500_000, 1_200_000), "width": 16, "gen": 5, "ecc": (3, 0), "throttle": 0x4,
                "links": [1] * 18, "nvlink_kib": (0, 0)}
    readings.update(overrides)
    return readings
