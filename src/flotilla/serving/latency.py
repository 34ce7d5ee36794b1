"""The latency model: how many requests per second one instance serves within the SLO.

Service times come from the profile (`PrefillFit.batch_ms`, `DecodeFit.step_ms`). On top of them:

Prefill instance (batched, as vLLM schedules prompts: all that wait, up to maxBatchTokens tokens).
  A batch costs constantMs plus each prompt's own work s(l) = perTokenMs*l + perTokenSquaredMs*l^2.
  The batch run next holds the prompts that arrived while the current one ran, so the cycle length
  T satisfies E[T] = constantMs + r*E[T]*E[s]: T = constantMs / (1 - r*E[s]) (r in req/ms). A request
  that finds the engine busy waits the rest of the current cycle (uniform over its length-biased
  span E[T^2]/E[T]), then runs in a batch of constantMs, its own s(l) and the others' work, a compound
  Poisson sum over the cycle taken as normal (mean r*T*E[s], variance r*T*E[s^2]). It finds the
  engine busy with probability min(1, r*(constantMs + E[s])); otherwise its TTFT is constantMs + s(l).
  Stable while full batches keep up: r*(constantMs + K*E[s]) < K, K = maxBatchTokens / E[l] prompts.
  (The one-at-a-time M/G/1 this replaces under-rated a TP4 prefill instance by 40%: batching shares
  the constant cost, which is most of a short prompt's time on 4 GPUs.)

Decode instance (continuous batching up to a memory limit).
  Each request stays for o-1 steps. By Little's law the mean batch is B = r*E[o-1]*tau, and a step takes
  tau = (constantMs + B*(perRequestMs + perContextTokenMs*c)) / 1000, c being the time-weighted mean
  context of a request (prompt plus half its output); solving the two gives B in closed form. The batch
  in steady state fluctuates like a Poisson count, so the TPOT we check is the step time at
  B + z*sqrt(B), z the normal quantile of the miss budget. The batch must also fit in memory: KV cache
  is allocated in pages as tokens are made (vLLM's paged attention), so the tail batch times the mean
  context must fit kvCacheTokens, and at most maxBatchSize requests.

Colocated instance (prefill and decode on the same GPUs, chunked prefill: vLLM's default).
  Every iteration runs one decode step for the batch and as many waiting prompt tokens as the budget
  (maxBatchTokens minus the batch) allows, in one forward pass: its fixed cost is the larger constant,
  paid once, and prompts add only their own work. So tau = a + B*k + r*tau*E[s] with B = r*E[o-1]*tau,
  k the decode cost per request: tau = a / (1 - r*(E[o-1]*k + E[s])). A request's TPOT is its mean
  iteration time over its life; the tail uses the batch at B + z*sqrt(B) and the prompt work over the
  life at its mean plus z standard deviations. TTFT is the prefill instance's formula with the
  iteration as the cycle, a + B*k as its fixed cost, and the budget left by the batch as the chunk
  size (a prompt longer than that takes several iterations). A configuration whose iterations cannot
  fit the prompt tokens arriving (B + r*tau*E[l] > maxBatchTokens) is unstable.

Joint attainment: a request counts only if it meets TTFT and TPOT. The re-planner's fast path
(planner.instance_capacities) gives each phase half of the allowed misses (a union bound). plan()
(flotilla.serving.search) instead rates each phase with the whole allowance, only to rank layouts, and
judges the joint attainment of a whole layout behind its router by simulation (flotilla.serving.check).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import Callable

import numpy as np

from flotilla.serving.profile import DecodeFit, PrefillFit
from flotilla.serving.workload import Workload

_BISECTION_STEPS = 24


def prefill_miss_fraction(fit: PrefillFit, workload: Workload, rate: float, ttft_ms: float) -> float:
    """Fraction of requests whose TTFT exceeds `ttft_ms` at one prefill instance fed `rate` req/s."""
    prompts = np.asarray(workload.prompt_tokens, dtype=float)
    return _batched_ttft_miss(_prefill_work_ms(fit, prompts), prompts, rate / 1000.0, fit.constant_ms,
                              float(fit.max_batch_tokens), ttft_ms)


def _batched_ttft_miss(work: np.ndarray, prompts: np.ndarray, rate_per_ms: float, fixed_ms: float,
                       chunk_tokens: float, ttft_ms: float, keeps_running: bool = False) -> float:
    """TTFT misses of a batch-serving engine (see the module docstring): `work` is each sampled prompt's
    own cost, `fixed_ms` the cost of every batch, `chunk_tokens` the prompt tokens one batch takes.
    `keeps_running`: the engine iterates even with no prompt to take (a colocated decode batch), so
    an arrival waits for the iteration in progress; otherwise an idle engine starts at once."""
    mean_s, mean_s2 = float(work.mean()), float(np.mean(work**2))
    if chunk_tokens < 1.0:
        return 1.0
    own = np.ceil(prompts / chunk_tokens) * fixed_ms + work
    idle_miss = float(np.mean(own > ttft_ms))
    if rate_per_ms == 0.0:
        return idle_miss
    full_batch = chunk_tokens / float(prompts.mean())
    if rate_per_ms * (fixed_ms + full_batch * mean_s) >= full_batch:
        return 1.0  # even full batches fall behind
    # The batch sizes form a Markov chain: a batch of k prompts lasts T = fixed + the k prompts' work
    # (mean k*E[s], variance k*Var[s]: taken on a grid of normal quantiles), and the next one holds
    # the prompts that arrived meanwhile, Poisson(r*T).
    states = max(int(math.ceil(full_batch)), 2) + 1
    k = np.arange(states)
    spread = math.sqrt(max(mean_s2 - mean_s**2, 0.0))
    span = np.maximum(fixed_ms + k[:, None] * mean_s + np.sqrt(k)[:, None] * spread * _NORMAL_GRID[None, :],
                      fixed_ms)  # (state, grid)
    if not keeps_running:
        span[0] = 1.0 / rate_per_ms  # idle until the next arrival, whose batch starts at once, alone
    arrivals = rate_per_ms * span
    transition = np.mean([_poisson_rows(arrivals[:, g], states) for g in range(len(_NORMAL_GRID))], axis=0)
    if not keeps_running:
        transition[0] = 0.0
        transition[0, 1] = 1.0
    stationary = _stationary(transition)
    # Where a random arrival lands: in proportion to time. In a cycle of span T it waits a uniform part
    # of it, then its batch holds the work of the Poisson(r*T) others that arrived in the same cycle.
    time_share = stationary[:, None] * span
    time_share /= time_share.sum()
    residual = _UNIFORM_GRID[:, None, None] * span[None, :, :]  # (u, state, grid)
    others_mean = arrivals * mean_s
    others_sd = np.maximum(np.sqrt(arrivals * mean_s2), 1e-9)
    ordered = np.sort(own)  # the prompts' own time, on a coarser grid of its quantiles
    own_points = ordered[(_UNIFORM_GRID_FINE * len(ordered)).astype(int)]
    slack = ttft_ms - own_points[:, None, None, None] - residual[None] - others_mean[None, None]
    miss = _normal_sf(slack / others_sd[None, None]).mean(axis=(0, 1))  # (state, grid)
    if not keeps_running:
        miss[0] = idle_miss
    return float((miss * time_share).sum())


def _adjustment_coefficient(service: np.ndarray, rate_per_ms: float) -> float:
    """Cramer-Lundberg: the decay rate theta of P(W > t) ~ rho * exp(-theta * t) in an M/G/1 queue,
    the positive root of r * (E[exp(theta * S)] - 1) = theta. It heeds the whole service distribution
    (a long prompt's quadratic cost), not only its first two moments."""
    def excess(theta: float) -> float:
        return rate_per_ms * (float(np.mean(np.exp(np.minimum(theta * service, 700.0)))) - 1.0) - theta

    hi = 1.0 / float(service.max())
    while excess(hi) < 0.0:
        hi *= 2.0
    lo = 0.0
    for _ in range(_BISECTION_STEPS):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if excess(mid) < 0.0 else (lo, mid)
    return (lo + hi) / 2.0


def _poisson_rows(means: np.ndarray, states: int) -> np.ndarray:
    """Row i: Poisson(means[i]) over 0..states-1, the tail folded into the last state."""
    counts, log_factorial = _log_factorials(states)
    means = np.maximum(means, 1e-12)
    rows: np.ndarray = np.exp(counts[None, :] * np.log(means)[:, None] - means[:, None] - log_factorial[None, :])
    rows[:, -1] = np.maximum(1.0 - rows[:, :-1].sum(axis=1), 0.0)
    return rows


@lru_cache(maxsize=64)
def _log_factorials(states: int) -> tuple[np.ndarray, np.ndarray]:
    counts = np.arange(states)
    return counts, np.array([math.lgamma(n + 1.0) for n in counts])


def _stationary(transition: np.ndarray) -> np.ndarray:
    """The stationary distribution: pi (P - I) = 0 with one equation replaced by sum(pi) = 1."""
    states = len(transition)
    system = transition.T - np.eye(states)
    system[-1] = 1.0
    target = np.zeros(states)
    target[-1] = 1.0
    pi: np.ndarray = np.maximum(np.linalg.solve(system, target), 0.0)
    return pi


def _normal_sf(x: np.ndarray) -> np.ndarray:
    """P(Z > x) for a standard normal Z, vectorised (Abramowitz and Stegun 7.1.26, error < 1.5e-7)."""
    z = np.abs(x) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    upper = 0.5 * poly * np.exp(-z * z)
    sf: np.ndarray = np.where(x >= 0, upper, 1.0 - upper)
    return sf


_UNIFORM_GRID = (np.arange(5) + 0.5) / 5
_UNIFORM_GRID_FINE = (np.arange(12) + 0.5) / 12
_NORMAL_GRID = np.array([NormalDist().inv_cdf((i + 0.5) / 3) for i in range(3)])


@dataclass(frozen=True)
class DecodeLoad:
    """Steady state of a decode batch at a given rate: the batch at the tail and its step time."""

    batch: float
    tail_batch: float
    tail_tpot_ms: float
    fits_memory: bool


def decode_load(fit: DecodeFit, workload: Workload, rate: float, miss_budget: float) -> DecodeLoad | None:
    """The decode batch of one instance fed `rate` req/s; None when the batch grows without bound."""
    steps, _ = _steps_and_prompts(workload)
    if steps.sum() == 0.0 or rate == 0.0:
        return DecodeLoad(0.0, 0.0, 0.0, True)
    per_request_ms = fit.per_request_ms + fit.per_context_token_ms * _mean_context(workload)
    arrivals_per_ms = rate * float(steps.mean()) / 1000.0  # request-steps entering per ms of step time
    denominator = 1.0 - arrivals_per_ms * per_request_ms
    if denominator <= 0.0:
        return None
    batch = arrivals_per_ms * fit.constant_ms / denominator
    tail_batch = batch + NormalDist().inv_cdf(1.0 - miss_budget) * math.sqrt(batch)
    tail_tpot = fit.constant_ms + per_request_ms * tail_batch
    fits = tail_batch <= fit.max_batch_size and tail_batch * _mean_context(workload) <= fit.kv_cache_tokens
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


@dataclass(frozen=True)
class ColocatedLoad:
    """Steady state of a colocated instance with chunked prefill (see the module docstring)."""

    iteration_ms: float
    batch: float
    tail_tpot_ms: float
    fits_memory: bool
    ttft_miss: float


def colocated_load(prefill: PrefillFit, decode: DecodeFit, workload: Workload, rate: float, ttft_ms: float,
                   miss_budget: float) -> ColocatedLoad | None:
    """The iteration, batch and TTFT misses of one colocated instance fed `rate` req/s; None when unstable."""
    prompts = np.asarray(workload.prompt_tokens, dtype=float)
    steps = np.maximum(np.asarray(workload.output_tokens, dtype=float) - 1.0, 0.0)
    work = _prefill_work_ms(prefill, prompts)
    mean_steps, mean_s = float(steps.mean()), float(work.mean())
    per_request_ms = decode.per_request_ms + decode.per_context_token_ms * _mean_context(workload)
    rate_per_ms = rate / 1000.0
    fixed = max(prefill.constant_ms, decode.constant_ms)
    denominator = 1.0 - rate_per_ms * (mean_steps * per_request_ms + mean_s)
    if denominator <= 0.0:
        return None
    iteration = fixed / denominator
    batch = rate_per_ms * mean_steps * iteration
    chunk = prefill.max_batch_tokens - batch
    if batch + rate_per_ms * iteration * float(prompts.mean()) > prefill.max_batch_tokens:
        return None
    z = NormalDist().inv_cdf(1.0 - miss_budget)
    tail_batch = batch + z * math.sqrt(batch)
    life_ms = max(mean_steps, 1.0) * iteration
    prompt_work_tail = (rate_per_ms * life_ms * mean_s
                        + z * math.sqrt(rate_per_ms * life_ms * float(np.mean(work**2)))) / max(mean_steps, 1.0)
    tail_tpot = fixed + per_request_ms * tail_batch + prompt_work_tail
    fits = tail_batch <= decode.max_batch_size and tail_batch * _mean_context(workload) <= decode.kv_cache_tokens
    ttft_miss = _batched_ttft_miss(work, prompts, rate_per_ms, fixed + per_request_ms * batch, chunk, ttft_ms,
                                   keeps_running=True)
    return ColocatedLoad(iteration, batch, tail_tpot, fits, ttft_miss)


def colocated_capacity(prefill: PrefillFit, decode: DecodeFit, workload: Workload, ttft_ms: float,
                       tpot_ms: float, miss_budget: float) -> float:
    """Highest rate one colocated instance serves meeting both phases' miss budgets."""

    def ok(rate: float) -> bool:
        load = colocated_load(prefill, decode, workload, rate, ttft_ms, miss_budget)
        return (load is not None and load.fits_memory and load.tail_tpot_ms <= tpot_ms
                and load.ttft_miss <= miss_budget)

    return _max_rate(ok, min(_prefill_saturation(prefill, workload), _decode_saturation(decode, workload)))


def _prefill_work_ms(fit: PrefillFit, prompts: np.ndarray) -> np.ndarray:
    """Each prompt's own share of a batch: the batch's constant cost is not in it."""
    return fit.per_token_ms * prompts + fit.per_token_squared_ms * prompts**2


def _mean_context(workload: Workload) -> float:
    steps, prompts = _steps_and_prompts(workload)
    total = steps.sum()
    return float((steps * (prompts + 1.0 + steps / 2.0)).sum() / total) if total else 0.0


def _steps_and_prompts(workload: Workload) -> tuple[np.ndarray, np.ndarray]:
    return (np.maximum(np.asarray(workload.output_tokens, dtype=float) - 1.0, 0.0),
            np.asarray(workload.prompt_tokens, dtype=float))


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
