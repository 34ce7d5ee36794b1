"""The latency model: how many requests per second one instance serves within the SLO.

Service times come from the profile (`PrefillFit.batch_ms`, `DecodeFit.step_ms`). On top of them:

Prefill instance (M/G/1, DistServe's M/D/1 analysis generalised to a length distribution).
  Requests arrive as a Poisson stream of rate r and are prefilled one at a time, FCFS. With S the
  prefill time of one prompt, rho = r*E[S] and the Pollaczek-Khinchine mean wait
  E[W] = r*E[S^2] / (2*(1 - rho)) (for equal prompts this is exactly M/D/1). For the tail we use the
  standard exponential approximation P(W > t) = rho * exp(-rho * t / E[W]) (exact for M/M/1, slightly
  pessimistic for M/D/1). A request of prompt length l misses TTFT when W > ttft - S(l); the miss
  fraction is averaged over the length sample. Batching (the simulator batches queued prompts up to
  maxBatchTokens) only helps, so the model errs on the safe side.

Decode instance (continuous batching up to a memory limit).
  Each request stays for o-1 steps. By Little's law the mean batch is B = r*E[o-1]*tau, and a step takes
  tau = (constantMs + B*(perRequestMs + perContextTokenMs*c)) / 1000, c being the time-weighted mean
  context of a request (prompt plus half its output); solving the two gives B in closed form. The batch
  in steady state fluctuates like a Poisson count, so the TPOT we check is the step time at
  B + z*sqrt(B), z the normal quantile of the miss budget. The batch must also fit in memory: every
  request reserves prompt+output tokens of KV cache (no preemption), and at most maxBatchSize requests.

Colocated instance (prefill and decode on the same GPUs, prefill first, as vLLM schedules).
  Prefills stall the decode batch: decode runs only 1 - rho_p of the time, so every step stretches by
  1/(1 - rho_p); a new prompt also waits for the decode step in progress. This is the interference that
  disaggregation removes.

Joint attainment: a request counts only if it meets TTFT and TPOT. The planner gives each phase half
of the allowed misses (a union bound), so meeting both per-phase budgets guarantees the joint target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Callable

import numpy as np

from flotilla.serving.profile import DecodeFit, PrefillFit
from flotilla.serving.workload import Workload

_BISECTION_STEPS = 40


def prefill_miss_fraction(fit: PrefillFit, workload: Workload, rate: float, ttft_ms: float,
                          extra_wait_ms: float = 0.0) -> float:
    """Fraction of requests whose TTFT exceeds `ttft_ms` at one prefill instance fed `rate` req/s."""
    service = _prefill_seconds(fit, workload)
    rho = rate * service.mean()
    if rho >= 1.0:
        return 1.0
    slack = ttft_ms / 1000.0 - service - extra_wait_ms / 1000.0
    mean_wait = rate * float(np.mean(service**2)) / (2.0 * (1.0 - rho))
    if mean_wait <= 0.0:
        return float(np.mean(slack < 0))
    tail = np.where(slack < 0, 1.0, rho * np.exp(-rho * np.maximum(slack, 0.0) / mean_wait))
    return float(tail.mean())


@dataclass(frozen=True)
class DecodeLoad:
    """Steady state of a decode batch at a given rate: the batch at the tail and its step time."""

    batch: float
    tail_batch: float
    tail_tpot_ms: float
    fits_memory: bool


def decode_load(fit: DecodeFit, workload: Workload, rate: float, miss_budget: float,
                busy_elsewhere: float = 0.0) -> DecodeLoad | None:
    """The decode batch of one instance fed `rate` req/s; None when the batch grows without bound.
    `busy_elsewhere` is the fraction of time the GPUs spend on other work (prefill, when colocated)."""
    steps = np.maximum(np.asarray(workload.output_tokens, dtype=float) - 1.0, 0.0)
    total_steps = steps.sum()
    if total_steps == 0.0 or rate == 0.0:
        return DecodeLoad(0.0, 0.0, 0.0, True)
    if busy_elsewhere >= 1.0:
        return None
    prompts = np.asarray(workload.prompt_tokens, dtype=float)
    mean_context = float((steps * (prompts + 1.0 + steps / 2.0)).sum() / total_steps)
    mean_reserved = float((steps * (prompts + steps + 1.0)).sum() / total_steps)
    stretch = 1.0 / (1.0 - busy_elsewhere)
    per_request_ms = fit.per_request_ms + fit.per_context_token_ms * mean_context
    arrivals_per_ms = rate * float(steps.mean()) * stretch / 1000.0  # request-steps entering per ms of step time
    denominator = 1.0 - arrivals_per_ms * per_request_ms
    if denominator <= 0.0:
        return None
    batch = arrivals_per_ms * fit.constant_ms / denominator
    tail_batch = batch + NormalDist().inv_cdf(1.0 - miss_budget) * math.sqrt(batch)
    tail_tpot = stretch * (fit.constant_ms + per_request_ms * tail_batch)
    fits = tail_batch <= fit.max_batch_size and tail_batch * mean_reserved <= fit.kv_cache_tokens
    return DecodeLoad(batch, tail_batch, tail_tpot, fits)


def prefill_capacity(fit: PrefillFit, workload: Workload, ttft_ms: float, miss_budget: float) -> float:
    """Highest rate (req/s) one prefill instance serves with at most `miss_budget` TTFT misses."""
    return _max_rate(lambda r: prefill_miss_fraction(fit, workload, r, ttft_ms) <= miss_budget,
                     _prefill_saturation(fit, workload))


def decode_capacity(fit: DecodeFit, workload: Workload, tpot_ms: float, miss_budget: float) -> float:
    """Highest rate (req/s) one decode instance serves with its tail TPOT within `tpot_ms`."""
    def ok(rate: float) -> bool:
        load = decode_load(fit, workload, rate, miss_budget)
        return load is not None and load.fits_memory and load.tail_tpot_ms <= tpot_ms
    return _max_rate(ok, _decode_saturation(fit, workload))


def colocated_capacity(prefill: PrefillFit, decode: DecodeFit, workload: Workload, ttft_ms: float,
                       tpot_ms: float, miss_budget: float) -> float:
    """Highest rate one colocated instance serves meeting both phases' miss budgets."""
    mean_prefill_s = float(_prefill_seconds(prefill, workload).mean())

    def ok(rate: float) -> bool:
        load = decode_load(decode, workload, rate, miss_budget, busy_elsewhere=rate * mean_prefill_s)
        if load is None or not load.fits_memory or load.tail_tpot_ms > tpot_ms:
            return False
        step_in_progress_ms = decode.step_ms(load.batch, 0.0)
        return prefill_miss_fraction(prefill, workload, rate, ttft_ms, step_in_progress_ms) <= miss_budget

    return _max_rate(ok, min(_prefill_saturation(prefill, workload), _decode_saturation(decode, workload)))


def _prefill_seconds(fit: PrefillFit, workload: Workload) -> np.ndarray:
    prompts = np.asarray(workload.prompt_tokens, dtype=float)
    return (fit.constant_ms + fit.per_token_ms * prompts + fit.per_token_squared_ms * prompts**2) / 1000.0


def _prefill_saturation(fit: PrefillFit, workload: Workload) -> float:
    return 1.0 / float(_prefill_seconds(fit, workload).mean())


def _decode_saturation(fit: DecodeFit, workload: Workload) -> float:
    steps = float(np.mean(workload.output_tokens)) - 1.0
    if steps <= 0.0 or fit.per_request_ms <= 0.0:
        return 1e3
    return 1000.0 / (fit.per_request_ms * steps)


def _max_rate(ok: Callable[[float], bool], upper: float) -> float:
    """Largest rate where ok(rate) holds, for ok monotone (true up to some rate, then false);
    `upper` is a first guess of the bound, widened while still feasible. inf when never false."""
    if not ok(1e-9):
        return 0.0
    lo, hi = 0.0, upper
    for _ in range(64):
        if not ok(hi):
            break
        lo, hi = hi, hi * 2
    else:
        return math.inf
    for _ in range(_BISECTION_STEPS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo
