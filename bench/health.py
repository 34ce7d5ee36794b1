"""Fault-detection benchmark on telemetry generated independently of the detectors.

The telemetry comes from `bench/health_gen.py`, which imports nothing from flotilla (heterogeneous
pipeline roles, synchronous step time, subtle stragglers, NIC flaps, lost GPUs, XID/ECC, and confounders:
warm-up, checkpoints, noisy sensors, a slow data loader, application XIDs). The detectors are driven through
their public entry point as `flotilla detect` drives them with its defaults: every agent batch becomes typed
samples (`Sample`; validated by `Sample.from_dict` one second in 60) passed to
`HealthMonitor(MonitorConfig()).observe(batch, now=ts)`.
The baseline, run on the same batches in the same process, is what a user would write first: a per-metric
robust z-score of every series against the same metric's series of its job, with the same hard-signal rules
(hardware XID, ECC count, a drop in the GPU count, heartbeat and GPU-series silence), its z threshold and persistence tuned on the
same tuning seeds.

Seeds: the detectors' defaults were developed against TUNING_SEEDS only (each change checked with
`--on-tuning-seeds`; `--tune` is a grid over three of their knobs), the baseline's z and persistence chosen by
`--tune-naive` on the same seeds; results are reported on HELD_OUT_SEEDS, never used for tuning.

A confirmed decision is a true positive when its node has an injected fault active then (or ended at most
60 s before); otherwise a false positive. Latency runs from the fault's start to its first decision.

Every run drives two monitors on the same batches: one given the roles the generator stamps, one with every
role withheld (pipeline jobs that declare nothing: the detectors infer the peer groups); both are scored.

    python bench/health.py --quick      # 3 held-out seeds x 64 machines x 10 simulated minutes
    python bench/health.py              # 6 held-out seeds x 128 machines x 30 simulated minutes
    python bench/health.py --curve      # straggler detection time vs slowdown
    python bench/health.py --healthy    # FP per 1,000 node-hours on a fleet without faults (3 x 96 x 1 h)
    python bench/health.py --tune       # a grid of the detectors' knobs on the tuning seeds
    python bench/health.py --tune-naive # the baseline's grid on the tuning seeds

The last line printed is the JSON summary of the contract.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import multiprocessing
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from health_gen import CONFOUNDERS, FAULT_KINDS, HARD_KINDS, Fleet  # noqa: E402

from flotilla.health.monitor import HealthMonitor, MonitorConfig  # noqa: E402
from flotilla.health.samples import Sample  # noqa: E402

TUNING_SEEDS = (101, 102, 103)
HELD_OUT_SEEDS = (301, 302, 303, 304, 305, 306)
GRACE_S = 60.0
NAIVE = {"z": 6.0, "persist": 5}   # the best F1 of --tune-naive on TUNING_SEEDS (48 machines x 600 s)
HARDWARE_XIDS = {48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 123, 140}   # NVIDIA's list, as a user copies it
BAD_LOW = {"gpu_util", "power", "sm_clock", "nvlink_tx", "nvlink_rx", "pcie_tx", "net_rx", "net_tx"}
BAD_HIGH = {"temperature", "cpu_util", "net_errors", "step_time"}


class NaiveZScore:
    """Per metric, every series (node, gpu) against the same metric's series of its job, each second:
    |x - median| / (1.4826 MAD) above `z` in the bad direction for `persist` seconds flags the node."""

    def __init__(self, z: float, persist: int) -> None:
        self.z, self.persist = z, persist
        self.latest: dict[tuple[str, str, int | None], tuple[str, float]] = {}
        self.streak: dict[str, int] = {}
        self.flagged: set[tuple[str, str]] = set()
        self.seen: dict[str, float] = {}
        self.gpu_seen: dict[tuple[str, int], float] = {}
        self.heard_since: dict[str, float] = {}
        self.gpu_count: dict[str, float] = {}
        self.last = -1.0

    def observe(self, batch: list[dict], now: float) -> list[tuple[float, str, str]]:
        out = []
        node = batch[0]["node"] if batch else None
        if node is not None:
            if now - self.seen.get(node, -1e9) > 2.5:
                self.heard_since[node] = now
            self.seen[node] = now
        for s in batch:
            if s["metric"] == "xid" and int(s["value"]) in HARDWARE_XIDS:
                out += self._flag(now, s["node"], "xid")
            elif s["metric"] == "ecc_uncorrected" and s["value"] > 0:
                out += self._flag(now, s["node"], "ecc")
            elif s["metric"] == "gpu_count":
                expected = self.gpu_count.setdefault(s["node"], s["value"])
                if s["value"] < expected:
                    out += self._flag(now, s["node"], "gpu-lost")
            elif s["metric"] in BAD_LOW | BAD_HIGH and s["job"] is not None:
                self.latest[(s["metric"], s["node"], s["gpu"])] = (s["job"], s["value"])
            if s["gpu"] is not None and s["metric"] not in ("xid", "step_time", "sync_step_time"):
                self.gpu_seen[(s["node"], s["gpu"])] = now
        if now - self.last >= 1.0:
            self.last = now
            out += self._evaluate(now)
        return out

    def _flag(self, now: float, node: str, kind: str) -> list[tuple[float, str, str]]:
        if (node, kind) in self.flagged:
            return []
        self.flagged.add((node, kind))
        return [(now, node, kind)]

    def _evaluate(self, now: float) -> list[tuple[float, str, str]]:
        out = []
        for node, seen in self.seen.items():
            if 2.5 < now - seen < 30:
                out += self._flag(now, node, "heartbeat")
        for (node, gpu), seen in self.gpu_seen.items():
            heard = self.seen[node]
            if now - heard < 1.5 and heard - max(seen, self.heard_since[node]) >= 2.5:
                out += self._flag(now, node, "gpu-lost")
        groups: dict[tuple[str, str], list[tuple[str, float]]] = {}
        for (metric, node, _gpu), (job, value) in self.latest.items():
            groups.setdefault((job, metric), []).append((node, value))
        bad: set[str] = set()
        for (_job, metric), rows in groups.items():
            if len(rows) < 3:
                continue
            v = np.array([r[1] for r in rows])
            med = np.median(v)
            scale = 1.4826 * np.median(np.abs(v - med)) + 1e-9
            z = (v - med) / scale * (1 if metric in BAD_HIGH else -1)
            bad |= {rows[i][0] for i in np.flatnonzero(z > self.z)}
        self.latest.clear()
        for node in set(self.streak) | bad:
            self.streak[node] = self.streak.get(node, 0) + 1 if node in bad else 0
            if self.streak[node] >= self.persist:
                out += self._flag(now, node, "outlier")
        return out


def family(reason: str) -> str:
    """Which fault kind a decision reason claims (for per-kind precision)."""
    if reason.startswith("xid"):
        return "xid"
    if reason.startswith("ecc"):
        return "ecc"
    if reason == "gpu-lost":
        return "gpu_lost"
    if reason in ("heartbeat-lost", "heartbeat"):
        return "node_down"
    if reason in ("slow-rank",):
        return "straggler"
    metric = reason.split(":", 1)[-1].split("/")[0]
    if metric.startswith("nvlink"):
        return "nvlink"
    if metric in ("temperature", "throttle_thermal", "sm_clock", "power"):
        return "thermal"
    if metric.startswith("net"):
        return "nic_flap"
    return "other"


def typed(batch: list[dict], validate: bool = False) -> list[Sample]:
    """The generator's sample dicts as the detectors' typed samples. `Sample.from_dict` checks every field, as
    the controller's ingest and `flotilla detect` must for input they do not trust; here it checks one second
    in 60 (and tests/health/test_bench_generator.py the format), and the rest go through `Sample`'s own
    constructor: the same samples, 1.6 us instead of 2.4 us each."""
    if validate:
        return [Sample.from_dict(d) for d in batch]
    return [Sample(**d) for d in batch]


def _reason(d) -> str:
    return d.reason if d.kind != "fault" or not d.reason.startswith("outlier") else f"{d.reason}/{d.evidence.get('basis')}"


def run_seed(seed: int, nodes: int, seconds: int, per_kind: int, config: MonitorConfig,
             naive: dict | None, healthy_share: float = 0.35, no_roles: bool = True) -> dict:
    """Ours with the roles the generator stamps, ours on the same batches with every role withheld (pipeline
    jobs that declare nothing), and the baseline (which uses no roles)."""
    fleet = Fleet(seed, nodes, seconds, per_kind, healthy_share=healthy_share)
    monitor = HealthMonitor(config)
    blind = HealthMonitor(config) if no_roles else None
    baseline = NaiveZScore(**naive) if naive else None
    ours: list[tuple[float, str, str]] = []
    ours_no_roles: list[tuple[float, str, str]] = []
    theirs: list[tuple[float, str, str]] = []
    straggler_decisions: dict[str, list[tuple[float, str, str]]] = {"ours": [], "ours_no_roles": []}
    cpu = 0.0
    for t in range(seconds):
        batches = fleet.second(t)
        c0 = time.process_time()
        for ts, batch in batches:
            for d in monitor.observe(typed(batch, t % 60 == 0), ts):
                if d.state == "confirmed":
                    ours.append((d.ts, d.node, _reason(d)))
                if d.reason == "slow-rank":
                    straggler_decisions["ours"].append((d.ts, d.node, d.state))
        cpu += time.process_time() - c0
        if blind is not None:
            for ts, batch in batches:
                for d in blind.observe([Sample(**{**s, "role": None}) for s in batch], ts):
                    if d.state == "confirmed":
                        ours_no_roles.append((d.ts, d.node, _reason(d)))
                    if d.reason == "slow-rank":
                        straggler_decisions["ours_no_roles"].append((d.ts, d.node, d.state))
        if baseline is not None:
            for ts, batch in batches:
                theirs += baseline.observe(batch, ts)
    return {"fleet": fleet, "ours": ours, "ours_no_roles": ours_no_roles, "naive": theirs, "cpu_s": cpu,
            "straggler_decisions": straggler_decisions}


def score(runs: list[dict], which: str) -> dict:
    tp_by_family: dict[str, list[int]] = {}
    fp = 0
    fp_healthy_pipeline = 0
    healthy_pipeline_node_s = 0.0
    pipeline_tp = pipeline_all = 0
    node_s = 0.0
    detected: dict[str, list[float]] = {k: [] for k in FAULT_KINDS}
    injected: dict[str, int] = dict.fromkeys(FAULT_KINDS, 0)
    straggler_lat: list[tuple[float, float | None]] = []
    confounder_fp: dict[str, int] = dict.fromkeys(CONFOUNDERS + ("none",), 0)
    fp_reasons: dict[str, int] = {}
    for r in runs:
        fleet: Fleet = r["fleet"]
        node_s += len(fleet.nodes) * fleet.seconds
        by_node: dict[str, list] = {}
        for f in fleet.faults:
            by_node.setdefault(f.node, []).append(f)
            injected[f.kind] += 1
        first: dict = {}
        for ts, node, reason in r[which]:
            job = fleet.jobs[fleet.job_of[fleet.row[node]]]
            match = next((f for f in by_node.get(node, ()) if f.start <= ts <= f.end + GRACE_S), None)
            fam = tp_by_family.setdefault(family(reason), [0, 0])
            fam[1] += 1
            if job.stages:
                pipeline_all += 1
            if match is None:
                fp += 1
                if job.stages and job.healthy:
                    fp_healthy_pipeline += 1
                confounder_fp[_confounder(fleet, job, node, ts)] += 1
                fp_reasons[reason] = fp_reasons.get(reason, 0) + 1
            else:
                fam[0] += 1
                pipeline_tp += bool(job.stages)
                first.setdefault(match, ts)
        for job in fleet.jobs:
            if job.stages and job.healthy:
                healthy_pipeline_node_s += len(job.nodes) * (fleet.seconds - job.start)
        for f in fleet.faults:
            if f in first:
                detected[f.kind].append(first[f] - f.start)
            if f.kind == "straggler":
                straggler_lat.append((f.size, first[f] - f.start if f in first else None))
    flaps: list[int] = []   # decisions (confirmed and cleared) on each straggler's node while it lasts (+ grace)
    for r in runs:
        for f in (f for f in r["fleet"].faults if f.kind == "straggler"):
            flaps.append(sum(1 for ts, node, _ in r.get("straggler_decisions", {}).get(which, ())
                             if node == f.node and f.start <= ts <= f.end + GRACE_S))
    decisions = sum(v[1] for v in tp_by_family.values())
    tp = decisions - fp
    precision = tp / decisions if decisions else 1.0
    total = sum(injected.values())
    recall = sum(len(v) for v in detected.values()) / total if total else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    all_lat = [x for v in detected.values() for x in v]
    hard_lat = [x for k in HARD_KINDS for x in detected[k]]
    ten = [lat for size, lat in straggler_lat if 0.08 <= size <= 0.12 and lat is not None]
    per_kind = {k: {"injected": injected[k], "detected": len(detected[k]),
                    "recall": round(len(detected[k]) / injected[k], 3) if injected[k] else None,
                    "precision": round(tp_by_family[k][0] / tp_by_family[k][1], 3) if k in tp_by_family else None,
                    "decisions": tp_by_family.get(k, [0, 0])[1],
                    "median_latency_s": _median(detected[k])} for k in FAULT_KINDS}
    return {
        "precision": round(precision, 4), "recall": round(recall, 4), "f1": round(f1, 4),
        "median_latency_samples": None if not all_lat else round(float(np.median(np.floor(all_lat) + 1)), 2),
        "p95_latency_samples": None if not all_lat else round(float(np.percentile(np.floor(all_lat) + 1, 95)), 2),
        "fp_per_1000_node_hours": round(fp / (node_s / 3600) * 1000, 3),
        "median_latency_s": _median(all_lat), "hard_median_latency_s": _median(hard_lat),
        "straggler_10pct_median_latency_s": _median(ten),
        "precision_pipeline": round(pipeline_tp / pipeline_all, 4) if pipeline_all else 1.0,
        "recall_stragglers": per_kind["straggler"]["recall"],
        "fp_per_1000_node_hours_healthy_pipeline": round(fp_healthy_pipeline / (healthy_pipeline_node_s / 3600) * 1000, 3)
        if healthy_pipeline_node_s else None,
        "healthy_pipeline_node_hours": round(healthy_pipeline_node_s / 3600, 1),
        "false_positives_healthy_pipeline": fp_healthy_pipeline,
        "flaps_per_straggler": round(float(np.mean(flaps)), 3) if flaps else None,
        "max_decisions_per_straggler": max(flaps) if flaps else None,
        "hard_max_latency_s": round(max(hard_lat), 2) if hard_lat else None,
        "decisions": decisions, "false_positives": fp, "per_kind": per_kind, "fp_by_confounder": confounder_fp,
        "fp_by_reason": fp_reasons,
        "stragglers": sorted(((round(s, 3), None if lat is None else round(lat, 1)) for s, lat in straggler_lat),
                             key=lambda x: (x[0], x[1] is None, x[1] or 0.0)),
    }


def _median(values: list[float]) -> float | None:
    return round(float(np.median(values)), 2) if values else None


def _confounder(fleet: Fleet, job, node: str, ts: float) -> str:
    """The confounder a false positive falls in (for the per-confounder figures)."""
    if ts - job.start < 90:
        return "warmup"
    if any(c - 5 <= ts <= c + 60 for c in job.checkpoints):
        return "checkpoint"
    if job.loader is not None and job.loader[0] - 5 <= ts <= job.loader[1] + 60:
        return "slow_loader"
    if fleet.noisy[fleet.row[node]]:
        return "noisy_sensor"
    if any(n == node and w <= ts <= w + 60 for w, n, _ in fleet.app_xids):
        return "app_xid"
    return "none"


JOBS = 1   # seeds run in parallel processes (--jobs)


def evaluate(seeds, nodes, seconds, per_kind, config, naive, healthy_share=0.35,
             no_roles: bool = True) -> tuple[dict, dict, dict, float]:
    """-> (ours with roles, ours with roles withheld, the baseline, detector CPU s)."""
    args = [(s, nodes, seconds, per_kind, config, naive, healthy_share, no_roles) for s in seeds]
    if JOBS > 1:
        with multiprocessing.get_context("fork").Pool(min(JOBS, len(seeds))) as pool:
            runs = pool.starmap(run_seed, args)
    else:
        runs = [run_seed(*a) for a in args]
    return (score(runs, "ours"), score(runs, "ours_no_roles") if no_roles else {},
            score(runs, "naive") if naive else {}, sum(r["cpu_s"] for r in runs))


def tune_naive(nodes: int, seconds: int, per_kind: int) -> None:
    """The baseline's grid on the tuning seeds, every variant on the same batches (one generation per seed)."""
    grid = list(itertools.product((3.0, 4.0, 5.0, 6.0), (5, 10)))
    runs: dict[tuple, list[dict]] = {g: [] for g in grid}
    for seed in TUNING_SEEDS:
        fleet = Fleet(seed, nodes, seconds, per_kind)
        variants = {g: NaiveZScore(*g) for g in grid}
        found: dict[tuple, list] = {g: [] for g in grid}
        for t in range(seconds):
            for ts, batch in fleet.second(t):
                for g, v in variants.items():
                    found[g] += v.observe(batch, ts)
        for g in grid:
            runs[g].append({"fleet": fleet, "naive": found[g]})
    for g in grid:
        r = score(runs[g], "naive")
        print(f"naive z={g[0]} persist={g[1]}: P {r['precision']} R {r['recall']} F1 {r['f1']}", flush=True)


