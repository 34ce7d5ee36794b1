"""Telemetry of a GPU fleet running training jobs, with injected faults and confounders, as agents report it.

Written apart from the detectors: this module imports nothing from flotilla (numpy only) and knows
nothing of their metric table, reductions or thresholds. It produces what the agents publish: per node
and second, a batch of sample dicts `{"ts", "node", "job", "gpu", "metric", "value", "role", "rank"}`
(docs/health.md, "Metric names"), at the node's own phase within the second.

The fleet: jobs of 2- and 4-stage pipelines (`role` "pp<stage>/<stages>", several data-parallel replicas,
one node per stage replica, 4 GPUs = 4 ranks per node) and plain data-parallel jobs (no role). Roles differ
legitimately: the last stage computes ~12 % longer (and runs hotter, draws more power), the first stage uses
~1.6x the CPU and receives half the network traffic, the last sends half. Every machine has its own offsets
(temperature, power, clocks). Step time: per-rank compute time with per-job noise (1-3 %) and rare spikes;
the synchronous step time is the slowest rank's plus communication.

Faults (ground truth in `Fleet.faults`): XID (hardware codes), uncorrectable ECC, a lost GPU (its measurements
stop but its uncorrectable-ECC counter keeps arriving, served from a cache; no XID; on jobs whose agents read NVML
`gpu_count` drops, on the others the agents read DCGM and count the GPUs with any series, which does not drop), a dead
node (everything stops), NVLink degraded on one GPU, a thermal throttle, an intermittent NIC flap (down 3-5 s of
every 20-40 s), and stragglers 5-30 % slower visible only in their rank's compute time.

Confounders (in every job, faulty or not): warm-up after the job starts, checkpoints (every machine of the job
idles together for 8-15 s), noisy sensors on some machines, a job-wide slowdown from a slow data loader (the
first stage's compute and everyone's utilisation), and application XIDs (13, 31, 43) that are no hardware fault.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import zlib

import numpy as np

GPUS = 4
FAULT_KINDS = ("xid", "ecc", "gpu_lost", "node_down", "nvlink", "thermal", "nic_flap", "straggler")
HARD_KINDS = ("xid", "ecc", "gpu_lost", "node_down")
CONFOUNDERS = ("warmup", "checkpoint", "noisy_sensor", "slow_loader", "app_xid")


def _h(text: str) -> int:
    return zlib.crc32(text.encode())


@dataclass(frozen=True)
class Fault:
    kind: str
    node: str
    start: float
    end: float
    gpu: int = 0
    size: float = 0.0      # straggler: relative slowdown


@dataclass
class Job:
    name: str
    nodes: list[str]
    stages: int              # 0: plain data parallel (no role)
    start: float
    nvml: bool               # agents publish gpu_count
    step: float              # healthy step time, s
    noise: float             # per-rank step-time noise (relative)
    healthy: bool            # no fault is injected on this job
    checkpoints: list[float] = field(default_factory=list)
    loader: tuple[float, float] | None = None

    def stage(self, i: int) -> int:
        return i % self.stages if self.stages else 0

    def role(self, i: int) -> str | None:
        return f"pp{self.stage(i)}/{self.stages}" if self.stages else None


class Fleet:
    def __init__(self, seed: int, nodes: int, seconds: int, faults_per_kind: int, healthy_share: float = 0.35):
        self.rng = rng = np.random.default_rng(seed)
        self.seconds = seconds
        self.jobs: list[Job] = []
        names: list[str] = []
        while len(names) < nodes:
            stages = int(rng.choice([0, 2, 4]))
            dp = int(rng.choice([2, 3, 4])) if stages else int(rng.choice([4, 6, 8]))
            size = min(max(stages, 1) * dp, nodes - len(names))
            if size < 4:
                break
            members = [f"node-{len(names) + i:04d}" for i in range(size)]
            names += members
            j = len(self.jobs)
            job = Job(f"team/job-{j:03d}", members, stages, float(rng.uniform(0, 90)), bool(rng.random() < 0.5),
                      float(rng.uniform(0.8, 1.5)), float(rng.uniform(0.01, 0.03)), rng.random() < healthy_share)
            t = job.start + rng.uniform(200, 500)
            while t < seconds:
                job.checkpoints.append(t)
                t += rng.uniform(300, 600)
            if rng.random() < 0.4:
                s = rng.uniform(150, max(151, seconds - 300))
                job.loader = (s, s + rng.uniform(120, 300))
            self.jobs.append(job)
        self.nodes = names
        self.row = {n: i for i, n in enumerate(names)}
        self.job_of = np.array([j for j, job in enumerate(self.jobs) for _ in job.nodes])
        self.index_in_job = np.array([i for job in self.jobs for i in range(len(job.nodes))])
        n = len(names)
        self.stage = np.array([job.stage(i) for job in self.jobs for i in range(len(job.nodes))])
        self.stages = np.array([job.stages for job in self.jobs for _ in job.nodes])
        self.first = (self.stages > 0) & (self.stage == 0)
        self.last = (self.stages > 0) & (self.stage == self.stages - 1)
        self.phase = rng.uniform(0, 0.95, n)
        self.temp_offset = rng.normal(0, 3, (n, GPUS))
        self.power_offset = rng.normal(1, 0.02, (n, GPUS))
        self.clock_offset = rng.normal(0, 8, (n, GPUS))
        self.rank_offset = rng.normal(1, 0.003, (n, GPUS))
        self.noisy = np.zeros(n, dtype=bool)
        for job in self.jobs:
            if rng.random() < 0.35:
                self.noisy[self.row[rng.choice(job.nodes)]] = True
        self.app_xids = [(float(rng.uniform(60, seconds)), self.nodes[int(rng.integers(n))], int(rng.choice([13, 31, 43])))
                         for _ in range(max(1, n // 16))]
        self.faults = self._schedule(faults_per_kind)
        self._xid_code = {f: int(rng.choice([79, 48, 94, 63, 74])) for f in self.faults if f.kind == "xid"}

    def _schedule(self, per_kind: int) -> list[Fault]:
        """Each fault on its own node of a job with faults; two faults in one role group do not overlap."""
        rng = self.rng
        candidates = [n for job in self.jobs if not job.healthy for n in job.nodes]
        rng.shuffle(candidates)
        busy: dict[tuple[int, int], list[tuple[float, float]]] = {}
        out: list[Fault] = []
        kinds = [k for k in FAULT_KINDS for _ in range(per_kind)]
        rng.shuffle(kinds)
        for kind in kinds:
            for _ in range(50):
                if not candidates:
                    return out
                node = candidates[-1]
                i = self.row[node]
                job = self.jobs[self.job_of[i]]
                start = float(rng.uniform(job.start + 150, max(job.start + 151, self.seconds - 200)))
                end = self.seconds if kind in ("xid", "ecc", "gpu_lost", "nvlink") else start + float(
                    rng.uniform(120, 200) if kind == "node_down" else rng.uniform(150, 300))
                group = (int(self.job_of[i]), int(self.stage[i]))
                if all(end <= s or start >= e for s, e in busy.get(group, [])):
                    candidates.pop()
                    busy.setdefault(group, []).append((start, end + 60))
                    size = float(rng.uniform(0.05, 0.30)) if kind == "straggler" else 0.0
                    out.append(Fault(kind, node, start, min(end, self.seconds), int(rng.integers(GPUS)), size))
                    break
                rng.shuffle(candidates)
        return out

    # -- one second of the fleet ---------------------------------------------

    def second(self, t: int) -> list[tuple[float, list[dict]]]:
        """The batches the agents publish during second t: (arrival time, samples), in arrival order."""
        rng, n = self.rng, len(self.nodes)
        job_start = np.array([self.jobs[j].start for j in self.job_of])
        running = t >= job_start
        age = t - job_start
        warm = np.where(running, 1.0 + 0.5 * np.exp(-np.maximum(age, 0) / 15.0), 1.0)  # warm-up: slow first steps
        ckpt = np.array([any(c <= t < c + 8 + (_h(f'{job.name}{c}') % 8) for c in job.checkpoints)
                         for job in self.jobs])[self.job_of]
        loader = np.array([job.loader is not None and job.loader[0] <= t < job.loader[1]
                           for job in self.jobs])[self.job_of]
        load = np.where(running, np.where(ckpt, 0.05, np.where(loader, 0.8, 1.0) / np.minimum(warm, 1.2)), 0.0)
        g = (n, GPUS)
        util = np.clip(95 * load[:, None] + np.where(self.last, 2.0, 0.0)[:, None] + rng.normal(0, 1.5, g), 0, 100)
        power = (70 + 480 * load[:, None] * np.where(self.last, 1.06, 1.0)[:, None]) * self.power_offset \
            + rng.normal(0, 12, g)
        temp = 40 + 26 * load[:, None] + np.where(self.last, 4.0, 0.0)[:, None] + self.temp_offset + rng.normal(0, 1, g)
        clock = 1980 - 40 * load[:, None] + self.clock_offset + rng.normal(0, 10, g)
        nvl = 40000 * load[:, None] * rng.normal(1, 0.03, g)
        pcie = 12000 * load[:, None] * rng.normal(1, 0.05, g) + 50
        noisy = self.noisy[:, None]
        temp = temp + np.where(noisy, rng.normal(0, 5, g), 0)
        power = power + np.where(noisy, rng.normal(0, 40, g), 0)
        cpu = np.where(running, 30 * np.where(self.first, 1.6, 1.0) * np.where(loader & self.first, 1.3, 1.0), 5) \
            + rng.normal(0, 3, n)
        net = 2500 * np.where(ckpt, 1.5, load) + 20
        net_rx = net * np.where(self.first, 0.5, 1.0) * rng.normal(1, 0.04, n)
        net_tx = net * np.where(self.last, 0.5, 1.0) * rng.normal(1, 0.04, n)
        net_err = rng.poisson(0.05, n).astype(float)
        steps = np.array([self.jobs[j].step for j in self.job_of])[:, None] * self.rank_offset \
            * np.where(self.last, 1.12, 1.0)[:, None] * warm[:, None] \
            * np.where(loader & self.first, 1.25, 1.0)[:, None]
        noise = np.array([self.jobs[j].noise for j in self.job_of])[:, None]
        steps = steps * np.exp(rng.normal(0, 1, g) * noise) * np.where(rng.random(g) < 0.005, 1.3, 1.0)
        step_ok = running[:, None] & ~ckpt[:, None] & np.ones(g, dtype=bool)
        alive = np.ones(n, dtype=bool)
        gpu_alive = np.ones(g, dtype=bool)
        ecc = np.zeros(g)
        xids: list[tuple[int, int, int]] = []
        for f in self.faults:
            i = self.row[f.node]
            # A dead node or a lost GPU sends nothing stamped after its fault began (its batch of second t goes
            # out at t + its phase); the other faults change the values of the seconds from their start on.
            at = t + self.phase[i] if f.kind in ("node_down", "gpu_lost") else t
            if not f.start <= at < f.end:
                continue
            k, a = f.gpu, t - f.start
            if f.kind == "xid" and a < 1:
                xids.append((i, k, self._xid_code[f]))
            elif f.kind == "ecc":
                ecc[i, k] = 1.0
            elif f.kind == "gpu_lost":
                gpu_alive[i, k] = False
            elif f.kind == "node_down":
                alive[i] = False
            elif f.kind == "nvlink":
                nvl[i, k] *= 0.3 + 0.3 * ((_h(f.node) % 100) / 100)
            elif f.kind == "thermal":
                heat = min(a / 30.0, 1.0) * 22.0
                temp[i, k] += heat
                if heat > 15:
                    clock[i, k] *= 0.8
                    power[i, k] *= 0.85
                    steps[i, k] *= 1.1
            elif f.kind == "nic_flap":
                period = 20 + (_h(f.node) % 21)
                if a % period < 3 + (_h(f.node) % 3):
                    net_rx[i] *= 0.05
                    net_tx[i] *= 0.05
                    net_err[i] += 100 + rng.poisson(50)
                    steps[i] *= 1.05
            elif f.kind == "straggler":
                steps[i, k] *= 1.0 + f.size
        for when, node, code in self.app_xids:
            if when <= t < when + 1:
                xids.append((self.row[node], int(rng.integers(GPUS)), code))
        sync = {}
        for j, job in enumerate(self.jobs):
            rows = np.flatnonzero(self.job_of == j)
            ok = step_ok[rows] & gpu_alive[rows] & alive[rows][:, None]
            if ok.any():
                sync[j] = float(steps[rows][ok].max()) * 1.08 + 0.02
        out: list[tuple[float, list[dict]]] = []
        for i in np.argsort(self.phase):
            if not alive[i]:
                continue
            j = self.job_of[i]
            job = self.jobs[j]
            node, ts = self.nodes[i], round(t + float(self.phase[i]), 3)
            name = job.name if running[i] else None
            role = job.role(self.index_in_job[i]) if running[i] else None
            batch = [{"ts": ts, "node": node, "job": name, "gpu": None, "metric": m, "value": float(v)}
                     for m, v in (("heartbeat", 1.0), ("cpu_util", cpu[i]), ("mem_available", 400000.0),
                                  ("net_rx", net_rx[i]), ("net_tx", net_tx[i]), ("net_errors", net_err[i]))]
            batch.append({"ts": ts, "node": node, "job": name, "gpu": None, "metric": "gpu_count",
                          "value": float(gpu_alive[i].sum() if job.nvml else GPUS)})
            for k in range(GPUS):
                if not gpu_alive[i, k]:
                    batch.append({"ts": ts, "node": node, "job": name, "gpu": k, "metric": "ecc_uncorrected",
                                  "value": 0.0, "role": role})
                    continue
                rank = (self.index_in_job[i] * GPUS + k)
                for m, v in (("gpu_util", util[i, k]), ("power", power[i, k]), ("temperature", temp[i, k]),
                             ("sm_clock", clock[i, k]), ("nvlink_tx", nvl[i, k]), ("nvlink_rx", nvl[i, k]),
                             ("pcie_tx", pcie[i, k]), ("mem_used", 60000.0), ("ecc_uncorrected", ecc[i, k])):
                    batch.append({"ts": ts, "node": node, "job": name, "gpu": k, "metric": m, "value": float(v),
                                  "role": role})
                if name is not None and step_ok[i, k]:
                    batch.append({"ts": ts, "node": node, "job": name, "gpu": k, "metric": "step_time",
                                  "value": float(steps[i, k]), "role": role, "rank": int(rank)})
                    if j in sync:
                        batch.append({"ts": ts, "node": node, "job": name, "gpu": k, "metric": "sync_step_time",
                                      "value": sync[j], "role": role, "rank": int(rank)})
            for xi, xk, code in xids:
                if xi == i:
                    batch.append({"ts": ts, "node": node, "job": name, "gpu": xk, "metric": "xid", "value": float(code)})
            out.append((ts, batch))
        return out
