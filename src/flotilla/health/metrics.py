"""The metric names agents publish and how the detectors read each one.

One table, `METRICS`, is the reference (docs/health.md renders it). Per-GPU
metrics carry `gpu` = the local GPU index; the detectors first reduce them to
one value per machine with `reduce` (the GPU that looks worst), then compare
machines of the same role group (same job and role; see `flotilla.health.monitor`). `bad` says which deviation from the peers counts:
"low" (e.g. a throughput that falls), "high" (e.g. a temperature that rises),
or None (published, not compared). A peer deviation is measured in units of
`max(sigma from the MAD, floor, rel_floor * |median|)` so that a metric on which all
healthy machines agree exactly still gets a sensible scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Reduce = Literal["min", "max", "mean"]
Kind = Literal["compared", "hard", "step", "job", "info"]   # job: a job-level signal, published, localises nothing


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    unit: str
    per_gpu: bool
    kind: Kind
    help: str
    reduce: Reduce = "mean"   # compared per-GPU metrics only
    bad: Literal["low", "high"] | None = None
    floor: float = 1.0
    rel_floor: float = 0.0
    transient: bool = False  # a fault seen on this metric clears by rule once the metric is back among its peers
    intermittent: bool = False  # faults come and go (a flapping link): also counted over a longer window


METRICS: tuple[Metric, ...] = (
    # GPU, from NVML
    Metric("gpu_util", "%", True, "compared", "GPU utilisation", "min", "low", floor=3.0),
    Metric("mem_used", "MiB", True, "info", "GPU memory used"),
    Metric("temperature", "C", True, "compared", "GPU core temperature", "max", "high", floor=5.0, transient=True),
    Metric("power", "W", True, "compared", "GPU board power draw", "min", "low", floor=10.0, rel_floor=0.03),
    Metric("sm_clock", "MHz", True, "compared", "SM clock", "min", "low", floor=20.0, rel_floor=0.01),
    Metric("pcie_tx", "MB/s", True, "compared", "PCIe transmit throughput", "min", "low", floor=20.0, rel_floor=0.05),
    Metric("pcie_rx", "MB/s", True, "compared", "PCIe receive throughput", "min", "low", floor=20.0, rel_floor=0.05),
    Metric("pcie_link_width", "lanes", True, "compared", "current PCIe link width", "min", "low", floor=0.5),
    Metric("pcie_link_gen", "gen", True, "compared", "current PCIe link generation", "min", "low", floor=0.25),
    Metric("nvlink_tx", "MB/s", True, "compared", "NVLink transmit throughput", "min", "low", floor=100.0, rel_floor=0.05),
    Metric("nvlink_rx", "MB/s", True, "compared", "NVLink receive throughput", "min", "low", floor=100.0, rel_floor=0.05),
    Metric("nvlink_active", "links", True, "compared", "NVLink links up", "min", "low", floor=0.5),
    Metric("throttle_thermal", "0/1", True, "compared", "clocks held down by a thermal slowdown (HW or SW)", "max", "high",
           floor=0.1, transient=True),
    Metric("throttle_power", "0/1", True, "info", "clocks held at the power cap (normal under full load)"),
    Metric("ecc_corrected", "count", True, "info", "volatile corrected ECC errors since driver load"),
    Metric("ecc_uncorrected", "count", True, "hard", "volatile uncorrectable ECC errors since driver load"),
    Metric("xid", "code", True, "hard", "an XID event (one sample per event; value = XID code)"),
    # machine
    Metric("gpu_count", "GPUs", False, "hard", "GPUs that answer NVML"),
    Metric("heartbeat", "1", False, "hard", "the agent is alive (1, once per interval); 0 = it stops on purpose"),
    Metric("cpu_util", "%", False, "compared", "host CPU utilisation", bad="high", floor=5.0, transient=True),
    Metric("mem_available", "MiB", False, "info", "host memory available"),
    Metric("net_rx", "MB/s", False, "compared", "network receive throughput (all NICs but lo)", bad="low",
           floor=5.0, rel_floor=0.05, transient=True, intermittent=True),
    Metric("net_tx", "MB/s", False, "compared", "network transmit throughput (all NICs but lo)", bad="low",
           floor=5.0, rel_floor=0.05, transient=True, intermittent=True),
    Metric("net_errors", "1/s", False, "compared", "network errors + drops per second (all NICs but lo)", bad="high",
           floor=1.0, transient=True, intermittent=True),
    # training worker, through the agent's step intake; `gpu` = the rank's local GPU index
    Metric("step_time", "s", True, "step", "compute time of the rank's last step, without waiting on collectives"),
    Metric("sync_step_time", "s", True, "job",
           "wall time of the whole synchronous step (every rank waits for the slowest: localises nothing)"),
)

BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}
# Per-GPU metrics that are events, not series: their absence says nothing about the GPU.
EVENTS: frozenset[str] = frozenset({"xid", "step_time", "sync_step_time"})
COMPARED: tuple[Metric, ...] = tuple(m for m in METRICS if m.kind == "compared")
COMPARED_INDEX: dict[str, int] = {m.name: i for i, m in enumerate(COMPARED)}

# XIDs that mean the hardware (not the application) failed. Application XIDs such
# as 13 (graphics engine exception), 31 (MMU fault) or 43 (channel reset) are ignored.
HARDWARE_XIDS: frozenset[int] = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 123, 140})
# Faults after which the job's processes on the machine cannot write a checkpoint.
NO_CHECKPOINT_XIDS: frozenset[int] = frozenset({48, 79, 95, 119, 120})
