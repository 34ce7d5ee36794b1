"""Benchmark: deadline satisfactory ratio of every training policy on seeded traces, and re-plan time.

  python bench/training.py [--quick]

Prints one line per trace and policy, then, as its last line, one JSON object:
{"deadline_ratio": {"<policy>": ratio, ...}, "vs_best_baseline": x, "replan_ms_10k_gpus": t}
where a policy's ratio is deadlines met / jobs submitted over all traces together,
vs_best_baseline is elastic-deadline's ratio over the best baseline's, and
replan_ms_10k_gpus is the median CPU time of one re-plan (a job arrives) with
1,000 active jobs on 10,000 GPUs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from flotilla.allocation import policies  # noqa: E402
from flotilla.allocation.snapshot import ClusterSnapshot, Verdict  # noqa: E402
from flotilla.sim import training, training_trace  # noqa: E402

# (jobs, GPUs, seed, arrivals, deadline factor): load 2x the cluster's GPU-seconds throughout.
FULL = [
    (200, 64, 1, "poisson", (1.2, 3.0)),
    (1000, 512, 2, "bursty", (1.2, 3.0)),
    (2000, 4096, 3, "poisson", (0.5, 1.5)),  # ElasticFlow's deadline shape
]
QUICK = [
    (150, 64, 1, "poisson", (1.2, 3.0)),
    (300, 128, 2, "bursty", (1.2, 3.0)),
    (300, 256, 3, "poisson", (0.5, 1.5)),
]
LOAD = 2.0


def compare(traces: list[tuple]) -> dict[str, float]:
    met = dict.fromkeys(policies.names(), 0)
    total = 0
    for jobs, gpus, seed, arrivals, factor in traces:
        trace = training_trace.generate(jobs, gpus, seed=seed, load=LOAD, arrivals=arrivals, deadline_factor=factor)
        total += jobs
        for name in policies.names():
            r = training.simulate(trace, gpus, policies.get(name))
            met[name] += r.deadlines_met
            print(f"{jobs} jobs / {gpus} GPUs ({arrivals}, deadline x{factor[0]}-{factor[1]}) {name:>24}: "
                  f"deadline ratio {r.deadline_ratio:.3f} (admitted {r.admitted}, rejected {r.rejected}, "
                  f"guaranteed but missed {r.guarantees_missed}), "
                  f"util {r.utilisation:.2f}, avg JCT {r.avg_jct_s:.0f} s, rescales {r.rescales}, "
                  f"re-plan {r.decision_ms_mean:.2f} ms mean", flush=True)
    return {name: m / total for name, m in met.items()}


def replan_ms(gpus: int = 10_000, active: int = 1_000, repeats: int = 5) -> tuple[float, float]:
    """Median CPU and wall-clock ms of one elastic-deadline re-plan: `active` admitted, running jobs, one arrival.

    CPU time (of this thread) is the figure reported: on a shared machine the
    wall clock also counts time spent waiting for a core.
    """
    allocator = policies.get(policies.DEFAULT)
    nodes = training.make_nodes(gpus)
    trace = training_trace.generate(active + 1, gpus, seed=7, load=0.5, deadline_factor=(1.5, 3.0))
    # Admitted earlier and now running where the allocator put them, all at time 0.
    states = [dataclasses.replace(training.initial_state(j), submit_time=0.0, verdict=Verdict.ADMITTED)
              for j in trace[:active]]
    placed = allocator.decide(ClusterSnapshot(0.0, nodes, tuple(states)))
    states = [dataclasses.replace(s, placement=dict(placed.jobs[s.key].placement)) for s in states]
    arrival = dataclasses.replace(training.initial_state(trace[active]), submit_time=0.0)
    snapshot = ClusterSnapshot(0.0, nodes, tuple(states) + (arrival,))
    cpu, wall = [], []
    for _ in range(repeats):
        started_cpu, started_wall = time.thread_time(), time.perf_counter()
        allocator.decide(snapshot)
        cpu.append(time.thread_time() - started_cpu)
        wall.append(time.perf_counter() - started_wall)
    return 1000 * statistics.median(cpu), 1000 * statistics.median(wall)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small traces (finishes within 60 s)")
    args = parser.parse_args()
    started = time.perf_counter()
    ratios = compare(QUICK if args.quick else FULL)
    ours = ratios[policies.DEFAULT]
    best_baseline = max(v for k, v in ratios.items() if k != policies.DEFAULT)
    vs = ours / best_baseline if best_baseline else float("inf")
    t, wall = replan_ms()
    print(f"deadline ratio {policies.DEFAULT} {ours:.3f} vs best baseline {best_baseline:.3f}: x{vs:.2f}; "
          f"one re-plan with 1,000 jobs on 10,000 GPUs: {t:.1f} ms CPU ({wall:.1f} ms wall); "
          f"total {time.perf_counter() - started:.1f} s")
    print(json.dumps({"deadline_ratio": {k: round(v, 4) for k, v in ratios.items()},
                      "vs_best_baseline": round(vs, 3), "replan_ms_10k_gpus": round(t, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
