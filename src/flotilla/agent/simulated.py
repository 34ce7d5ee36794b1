"""A simulated fleet: healthy-but-noisy GPU machines plus injected faults with realistic signatures.

Every machine belongs to a job; machines of a job run the same work, so their
metrics agree up to per-machine offsets and per-sample noise. Each job changes
phase now and then (evaluation, data stall, checkpoint) and all its machines
follow within a couple of seconds: a load shift that must not be flagged.

Faults (`FAULTS`), with the signature they show on real machines:

  ecc_error         uncorrectable ECC count rises on one GPU, XID 94 (contained ECC error)
  fell_off_bus      XID 79, one GPU stops answering: gpu_count drops, its metrics vanish
  nvlink_down       some NVLink links of one GPU go down; its NVLink throughput falls with them
  pcie_downgrade    one GPU's link trains at x8 (or Gen3); its PCIe throughput halves
  thermal_throttle  one GPU heats up over ~30 s, thermal slowdown engages, SM clock and power fall
  nic_flapping      the node's NIC drops for a few seconds again and again; errors and drops spike
  slow_network      the node's network throughput falls by 40-60 % and stays there
  slow_host         CPU contention: every rank on the node computes 15-40 % slower (a straggler)
  node_down         the node (and its agent) stops: no heartbeat, no samples

The schedule is seeded; `write_ground_truth` records it as JSON lines.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from flotilla.health.metrics import COMPARED, METRICS
from flotilla.health.monitor import JobFrame
from flotilla.health.samples import Sample

HARD_FAULTS = ("ecc_error", "fell_off_bus", "node_down")
SOFT_FAULTS = ("nvlink_down", "pcie_downgrade", "thermal_throttle", "nic_flapping", "slow_network", "slow_host")
FAULTS = HARD_FAULTS + SOFT_FAULTS

GPU_METRICS = tuple(m.name for m in METRICS if m.per_gpu and m.kind in ("compared", "info"))
HOST_METRICS = ("cpu_util", "mem_available", "net_rx", "net_tx", "net_errors")
# healthy level at full training load and per-sample noise (standard deviation)
BASE = {
    "gpu_util": (96.0, 1.5), "mem_used": (61000.0, 200.0), "temperature": (66.0, 1.0), "power": (560.0, 12.0),
    "sm_clock": (1980.0, 8.0), "pcie_tx": (1500.0, 120.0), "pcie_rx": (1500.0, 120.0), "pcie_link_width": (16.0, 0.0),
    "pcie_link_gen": (5.0, 0.0), "nvlink_tx": (40000.0, 1500.0), "nvlink_rx": (40000.0, 1500.0),
    "nvlink_active": (18.0, 0.0), "throttle_thermal": (0.0, 0.0), "throttle_power": (0.0, 0.0),
    "ecc_corrected": (0.0, 0.0), "cpu_util": (30.0, 3.0), "mem_available": (1500000.0, 2000.0),
    "net_rx": (20000.0, 800.0), "net_tx": (20000.0, 800.0), "net_errors": (0.0, 0.0), "step_time": (1.0, 0.02),
}
# job phases: (name, multiplier per metric); metrics not named keep their level
PHASES: tuple[tuple[str, dict[str, float]], ...] = (
    ("train", {}),
    ("eval", {"gpu_util": 0.55, "power": 0.7, "temperature": 0.92, "nvlink_tx": 0.15, "nvlink_rx": 0.15,
              "net_rx": 0.2, "net_tx": 0.2, "pcie_tx": 0.6, "pcie_rx": 0.6, "cpu_util": 1.3}),
    ("data_stall", {"gpu_util": 0.3, "power": 0.5, "nvlink_tx": 0.3, "nvlink_rx": 0.3, "net_rx": 0.4, "net_tx": 0.4,
                    "cpu_util": 1.8, "pcie_rx": 2.0, "step_time": 1.6}),
    ("checkpoint", {"gpu_util": 0.2, "power": 0.45, "pcie_tx": 3.0, "net_tx": 1.5, "nvlink_tx": 0.1,
                    "nvlink_rx": 0.1, "cpu_util": 1.5}),
)

_XID = {"ecc_error": 94, "fell_off_bus": 79}
_STALL = {"gpu_util": 0.4, "power": 0.75, "nvlink_tx": 0.5, "nvlink_rx": 0.5, "step_time": 1.5}
_MULT = {m: np.array([mults.get(m, 1.0) for _, mults in PHASES]) for m in BASE}


@dataclass(frozen=True, slots=True)
class Fault:
    node: str
    fault: str
    start: float
    end: float | None = None   # None: until the end of the run (hardware faults stay)
    gpu: int = 0

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"fault field 'fault' must be one of {', '.join(FAULTS)}, not {self.fault!r}")
        if self.end is not None and self.end <= self.start:
            raise ValueError("fault field 'end' must be after 'start'")

    @property
    def hard(self) -> bool:
        return self.fault in HARD_FAULTS

    def active(self, t: float) -> bool:
        return self.start <= t and (self.end is None or t < self.end)


def parse_fault(node: str, text: str) -> Fault:
    """`TYPE@START[+DURATION][#GPU]`, seconds from the start of the run, e.g. `nvlink_down@30+600#2`."""
    kind, _, rest = text.partition("@")
    if not rest:
        raise ValueError(f"fault {text!r}: expected TYPE@START[+DURATION][#GPU]")
    rest, _, gpu = rest.partition("#")
    start, _, duration = rest.partition("+")
    try:
        start_s = float(start)
        return Fault(node, kind, start_s, start_s + float(duration) if duration else None, int(gpu) if gpu else 0)
    except ValueError as e:
        raise ValueError(f"fault {text!r}: {e}") from None


def random_schedule(nodes: Sequence[str], duration: float, per_type: int, seed: int, gpus: int = 8,
                    kinds: Sequence[str] = FAULTS) -> list[Fault]:
    """`per_type` faults of each kind on distinct random nodes, starting in the first 85 % of the run."""
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(nodes), size=per_type * len(kinds), replace=False)
    faults = []
    for i, node_index in enumerate(picks):
        kind = kinds[i // per_type]
        start = float(np.floor(rng.uniform(0.05, 0.85) * duration))
        transient = kind in ("thermal_throttle", "nic_flapping", "slow_network", "slow_host")
        end = start + float(np.floor(rng.uniform(300, 1800))) if transient else None
        faults.append(Fault(nodes[node_index], kind, start, end, int(rng.integers(gpus))))
    return sorted(faults, key=lambda f: (f.start, f.node))


def write_ground_truth(faults: Iterable[Fault], path: str | Path) -> None:
    with open(path, "w") as f:
        for fault in faults:
            f.write(json.dumps({**asdict(fault), "hard": fault.hard}) + "\n")


def _rng(seed: int, *names: str) -> np.random.Generator:
    return np.random.default_rng([seed, *(zlib.crc32(n.encode()) for n in names)])


class _Job:
    """Arrays of one job's machines; `tick` fills the current values."""

    def __init__(self, name: str, nodes: list[str], gpus: int, seed: int, faults: list[Fault], jitter: bool) -> None:
        self.name, self.nodes, self.gpus = name, nodes, gpus
        self.rng = _rng(seed, "noise", name, *nodes)
        # per-machine manufacturing spread, as a fraction of the noise
        offsets = _rng(seed, "offset", name, *nodes)
        self.offset = {m: offsets.normal(0, 1.0, (len(nodes), gpus)) for m in GPU_METRICS + ("step_time",)}
        self.host_offset = {m: offsets.normal(0, 1.0, len(nodes)) for m in HOST_METRICS}
        self.delay = (offsets.integers(0, 3, len(nodes)) if jitter else np.zeros(len(nodes), dtype=int))
        self.hot = np.where(offsets.random(len(nodes)) < 0.05, 4.0, 0.0)[:, None]
        self.stall_until = np.full(len(nodes), -1.0)
        self.phases = self._phase_schedule(_rng(seed, "phase", name))
        self.row = {n: i for i, n in enumerate(nodes)}
        self.faults = [f for f in faults if f.node in self.row]
        self.xid_sent: set[Fault] = set()

    @staticmethod
    def _phase_schedule(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(starts, ends, phase index) of the job's non-training phases over ten days."""
        starts, ends, phases, t = [], [], [], 0.0
        while t < 10 * 86400:
            t += rng.exponential(1200.0)
            starts.append(t)
            t += rng.uniform(60, 400)
            ends.append(t)
            phases.append(int(rng.integers(1, len(PHASES))))
        return np.array(starts), np.array(ends), np.array(phases)

    def _phase(self, t: np.ndarray) -> np.ndarray:
        """Each machine's phase index at its own (slightly delayed) time t."""
        starts, ends, phases = self.phases
        i = np.searchsorted(starts, t, side="right") - 1
        inside = (i >= 0) & (t < ends[np.maximum(i, 0)])
        return np.where(inside, phases[np.maximum(i, 0)], 0)

    def tick(self, t: float) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
        n, g = len(self.nodes), self.gpus
        phase = self._phase(t - self.delay)
        glitch = np.where(self.rng.random((n, g)) < 0.002, 6.0, 1.0)
        starts = self.rng.random(n) < 1 / 7200
        self.stall_until = np.where(starts, t + self.rng.integers(1, 4, n), self.stall_until)
        stalled = (t < self.stall_until)[:, None]
        gpu: dict[str, np.ndarray] = {}
        for m in GPU_METRICS + ("step_time",):
            level, noise = BASE[m]
            factor = _MULT[m][phase][:, None] * np.where(stalled, _STALL.get(m, 1.0), 1.0)
            gpu[m] = level * factor + noise * (0.5 * self.offset[m] + glitch * self.rng.standard_normal((n, g)))
        gpu["temperature"] += self.hot
        gpu["throttle_power"] = (self.rng.random((n, g)) < 0.05).astype(float)
        gpu["ecc_corrected"] = np.zeros((n, g))
        host: dict[str, np.ndarray] = {}
        for m in HOST_METRICS:
            level, noise = BASE[m]
            host[m] = level * _MULT[m][phase] + noise * (0.5 * self.host_offset[m] + self.rng.standard_normal(n))
        host["net_errors"] = self.rng.poisson(0.02, n).astype(float)
        hard = {"ecc_uncorrected": np.zeros((n, g)), "xid": np.zeros((n, g)), "gpu_count": np.full(n, float(g)),
                "alive": np.ones(n, dtype=bool), "gpu_alive": np.ones((n, g), dtype=bool)}
        for f in self.faults:
            if f.active(t):
                self._inject(f, self.row[f.node], t - f.start, gpu, host, hard)
        gpu["step_time"] = np.maximum(gpu["step_time"], 0.01)
        return gpu, host, hard

    def _inject(self, f: Fault, i: int, age: float, gpu: dict, host: dict, hard: dict) -> None:
        k = f.gpu
        if f.fault in _XID and f not in self.xid_sent:   # the XID event fires once, when the fault strikes
            hard["xid"][i, k] = _XID[f.fault]
            self.xid_sent.add(f)
        if f.fault == "ecc_error":
            hard["ecc_uncorrected"][i, k] = 1 + int(age // 60)
        elif f.fault == "fell_off_bus":
            hard["gpu_alive"][i, k] = False
            hard["gpu_count"][i] -= 1
        elif f.fault == "node_down":
            hard["alive"][i] = False
        elif f.fault == "nvlink_down":
            down = 6 + (zlib.crc32(f.node.encode()) % 13)        # 6..18 of 18 links
            gpu["nvlink_active"][i, k] = 18 - down
            for m in ("nvlink_tx", "nvlink_rx"):
                gpu[m][i, k] *= (18 - down) / 18
            gpu["step_time"][i] *= 1.05
        elif f.fault == "pcie_downgrade":
            if zlib.crc32(f.node.encode()) % 2:
                gpu["pcie_link_width"][i, k] = 8
            else:
                gpu["pcie_link_gen"][i, k] = 3
            for m in ("pcie_tx", "pcie_rx"):
                gpu[m][i, k] *= 0.5
        elif f.fault == "thermal_throttle":
            heat = min(age / 30.0, 1.0) * 24.0
            gpu["temperature"][i, k] += heat
            if heat > 18.0:
                gpu["throttle_thermal"][i, k] = 1.0
                gpu["sm_clock"][i, k] *= 0.75
                gpu["power"][i, k] *= 0.8
                gpu["gpu_util"][i, k] *= 0.97
        elif f.fault == "nic_flapping":
            if age % 15 < 4:      # down 4 s of every 15
                host["net_rx"][i] *= 0.02
                host["net_tx"][i] *= 0.02
                host["net_errors"][i] += 200.0
            gpu["step_time"][i] *= 1.1
        elif f.fault == "slow_network":
            slow = 0.4 + 0.2 * ((zlib.crc32(f.node.encode()) % 100) / 100)
            host["net_rx"][i] *= slow
            host["net_tx"][i] *= slow
        elif f.fault == "slow_host":
            gpu["step_time"][i] *= 1.15 + 0.25 * ((zlib.crc32(f.node.encode()) % 100) / 100)
            host["cpu_util"][i] += 25.0
            gpu["gpu_util"][i] -= 6.0


class Fleet:
    """Simulated machines `(node, job)`; `tick(t)` for frames (bench), `samples(t)` for agents."""

    def __init__(self, members: Sequence[tuple[str, str | None]], *, gpus: int = 8, seed: int = 0,
                 faults: Sequence[Fault] = (), jitter: bool = True) -> None:
        by_job: dict[str, list[str]] = {}
        for node, job in members:
            by_job.setdefault(job or "", []).append(node)
        self.gpus = gpus
        self._jobs = [_Job(job, nodes, gpus, seed, list(faults), jitter) for job, nodes in by_job.items()]
        self._reported: dict[tuple[str, str], float] = {}   # (node, metric) -> last value sent

    def tick(self, t: float) -> tuple[list[JobFrame], list[Sample]]:
        """Per job, the frame the monitor would build, and the hard-signal samples of this second
        (heartbeats, XID events, ECC and GPU-count changes)."""
        frames: list[JobFrame] = []
        hard_samples: list[Sample] = []
        for job in self._jobs:
            gpu, host, hard = job.tick(t)
            alive = hard["alive"]
            values = np.full((len(job.nodes), len(COMPARED)), np.nan)
            for k, metric in enumerate(COMPARED):
                if metric.per_gpu:
                    data = np.where(hard["gpu_alive"], gpu[metric.name], np.nan)
                    values[:, k] = getattr(np, "nan" + metric.reduce)(data, axis=1)
                else:
                    values[:, k] = host[metric.name]
            values[~alive] = np.nan
            steps = np.where(hard["gpu_alive"] & alive[:, None], gpu["step_time"], np.nan).ravel()
            name = job.name or None
            if name is not None:
                ranks = tuple((n, g) for n in job.nodes for g in range(job.gpus))
                frames.append(JobFrame(job.name, tuple(job.nodes), values, ranks, steps))
            hard_samples += self._hard_samples(job, t, hard, name)
        return frames, hard_samples

    def _hard_samples(self, job: _Job, t: float, hard: dict, name: str | None) -> list[Sample]:
        out = []
        for i in np.flatnonzero(hard["alive"]):
            node = job.nodes[i]
            out.append(Sample(t, node, "heartbeat", 1.0, name))
            for key, value in (("gpu_count", hard["gpu_count"][i]),
                               ("ecc_uncorrected", float(hard["ecc_uncorrected"][i].max()))):
                if self._reported.get((node, key)) != value:
                    self._reported[(node, key)] = value
                    out.append(Sample(t, node, key, value, name))
            for g in np.flatnonzero(hard["xid"][i]):
                out.append(Sample(t, node, "xid", float(hard["xid"][i, g]), name, int(g)))
        return out

    def samples(self, t: float, stamp: float | None = None) -> list[Sample]:
        """Everything an agent on each live machine would publish at run time t (stamped `stamp`, default t)."""
        out: list[Sample] = []
        ts = t if stamp is None else stamp
        for job in self._jobs:
            gpu, host, hard = job.tick(t)
            name = job.name or None
            for i, node in enumerate(job.nodes):
                if not hard["alive"][i]:
                    continue
                out.append(Sample(ts, node, "heartbeat", 1.0, name))
                out.append(Sample(ts, node, "gpu_count", float(hard["gpu_count"][i]), name))
                out += [Sample(ts, node, m, float(host[m][i]), name) for m in HOST_METRICS]
                for g in map(int, np.flatnonzero(hard["gpu_alive"][i])):
                    out += [Sample(ts, node, m, float(gpu[m][i, g]), name, g) for m in GPU_METRICS]
                    out.append(Sample(ts, node, "ecc_uncorrected", float(hard["ecc_uncorrected"][i, g]), name, g))
                    if name is not None:
                        out.append(Sample(ts, node, "step_time", float(gpu["step_time"][i, g]), name, g))
                out += [Sample(ts, node, "xid", float(hard["xid"][i, g]), name, int(g))
                        for g in np.flatnonzero(hard["xid"][i])]
        return out


class SimulatedSource:
    """One simulated machine, for an agent started with `--source sim`. Faults are timed from `start`
    (the agent's start); a `node_down` fault silences the source, heartbeat included. `clock_offset`
    (test-only) stamps samples that many seconds off the wall clock: a node whose clock is skewed."""

    name = "sim"

    def __init__(self, node: str, job: str | None, start: float, *, faults: Sequence[Fault] = (), gpus: int = 8,
                 seed: int = 0, clock_offset: float = 0.0) -> None:
        self.start = start
        self.clock_offset = clock_offset
        self.fleet = Fleet([(node, job)], gpus=gpus, seed=seed, faults=faults)

    def collect(self, now: float) -> list[Sample]:
        return self.fleet.samples(now - self.start, stamp=now + self.clock_offset)

    def close(self) -> None:
        pass
