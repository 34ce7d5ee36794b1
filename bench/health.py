"""Fault-injection benchmark for the health detectors.

N simulated machines in training jobs of 8-128 machines sample at 1 Hz; every
fault type of `flotilla.agent.simulated.FAULTS` is injected on seeded random
machines, and every job shifts load now and then (all its machines within two
seconds), which must not be flagged. The monitor sees each second exactly what
it would build from the agents' samples (`Fleet.tick`), so the detectors' own
CPU time can be measured apart from the simulation; the per-sample ingest path
is measured on a short slice.

A confirmed decision is a true positive when its node has an injected fault
active at that time (or ended at most 60 s before); otherwise it is a false
positive. Latency is counted from the fault's start to its first decision, in
seconds and in samples (the confirming sample included: a fault caught on the
first sample that shows it has latency 1). The baseline is the same monitor
without the sliding window and continuity (window 1, continuity 1), run on the
same frames in the same process.

    python bench/health.py --quick      # 384 machines, 20 simulated minutes
    python bench/health.py              # 2,048 machines, a simulated day

The last line printed is the JSON summary of the contract.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout

from flotilla.agent.simulated import FAULTS, HARD_FAULTS, Fault, Fleet, random_schedule
from flotilla.health.decision import HealthDecision
from flotilla.health.monitor import HealthMonitor, MonitorConfig

GRACE_S = 60.0
JOB_SIZES = (8, 16, 32, 64, 128)


def make_fleet_members(n: int, seed: int) -> list[tuple[str, str]]:
    rng = np.random.default_rng(seed)
    members, job = [], 0
    while len(members) < n:
        size = min(int(rng.choice(JOB_SIZES)), n - len(members))
        if size < 8 and members:   # fold a remainder into the previous job
            last_job = members[-1][1]
            members += [(f"node-{len(members) + i:05d}", last_job) for i in range(size)]
            break
        members += [(f"node-{len(members) + i:05d}", f"job-{job:04d}") for i in range(size)]
        job += 1
    return members


def score(decisions: list[HealthDecision], faults: list[Fault], node_hours: float) -> dict:
    by_node: dict[str, list[Fault]] = {}
    for f in faults:
        by_node.setdefault(f.node, []).append(f)
    first: dict[Fault, float] = {}
    fp = 0
    for d in decisions:
        match = next((f for f in by_node.get(d.node, ()) if f.start <= d.ts <= (f.end or np.inf) + GRACE_S), None)
        if match is None:
            fp += 1
        else:
            first.setdefault(match, d.ts)
    tp = len(decisions) - fp
    precision = tp / len(decisions) if decisions else 1.0
    recall = len(first) / len(faults) if faults else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    latency_s = [first[f] - f.start for f in faults if f in first]

    def summary(values: list[float], samples: bool) -> tuple[float | None, float | None]:
        if not values:
            return None, None
        arr = np.array(values) + (1.0 if samples else 0.0)
        return round(float(np.median(arr)), 2), round(float(np.percentile(arr, 95)), 2)

    per_type = {}
    for kind in FAULTS:
        of_kind = [f for f in faults if f.fault == kind]
        lat = [first[f] - f.start for f in of_kind if f in first]
        med_s, p95_s = summary(lat, False)
        med_n, p95_n = summary(lat, True)
        per_type[kind] = {"injected": len(of_kind), "detected": len(lat), "recall": round(len(lat) / len(of_kind), 3)
                          if of_kind else None, "median_latency_s": med_s, "p95_latency_s": p95_s,
                          "median_latency_samples": med_n, "p95_latency_samples": p95_n}
    hard = [first[f] - f.start for f in faults if f in first and f.fault in HARD_FAULTS]
    med_n, p95_n = summary(latency_s, True)
    med_s, p95_s = summary(latency_s, False)
    return {
        "precision": round(precision, 4), "recall": round(recall, 4), "f1": round(f1, 4),
        "median_latency_samples": med_n, "p95_latency_samples": p95_n,
        "fp_per_1000_node_hours": round(fp / node_hours * 1000, 4),
        "median_latency_s": med_s, "p95_latency_s": p95_s,
        "hard_median_latency_samples": summary(hard, True)[0],
        "decisions": len(decisions), "false_positives": fp, "per_type": per_type,
    }


def run(nodes: int, seconds: int, per_type: int, seed: int, gpus: int) -> dict:
    members = make_fleet_members(nodes, seed)
    faults = random_schedule([m[0] for m in members], seconds, per_type, seed, gpus)
    fleet = Fleet(members, gpus=gpus, seed=seed, faults=faults)
    monitors = {"flotilla": HealthMonitor(), "baseline": HealthMonitor(replace(MonitorConfig(), window=1, continuity=1))}
    decisions: dict[str, list[HealthDecision]] = {k: [] for k in monitors}
    cpu = dict.fromkeys(monitors, 0.0)
    wall0 = time.perf_counter()
    for t in range(seconds):
        frames, hard = fleet.tick(float(t))
        for name, monitor in monitors.items():
            c0 = time.process_time()
            out = monitor.observe_frames(frames, hard, float(t))
            cpu[name] += time.process_time() - c0
            decisions[name] += [d for d in out if d.state == "confirmed"]
    node_hours = nodes * seconds / 3600
    results = {name: score(decisions[name], faults, node_hours) for name in monitors}
    for name in monitors:
        results[name]["detector_cpu_ms_per_1000_nodes_s"] = round(cpu[name] / seconds / nodes * 1000 * 1000, 3)
    results["sample_path_cpu_ms_per_1000_nodes_s"] = sample_path_cost(gpus, seed)
    results["setup"] = {"nodes": nodes, "jobs": len({m[1] for m in members}), "gpus_per_node": gpus,
                        "seconds": seconds, "faults": len(faults), "wall_s": round(time.perf_counter() - wall0, 1)}
    return results


def sample_path_cost(gpus: int, seed: int, nodes: int = 128, seconds: int = 10) -> float:
    """CPU per 1,000 machines per second of `HealthMonitor.observe` fed every per-GPU sample an agent publishes."""
    fleet = Fleet(make_fleet_members(nodes, seed), gpus=gpus, seed=seed)
    monitor = HealthMonitor()
    batches = [fleet.samples(float(t)) for t in range(seconds)]
    c0 = time.process_time()
    for t, batch in enumerate(batches):
        monitor.observe(batch, float(t))
    return round((time.process_time() - c0) / seconds / nodes * 1000 * 1000, 3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="384 machines, 20 simulated minutes (< 60 s)")
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--seconds", type=int)
    parser.add_argument("--per-type", type=int, help="faults injected per fault type")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    nodes = args.nodes or (384 if args.quick else 2048)
    seconds = args.seconds or (1200 if args.quick else 86400)
    per_type = args.per_type or (4 if args.quick else 20)
    if nodes < 8 or per_type * len(FAULTS) > nodes:
        parser.error("--nodes must be at least 8 and at least --per-type times the number of fault types")
    results = run(nodes, seconds, per_type, args.seed, args.gpus)
    ours, base = results["flotilla"], results["baseline"]
    print(json.dumps(results, indent=1), file=sys.stderr)
    print(f"{'fault type':<18}{'inj':>5}{'det':>5}{'recall':>8}{'med s':>8}{'p95 s':>8}{'med n':>8}{'p95 n':>8}")
    for kind, row in ours["per_type"].items():
        print(f"{kind:<18}{row['injected']:>5}{row['detected']:>5}{row['recall']!s:>8}{row['median_latency_s']!s:>8}"
              f"{row['p95_latency_s']!s:>8}{row['median_latency_samples']!s:>8}{row['p95_latency_samples']!s:>8}")
    for name, r in (("flotilla", ours), ("baseline (no window)", base)):
        print(f"{name}: precision {r['precision']} recall {r['recall']} f1 {r['f1']} "
              f"FP/1000 node-h {r['fp_per_1000_node_hours']} median latency {r['median_latency_s']} s "
              f"(hard faults {r['hard_median_latency_samples']} samples) detector CPU "
              f"{r['detector_cpu_ms_per_1000_nodes_s']} ms per 1000 nodes per s")
    fp_ratio = (f"{base['false_positives'] / ours['false_positives']:.1f}x" if ours["false_positives"]
                else f"{base['false_positives']} vs 0")
    print(f"false positives, baseline vs flotilla: {fp_ratio}; "
          f"sample path (observe, per-GPU samples): {results['sample_path_cpu_ms_per_1000_nodes_s']} ms per 1000 nodes per s; "
          f"setup {results['setup']}")
    print(json.dumps({k: ours[k] for k in ("precision", "recall", "f1", "median_latency_samples",
                                            "p95_latency_samples", "fp_per_1000_node_hours")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