def tune(nodes: int, seconds: int, per_kind: int) -> None:
    """The grids, on the tuning seeds only."""
    for thr, cont, sth in itertools.product((3.0, 4.0), (5, 8), (8.0, 12.0, 16.0)):
        cfg = replace(MonitorConfig(), threshold=thr, continuity=cont, straggler_threshold=sth)
        ours, blind, _, _ = evaluate(TUNING_SEEDS, nodes, seconds, per_kind, cfg, None)
        print(f"ours threshold={thr} continuity={cont} straggler_threshold={sth}: P {ours['precision']} "
              f"R {ours['recall']} F1 {ours['f1']} 10% straggler {ours['straggler_10pct_median_latency_s']} s; "
              f"roles withheld: P {blind['precision']} R {blind['recall']}", flush=True)
    for z, persist in itertools.product((3.0, 4.0, 5.0, 6.0), (3, 5, 10)):
        _, _, theirs, _ = evaluate(TUNING_SEEDS, nodes, seconds, per_kind, MonitorConfig(), {"z": z, "persist": persist},
                                   no_roles=False)
        print(f"naive z={z} persist={persist}: P {theirs['precision']} R {theirs['recall']} F1 {theirs['f1']}",
              flush=True)


def curve(seeds=HELD_OUT_SEEDS[:3], start: int = 150, horizon: int = 450) -> None:
    """Straggler detection time vs slowdown: a 16-machine job of the generator, one rank slowed from `start`."""
    import health_gen
    print(f"{'slowdown':>9}{'found':>8}{'median s':>10}{'max s':>8}  (per-rank noise 1-3 % per step, ~1 step/s; "
          f"held-out seeds {list(seeds)}, {horizon - start} s to find it)")
    for size in (0.03, 0.05, 0.075, 0.10, 0.15, 0.20, 0.30):
        lat = []
        for seed in seeds:
            fleet = Fleet(seed, 16, horizon, 0)
            node = fleet.jobs[0].nodes[min(5, len(fleet.jobs[0].nodes) - 1)]
            fleet.faults = [health_gen.Fault("straggler", node, float(start), float(horizon), 1, size)]
            monitor = HealthMonitor()
            hit = None
            for t in range(horizon):
                for ts, batch in fleet.second(t):
                    for d in monitor.observe(typed(batch), ts):
                        if d.node == node and d.reason == "slow-rank" and d.ts >= start and hit is None:
                            hit = d.ts - start
                if hit is not None:
                    lat.append(hit)
                    break
        print(f"{size:>9.3f}{len(lat):>4}/{len(seeds):<3}{_median(lat)!s:>10}{round(max(lat), 1) if lat else None!s:>8}",
              flush=True)


