"""The planner's latency model against the engine double, per configuration.

For each instance configuration (colocated, prefill, decode; 1, 2, 4 GPUs) and each SLO, the highest
Poisson rate one instance serves within the SLO is found twice:

* predicted: `flotilla.serving.latency` (what the planner plans with), fed what a controller would
  know of the load: the rate, and the mean and 90th-percentile lengths (a lognormal fit);
* measured: the engine double (`flotilla.testing.engine`, its own iteration-level scheduling priced by
  DistServe's published OPT-13B A100 fits), bisected on the rate over one seeded set of requests whose
  arrival times are scaled with the rate (common random numbers: the measurement is monotone in it).

"Within the SLO" is the planner's own criterion: each phase misses its target on at most half of the
allowed misses, (1 - attainment) / 2 (TTFT for prefill, TPOT for decode, both for colocated). The
error is predicted / measured - 1 in goodput per GPU (the GPU count cancels). The configurations
whose error exceeds `PREDICTION_TOLERANCE` on either SLO are what `shipped_profiles` marks unvalidated.

Near capacity a configuration's miss fraction is flat, so one sample of requests moves its measured
capacity by up to 25% (prefill x1 and colocated x1 at TTFT 200 ms most): the error is the mean over
four samples (seeds 11-14), each printed.

    python bench/serving_model.py            # about 10 minutes on one core; last line is JSON
    python bench/serving_model.py --seeds 11 --duration 60 --steps 5   # a rough pass
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout

from flotilla.serving.latency import colocated_capacity, decode_capacity, prefill_capacity
from flotilla.serving.shipped_profiles import OPT_13B_A100
from flotilla.serving.validation import PREDICTION_TOLERANCE
from flotilla.serving.workload import SLO, Workload
from flotilla.sim.serving_trace import LENGTH_SHAPES, generate
from flotilla.testing.engine import Engine, Request, drive

SLOS = {"ttft400-tpot60": SLO(400.0, 60.0, 0.9), "ttft200-tpot100": SLO(200.0, 100.0, 0.9)}
ROLES = ("colocated", "prefill", "decode")
DEGREES = (1, 2, 4)


def predicted(role: str, gpus: int, workload: Workload, slo: SLO) -> float:
    budget = (1.0 - slo.attainment) / 2.0
    prefill, decode = OPT_13B_A100.prefill_fit(gpus), OPT_13B_A100.decode_fit(gpus)
    if role == "prefill":
        return prefill_capacity(prefill, workload, slo.ttft_ms, budget)
    if role == "decode":
        return decode_capacity(decode, workload, slo.tpot_ms, budget)
    return colocated_capacity(prefill, decode, workload, slo.ttft_ms, slo.tpot_ms, budget)


def misses(role: str, gpus: int, unit_arrivals: np.ndarray, prompts: np.ndarray, outputs: np.ndarray,
           rate: float, slo: SLO, duration_s: float, **engine_settings) -> tuple[float, float]:
    """(TTFT miss fraction, TPOT miss fraction) of one engine fed these requests at `rate` for
    `duration_s`, over the requests that arrive after the first fifth (the warm-up)."""
    engine = Engine(role, gpus, **engine_settings)  # type: ignore[arg-type]
    arrivals = unit_arrivals / rate
    count = int(np.searchsorted(arrivals, duration_s))
    if count == len(arrivals):
        raise ValueError(f"rate {rate:.1f}: more requests needed than the {len(arrivals)} generated")
    requests = []
    for i, (t, p, o) in enumerate(zip(arrivals[:count], prompts, outputs)):
        request = Request(str(i), int(p), int(o) if role != "prefill" else 1)
        if role == "decode":  # handed off by a prefill engine the moment it arrives
            request.arrival = request.first_token_at = float(t)
            request.generated = 1
        requests.append((float(t), request))
    drive(engine, requests)
    done = [r for t, r in requests if t >= duration_s / 5]
    ttft = np.array([r.first_token_at - r.arrival for r in done]) * 1000.0
    tpot = np.array([r.tpot for r in done]) * 1000.0
    return float(np.mean(ttft > slo.ttft_ms)), float(np.mean(tpot > slo.tpot_ms))


def measured(role: str, gpus: int, unit_arrivals: np.ndarray, prompts: np.ndarray, outputs: np.ndarray,
             slo: SLO, guess: float, steps: int, duration_s: float, **engine_settings) -> float:
    budget = (1.0 - slo.attainment) / 2.0

    def ok(rate: float) -> bool:
        ttft_miss, tpot_miss = misses(role, gpus, unit_arrivals, prompts, outputs, rate, slo, duration_s,
                                      **engine_settings)
        return (role == "decode" or ttft_miss <= budget) and (role == "prefill" or tpot_miss <= budget)

    lo, hi = guess / 2.0, guess * 2.0
    while not ok(lo):
        lo, hi = lo / 2.0, lo
        if lo < 1e-3:
            return 0.0
    while ok(hi):
        lo, hi = hi, hi * 2.0
    for _ in range(steps):  # bisection on the log of the rate
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return math.sqrt(lo * hi)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=100.0,
                        help="simulated seconds of arrivals per measurement (the first fifth is warm-up)")
    parser.add_argument("--steps", type=int, default=7, help="bisection steps (each halves the log-interval)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[11, 12, 13, 14],
                        help="request samples; the error of a configuration is the mean over them")
    parser.add_argument("--shape", default="chat", choices=sorted(LENGTH_SHAPES))
    parser.add_argument("--no-chunked-prefill", action="store_true",
                        help="colocated engines schedule prompts first (vLLM before chunked prefill)")
    parser.add_argument("--only", nargs="*", default=[], help="configurations to measure, e.g. decode:1")
    args = parser.parse_args()

    samples = []
    for seed in args.seeds:
        # unit-rate arrivals, scaled by 1/rate for each measurement; enough for 300 req/s
        trace = generate("steady", args.shape, 1.0, 300.0 * args.duration, seed)
        unit, prompts, outputs = trace.arrival_s, trace.prompt_tokens, trace.output_tokens
        workload = Workload.from_means(1.0, float(prompts.mean()), float(outputs.mean()),
                                       float(np.percentile(prompts, 90)), float(np.percentile(outputs, 90)))
        samples.append((seed, unit, prompts, outputs, workload))
    settings = {"chunked_prefill": False} if args.no_chunked_prefill else {}
    print(f"engine double vs latency model: OPT-13B A100, {args.shape} lengths, {args.duration:g} s per rate, "
          f"seeds {' '.join(map(str, args.seeds))}, colocated chunked prefill "
          f"{'off' if args.no_chunked_prefill else 'on'}")
    print(f"{'slo':16} {'config':14} {'predicted':>10} {'measured':>9} {'error':>7}  per seed  (req/s per GPU)")
    table = []
    started = time.perf_counter()
    for slo_name, slo in SLOS.items():
        for role in ROLES:
            for gpus in DEGREES:
                if args.only and f"{role}:{gpus}" not in args.only:
                    continue
                guesses, measures, errors = [], [], []
                for seed, unit, prompts, outputs, workload in samples:
                    guess = predicted(role, gpus, workload, slo)
                    measure = measured(role, gpus, unit, prompts, outputs, slo,
                                       guess if 0 < guess < math.inf else 1.0, args.steps, args.duration,
                                       **(settings if role == "colocated" else {}))
                    guesses.append(guess)
                    measures.append(measure)
                    errors.append(guess / measure - 1.0 if measure > 0 else math.inf)
                error = sum(errors) / len(errors)
                guess, measure = sum(guesses) / len(guesses), sum(measures) / len(measures)
                table.append({"slo": slo_name, "role": role, "gpus": gpus, "predicted_per_gpu": round(guess / gpus, 3),
                              "measured_per_gpu": round(measure / gpus, 3), "error": round(error, 3),
                              "errors": [round(e, 3) for e in errors]})
                flag = "" if abs(error) <= PREDICTION_TOLERANCE else "  outside tolerance"
                print(f"{slo_name:16} {role + ' x' + str(gpus):14} {guess / gpus:10.3f} {measure / gpus:9.3f} "
                      f"{error:+7.1%}  {' '.join(f'{e:+.0%}' for e in errors)}{flag}", flush=True)
    print(f"{time.perf_counter() - started:.0f} s")
    print(json.dumps({"errors": table}))


if __name__ == "__main__":
    main()
