"""The planner's latency model against DistServe's own simulator (simdistserve), an independent check.

DistServe (OSDI'24) published its simulator with the OPT-13B A100 fits our shipped profile comes from
(github.com/LLMServe/DistServe, `simdistserve/`, Apache-2.0). It is not on PyPI; this script runs it
in place from a checkout (nothing of it is copied here) in an environment with simpy and pandas:

    python -m venv /tmp/ds && /tmp/ds/bin/pip install simpy pandas numpy tqdm
    /tmp/ds/bin/python bench/serving_distserve.py --distserve /path/to/DistServe

Per configuration (prefill and decode instances of 1, 2, 4 GPUs, two SLOs) the planner predicts a
capacity C under its per-phase criterion (at most (1 - attainment)/2 of requests over TTFT for
prefill, over TPOT for decode). Its error is within the tolerance t exactly when DistServe's
simulator meets that criterion at C/(1+t) and misses it at C/(1-t); the script runs both rates (and
reports the miss fractions), with the same seeded requests as `bench/serving_model.py` (arrivals
scaled with the rate, the first fifth warm-up). A prefill instance is measured in a DisaggCluster
whose decode instance has 4 GPUs (TTFT ends when the prefill does), a decode instance behind a
4-GPU prefill. Prefill batches take at most the profile's maxBatchTokens. Colocated instances are
not compared: DistServe's vLLM cluster schedules prompts first without chunked prefill, which is not
what the planner models (chunked prefill, vLLM's default today).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving_model import DEGREES, SLOS, predicted  # noqa: E402

from flotilla.serving.shipped_profiles import OPT_13B_A100  # noqa: E402
from flotilla.serving.validation import PREDICTION_TOLERANCE  # noqa: E402
from flotilla.serving.workload import SLO, Workload  # noqa: E402
from flotilla.sim.serving_trace import generate  # noqa: E402


def distserve_misses(role: str, gpus: int, unit: np.ndarray, prompts: np.ndarray, outputs: np.ndarray,
                     rate: float, slo: SLO, duration_s: float) -> tuple[float, float]:
    import simpy
    from simdistserve.base.organize_data import calculate_per_request_latency, organize_request_event_df
    from simdistserve.base.scheduler import put_requests_with_interarrivals
    from simdistserve.base.worker import WorkerConfig
    from simdistserve.base.workload import convert_pd_pair_to_request
    from simdistserve.clusters.disagg import DisaggCluster
    from simdistserve.clusters.vllm import VLLMCluster
    from simdistserve.estimators.memory_estimator import get_max_num_tokens

    arrivals = unit / rate
    count = int(np.searchsorted(arrivals, duration_s))
    # DistServe's output length counts the decode steps, after the prefill's first token
    requests = convert_pd_pair_to_request([(int(p), int(o) - 1) for p, o in zip(prompts[:count], outputs[:count])])
    inter = np.diff(arrivals[:count], prepend=0.0) * 1000.0
    model = "OPT-13B"  # simdistserve.constants.ModelTypes.opt_13b
    tp_prefill, tp_decode = {"prefill": (gpus, 4), "decode": (4, gpus), "colocated": (gpus, gpus)}[role]
    config = WorkerConfig(model_type=model, TP=tp_prefill, TP_Prefill=tp_prefill, TP_Decode=tp_decode,
                          prefill_max_batch_size=10**7, decode_max_batch_size=10**7,
                          prefill_max_tokens=OPT_13B_A100.prefill_fit(tp_prefill).max_batch_tokens,
                          decode_max_tokens=get_max_num_tokens(model, tp_decode, 1),
                          enable_chunked_prefill=False, engine_type="distserve")
    env = simpy.Environment()
    cluster = (VLLMCluster(env=env, PP=1, worker_configs=config) if role == "colocated"
               else DisaggCluster(env=env, PP_prefill=1, PP_decode=1, worker_configs=config))
    cluster.run()
    put_requests_with_interarrivals(env, cluster.scheduler, list(inter), requests)
    env.run()
    events = organize_request_event_df(requests)
    latency = calculate_per_request_latency(events, None)
    warm = arrivals[:count] >= duration_s / 5
    ttft = latency["first_token_latency"].reindex(range(count)).to_numpy()[warm]
    decoding = latency["decoding_latency"].reindex(range(count)).to_numpy()[warm]
    steps = np.maximum(outputs[:count][warm] - 1, 1)
    tpot = decoding / steps
    return float(np.mean(ttft > slo.ttft_ms)), float(np.mean(tpot > slo.tpot_ms))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--distserve", required=True, help="a checkout of github.com/LLMServe/DistServe")
    parser.add_argument("--duration", type=float, default=100.0)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    sys.path.insert(0, args.distserve)

    trace = generate("steady", "chat", 1.0, 300.0 * args.duration, args.seed)
    unit, prompts, outputs = trace.arrival_s, trace.prompt_tokens, trace.output_tokens
    workload = Workload.from_means(1.0, float(prompts.mean()), float(outputs.mean()),
                                   float(np.percentile(prompts, 90)), float(np.percentile(outputs, 90)))
    print(f"{'slo':16} {'config':12} {'predicted':>9}  {'misses at C/1.15':>17}  {'misses at C/0.85':>17}  verdict")
    table = []
    for slo_name, slo in SLOS.items():
        budget = (1.0 - slo.attainment) / 2.0
        for role in ("prefill", "decode"):
            for gpus in DEGREES:
                capacity = predicted(role, gpus, workload, slo)
                phase = 0 if role == "prefill" else 1
                low = distserve_misses(role, gpus, unit, prompts, outputs, capacity / (1 + PREDICTION_TOLERANCE), slo,
                                       args.duration)[phase]
                high = distserve_misses(role, gpus, unit, prompts, outputs, capacity / (1 - PREDICTION_TOLERANCE),
                                        slo, args.duration)[phase]
                verdict = ("within" if low <= budget < high else
                           "over-predicts" if low > budget else "under-predicts")
                table.append({"slo": slo_name, "role": role, "gpus": gpus,
                              "predicted_per_gpu": round(capacity / gpus, 3),
                              "miss_below": round(low, 4), "miss_above": round(high, 4), "verdict": verdict})
                print(f"{slo_name:16} {role + ' x' + str(gpus):12} {capacity / gpus:9.3f}  {low:17.3f}  {high:17.3f}  "
                      f"{verdict} {PREDICTION_TOLERANCE:.0%}", flush=True)
    print(json.dumps({"errors": table}))


if __name__ == "__main__":
    main()
