"""Benchmark: one GPU pool (the arbiter) against static partitions, on training and serving together.

  python bench/unified.py [--quick]

Two seeded scenarios on 64 GPUs (flotilla.sim.unified_scenarios): a diurnal serving day with a
3x peak-to-trough swing plus a deadline training trace, and an unannounced 3x serving burst
plus the same kind of trace. Each runs under static-peak, static-mean and unified, over several
seeds; a figure is the mean over seeds. The unified pool runs twice: with the default cluster
policy ("unified") and with borrowGuaranteed on ("unified-borrow"). Prints one line per scenario
and policy, then per scenario each unified run's ratios to static-peak, then, as its last line,
one JSON object:
{"attainment_vs_static_peak": a, "deadline_ratio_vs_static_peak": d, "util": {"<policy>": u, ...}}
where a and d are the default-policy unified pool's worst (lowest) ratio over the scenarios, and
util the mean over scenarios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from flotilla.pool import PoolPolicy  # noqa: E402
from flotilla.sim.unified import simulate  # noqa: E402
from flotilla.sim.unified_scenarios import build  # noqa: E402

# scenario -> mean serving rate (req/s): the diurnal day peaks near 48 of 64 GPUs, the burst near 44.
RATES = {"diurnal": 250.0, "burst": 200.0}
# label -> (simulator policy, pool policy): the unified pool with the default cluster policy, and with
# borrowGuaranteed on (serving may take guaranteed shares), to show that trade.
POLICIES = {"static-peak": ("static-peak", PoolPolicy()), "static-mean": ("static-mean", PoolPolicy()),
            "unified": ("unified", PoolPolicy()), "unified-borrow": ("unified", PoolPolicy(borrow_guaranteed=True))}
TRAINING_LOAD = 1.3
QUICK = {"seeds": (1, 2, 3), "duration_s": 12 * 3600.0, "training_jobs": 400}
FULL = {"seeds": tuple(range(1, 9)), "duration_s": 24 * 3600.0, "training_jobs": 800}


def run(config: dict) -> dict:
    ratios_att, ratios_dl = [], []
    util: dict[str, list[float]] = {p: [] for p in POLICIES}
    for name, rate in RATES.items():
        means: dict[str, dict[str, float]] = {}
        for policy, (sim_policy, pool_policy) in POLICIES.items():
            results = [simulate(build(name, seed, duration_s=config["duration_s"], mean_rate=rate,
                                      training_jobs=config["training_jobs"], training_load=TRAINING_LOAD),
                                sim_policy, pool_policy)
                       for seed in config["seeds"]]
            means[policy] = {key: statistics.fmean(getattr(r, key) for r in results)
                             for key in ("deadline_ratio", "slo_attainment", "utilisation", "checkpoint_shrinks",
                                         "rejected", "serving_gpus_mean", "training_gpus_mean")}
            m = means[policy]
            util[policy].append(m["utilisation"])
            print(f"{name:>8} {policy:>14}: deadline ratio {m['deadline_ratio']:.3f}, "
                  f"SLO attainment {m['slo_attainment']:.4f}, utilisation {m['utilisation']:.3f}, "
                  f"checkpoint shrinks {m['checkpoint_shrinks']:.1f}, rejected {m['rejected']:.1f}, "
                  f"GPUs serving {m['serving_gpus_mean']:.1f} / training {m['training_gpus_mean']:.1f}", flush=True)
        peak = means["static-peak"]
        for label in ("unified", "unified-borrow"):
            unified = means[label]
            att = unified["slo_attainment"] / peak["slo_attainment"]
            dl = unified["deadline_ratio"] / peak["deadline_ratio"]
            if label == "unified":
                ratios_att.append(att)
                ratios_dl.append(dl)
            beats = all(unified["utilisation"] > means[p]["utilisation"] for p in ("static-peak", "static-mean"))
            print(f"{name:>8} {label} vs static-peak: attainment x{att:.4f} (target >= 0.99), "
                  f"deadline ratio x{dl:.3f} (target >= 1.2), utilisation above both static: {beats}", flush=True)
    return {"attainment_vs_static_peak": round(min(ratios_att), 4),
            "deadline_ratio_vs_static_peak": round(min(ratios_dl), 4),
            "util": {p: round(statistics.fmean(u), 4) for p, u in util.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 seeds of a 12-hour span (about 10 s)")
    args = parser.parse_args()
    started = time.perf_counter()
    summary = run(QUICK if args.quick else FULL)
    print(f"took {time.perf_counter() - started:.1f} s", flush=True)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