def poisson_upper(k: int, confidence: float = 0.95) -> float:
    """The one-sided upper confidence bound of a Poisson mean after observing k events."""
    def cdf(mu: float) -> float:
        term = total = math.exp(-mu)
        for i in range(1, k + 1):
            term *= mu / i
            total += term
        return total
    lo, hi = 0.0, 10.0 + 10 * k
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) > 1 - confidence else (lo, mid)
    return hi


def healthy(seeds, nodes: int, seconds: int) -> None:
    """False positives per 1,000 node-hours on a fleet with no fault at all (every job healthy), with the
    confounders of every job (warm-up, checkpoints, noisy sensors, slow data loaders, application XIDs)."""
    wall0 = time.perf_counter()
    ours, blind, naive, cpu = evaluate(seeds, nodes, seconds, 0, MonitorConfig(), NAIVE, healthy_share=1.0)
    hours = ours["healthy_pipeline_node_hours"]
    fp_pipeline = ours["false_positives_healthy_pipeline"]
    all_hours = len(seeds) * nodes * seconds / 3600
    print(f"healthy fleet, held-out seeds {list(seeds)}: {nodes} machines x {seconds} s each = {all_hours:.0f} "
          f"node-h, of which {hours} node-h on pipeline jobs (2 and 4 stages); no fault injected")
    for name, r in (("flotilla", ours), ("flotilla, roles withheld", blind), ("naive z-score", naive)):
        print(f"{name}: {r['false_positives']} false positives ({r['fp_per_1000_node_hours']} per 1,000 node-h); "
              f"on pipeline jobs {r['fp_per_1000_node_hours_healthy_pipeline']} per 1,000 node-h; by confounder "
              f"{r['fp_by_confounder']}; by reason {r['fp_by_reason']}")
    upper = poisson_upper(fp_pipeline) / hours * 1000 if hours else None
    print(f"flotilla on pipeline jobs: {fp_pipeline} in {hours} node-h, 95 % upper bound "
          f"{upper and round(upper, 2)} per 1,000 node-h; detector CPU {cpu:.0f} s; wall "
          f"{time.perf_counter() - wall0:.0f} s")
    print(json.dumps({"fp_per_1000_node_hours": ours["fp_per_1000_node_hours_healthy_pipeline"],
                      "fp_per_1000_node_hours_upper95": upper and round(upper, 3),
                      "false_positives_pipeline": fp_pipeline, "healthy_pipeline_node_hours": hours,
                      "fp_per_1000_node_hours_all_jobs": ours["fp_per_1000_node_hours"],
                      "naive_fp_per_1000_node_hours": naive["fp_per_1000_node_hours_healthy_pipeline"],
                      "fp_per_1000_node_hours_no_roles": blind["fp_per_1000_node_hours_healthy_pipeline"],
                      "held_out_seeds": list(seeds)}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 held-out seeds x 64 machines x 10 minutes")
    parser.add_argument("--tune", action="store_true", help="the tuning grid, on the tuning seeds")
    parser.add_argument("--tune-naive", action="store_true", help="the baseline's grid, on the tuning seeds")
    parser.add_argument("--curve", action="store_true", help="straggler detection time vs slowdown")
    parser.add_argument("--healthy", action="store_true",
                        help="false positives per 1,000 node-hours on a fleet without faults (long, held-out seeds)")
    parser.add_argument("--on-tuning-seeds", action="store_true", help="report on the tuning seeds (development)")
    parser.add_argument("--jobs", type=int, default=1, help="run the seeds in this many processes")
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--seconds", type=int)
    parser.add_argument("--per-type", type=int, help="faults injected per fault kind and seed")
    args = parser.parse_args()
    global JOBS
    JOBS = args.jobs
    nodes = args.nodes or (64 if args.quick or args.tune else 128)
    seconds = args.seconds or (600 if args.quick or args.tune else 1800)
    per_kind = args.per_type or (3 if args.quick or args.tune else 6)
    if args.tune:
        tune(nodes, seconds, per_kind)
        return 0
    if args.tune_naive:
        tune_naive(nodes, seconds, per_kind)
        return 0
    if args.curve:
        curve()
        return 0
    if args.healthy:
        healthy(TUNING_SEEDS if args.on_tuning_seeds else HELD_OUT_SEEDS[:3], args.nodes or 96, args.seconds or 3600)
        return 0
    seeds = HELD_OUT_SEEDS[:3] if args.quick else HELD_OUT_SEEDS
    if args.on_tuning_seeds:
        seeds = TUNING_SEEDS
    wall0 = time.perf_counter()
    ours, blind, naive, cpu = evaluate(seeds, nodes, seconds, per_kind, MonitorConfig(), NAIVE)
    print(f"{'TUNING' if args.on_tuning_seeds else 'held-out'} seeds {list(seeds)} (tuned on {list(TUNING_SEEDS)}); {nodes} machines x {seconds} s each; "
          f"naive baseline {NAIVE}")
    print(f"{'fault kind':<12}{'inj':>5}  roles given: {'det':>4}{'recall':>7}{'prec':>7}{'dec':>5}{'med s':>7}"
          f"  withheld: {'det':>4}{'recall':>7}{'prec':>7}{'dec':>5}{'med s':>7}   naive: {'recall':>7}{'prec':>7}")
    for kind in FAULT_KINDS:
        a, c, b = ours["per_kind"][kind], blind["per_kind"][kind], naive["per_kind"][kind]
        print(f"{kind:<12}{a['injected']:>5}  {'':>12} {a['detected']:>4}{a['recall']!s:>7}{a['precision']!s:>7}"
              f"{a['decisions']:>5}{a['median_latency_s']!s:>7}  {'':>9} {c['detected']:>4}{c['recall']!s:>7}"
              f"{c['precision']!s:>7}{c['decisions']:>5}{c['median_latency_s']!s:>7}   {'':>6}{b['recall']!s:>7}"
              f"{b['precision']!s:>7}")
    print("false positives by confounder (roles given / withheld / naive):",
          ", ".join(f"{k} {ours['fp_by_confounder'][k]}/{blind['fp_by_confounder'][k]}/{naive['fp_by_confounder'][k]}"
                    for k in ours["fp_by_confounder"]))
    print("false positives by reason (roles given):", ours["fp_by_reason"])
    print("false positives by reason (roles withheld):", blind["fp_by_reason"])
    print("stragglers (slowdown, detection s), roles given:", ours["stragglers"])
    print("stragglers (slowdown, detection s), roles withheld:", blind["stragglers"])
    print(f"straggler decisions per fault (confirmed + cleared, while it lasts + {GRACE_S:g} s): roles given mean "
          f"{ours['flaps_per_straggler']} max {ours['max_decisions_per_straggler']}; withheld mean "
          f"{blind['flaps_per_straggler']} max {blind['max_decisions_per_straggler']}; hard faults' slowest "
          f"detection {ours['hard_max_latency_s']} s (withheld {blind['hard_max_latency_s']} s)")
    for name, r in (("flotilla", ours), ("flotilla, roles withheld", blind), ("naive z-score", naive)):
        print(f"{name}: precision {r['precision']} recall {r['recall']} f1 {r['f1']} (pipeline precision "
              f"{r['precision_pipeline']}) FP/1000 node-h {r['fp_per_1000_node_hours']}, on healthy pipeline jobs "
              f"{r['fp_per_1000_node_hours_healthy_pipeline']} over {r['healthy_pipeline_node_hours']} node-h; "
              f"median latency {r['median_latency_s']} s, hard faults {r['hard_median_latency_s']} s, "
              f"10% stragglers {r['straggler_10pct_median_latency_s']} s")
    f1_vs_naive = round(ours["f1"] / naive["f1"], 3) if naive["f1"] else None
    print(f"F1 vs naive: {f1_vs_naive}x; detector CPU (parse + observe) {cpu / len(seeds):.1f} s per seed run; "
          f"wall {time.perf_counter() - wall0:.0f} s")
    line = {k: ours[k] for k in ("precision", "recall", "f1", "median_latency_samples", "p95_latency_samples",
                                  "fp_per_1000_node_hours", "precision_pipeline", "recall_stragglers")}
    line["fp_per_1000_node_hours_healthy_pipeline"] = ours["fp_per_1000_node_hours_healthy_pipeline"]
    line["f1_vs_naive"] = f1_vs_naive
    line["precision_no_roles"] = blind["precision"]
    line["recall_no_roles"] = blind["recall"]
    line["flaps_per_straggler"] = ours["flaps_per_straggler"]
    line["flaps_per_straggler_no_roles"] = blind["flaps_per_straggler"]
    line["max_decisions_per_straggler"] = max(ours["max_decisions_per_straggler"] or 0,
                                              blind["max_decisions_per_straggler"] or 0)
    line["hard_max_latency_s"] = ours["hard_max_latency_s"]
    line["hard_max_latency_s_no_roles"] = blind["hard_max_latency_s"]
    line["held_out_seeds"] = list(seeds)
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
