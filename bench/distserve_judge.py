"""The judge: DistServe's own simulator (github.com/LLMServe/DistServe, `simdistserve/`, Apache-2.0) run on
a layout, as published. It imports nothing of Flotilla (nor numpy's view of the planner): a layout is
plain numbers, the requests are plain lists, and what comes back is each request's TTFT and TPOT.

DistServe is not on PyPI; a checkout is put on sys.path at run time (`use_checkout`), nothing of it is
copied here. Its simulator as published: OPT-13B with its A100 fits, its Ray overhead per iteration,
its 50,000-context-token cap on a decode batch, prefill batches up to `prefill_max_tokens` whole
prompts, colocated instances (its vLLM cluster) without chunked prefill, and its scheduler (the
instance with the fewest requests waiting or in prefill, ties to the first). TTFT ends when the
request waits for decode; TPOT is the decode latency (from then to the last token) over output-1.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

PREFILL_MAX_TOKENS = 4096  # the prefill batch-token limit the judge runs with (vLLM's default scheduler budget)


def use_checkout(path: str) -> None:
    if path not in sys.path:
        sys.path.insert(0, path)


@dataclass(frozen=True)
class JudgeLayout:
    n_prefill: int = 0
    tp_prefill: int = 0
    n_decode: int = 0
    tp_decode: int = 0
    n_colocated: int = 0
    tp_colocated: int = 0

    @property
    def gpus(self) -> int:
        return self.n_prefill * self.tp_prefill + self.n_decode * self.tp_decode + self.n_colocated * self.tp_colocated

    def describe(self) -> str:
        if self.n_colocated:
            return f"{self.n_colocated}x{self.tp_colocated}-GPU colocated"
        return f"{self.n_prefill}x{self.tp_prefill}-GPU prefill + {self.n_decode}x{self.tp_decode}-GPU decode"


def latencies(layout: JudgeLayout, arrivals_s: list[float], prompts: list[int], outputs: list[int],
              model: str = "OPT-13B") -> tuple[list[float], list[float]]:
    """(TTFT ms, TPOT ms) per request, from DistServe's simulator. `outputs` count the first token."""
    import simpy
    from simdistserve.base.scheduler import put_requests_with_interarrivals
    from simdistserve.base.worker import WorkerConfig
    from simdistserve.base.workload import convert_pd_pair_to_request
    from simdistserve.clusters.disagg import DisaggCluster
    from simdistserve.clusters.vllm import VLLMCluster

    # DistServe's output length counts the decode steps, after the prefill's first token
    requests = convert_pd_pair_to_request([(p, max(o - 1, 0)) for p, o in zip(prompts, outputs)])
    inter = [(t - s) * 1000.0 for s, t in zip([0.0, *arrivals_s[:-1]], arrivals_s)]
    colocated = layout.n_colocated > 0
    tp_p = layout.tp_colocated if colocated else layout.tp_prefill
    tp_d = layout.tp_colocated if colocated else layout.tp_decode
    config = WorkerConfig(model_type=model, TP=tp_p, TP_Prefill=tp_p, TP_Decode=tp_d,
                          prefill_max_batch_size=10**7, decode_max_batch_size=10**7,
                          prefill_max_tokens=PREFILL_MAX_TOKENS, decode_max_tokens=10**7,
                          enable_chunked_prefill=False, engine_type="distserve")
    env = simpy.Environment()
    cluster = (VLLMCluster(env=env, N_instance=layout.n_colocated, PP=1, worker_configs=config) if colocated
               else DisaggCluster(env=env, N_prefill_instance=layout.n_prefill, N_decode_instance=layout.n_decode,
                                  PP_prefill=1, PP_decode=1, worker_configs=config))
    cluster.run()
    put_requests_with_interarrivals(env, cluster.scheduler, inter, requests)
    env.run()
    ttft, tpot = [], []
    for r, o in zip(requests, outputs):
        # the request's own event log, read as DistServe's organize_data does (without pandas)
        start = min(t for t, event, _ in r.log if event == "init")
        waits = [t for t, event, _ in r.log if event == "wait_decode"]
        exits = [t for t, event, _ in r.log if event == "exit_system"]
        if not waits or not exits:
            ttft.append(float("inf"))
            tpot.append(float("inf"))
            continue
        ttft.append(min(waits) - start)
        tpot.append((max(exits) - min(waits)) / (o - 1) if o > 1 else 0.0)
    return ttft, tpot


def attainment(layout: JudgeLayout, arrivals_s: list[float], prompts: list[int], outputs: list[int],
               ttft_ms: float, tpot_ms: float) -> float:
    """The share of requests meeting both TTFT and TPOT."""
    ttft, tpot = latencies(layout, arrivals_s, prompts, outputs)
    return sum(1 for a, b in zip(ttft, tpot) if a <= ttft_ms and b <= tpot_ms) / len(ttft)
