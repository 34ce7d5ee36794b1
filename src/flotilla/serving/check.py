"""The check before a promise: a fast discrete-event simulation of a whole layout's engines.

The planner's analytical model (flotilla.serving.latency, flotilla.serving.layouts) ranks and prunes
layouts; before a plan is offered its claimed rate is checked here, on Poisson arrivals at that rate
with request lengths drawn from the observed sample, through the router the deployment really uses,
counting a request only when it meets both TTFT and TPOT (joint attainment).

This simulation is the planner's own; it is not a judge of the planner. The judges are elsewhere and
import none of this: DistServe's simulator (bench/serving_distserve.py --sweep) and the engine double
(flotilla.testing.engine, driven by flotilla.sim.serving).

Engines (priced by the profile's fits, limited by its engine limits):

* prefill instance: FCFS; a batch takes whole prompts from the front while they fit maxBatchTokens
  (a prompt longer than that runs alone); TTFT ends when its batch ends.
* decode instance: continuous batching. At every iteration it admits waiting requests in order while
  the batch stays within maxBatchSize and its context tokens within the KV cache (kvCacheTokens: the
  memory a request's pages take; a request not admitted waits). A step costs
  constantMs + perRequestMs * batch + perContextTokenMs * context. One iteration runs at most the
  decode batch-token cap (`maxBatchTokens` of the decode entry; kvCacheTokens when absent): when the
  admitted requests hold more context than that, they take turns, and only the share cap/context of
  the batch runs in an iteration (taken as a fluid: every request makes that fraction of a step), as
  an engine that rotates its batch (DistServe's) or preempts (vLLM's, when the KV cache overflows) does.
  (Admitting only up to the per-iteration cap, as this check first did, starves the requests waiting
  behind it: a short request that waits seconds misses TPOT, which no engine with that cap does.)
  TPOT counts from the hand-off (queueing at decode included) to the last token, over output-1 steps.
* colocated instance: with chunked prefill (profile `chunkedPrefill`, vLLM's default) each iteration
  runs the decode batch and as many waiting prompt tokens as maxBatchTokens leaves; without it,
  waiting prompts run first as a prefill batch and decode pauses meanwhile.

Router (the deployed one, and what the docs state): a request goes to the prefill (or colocated)
instance with the fewest requests waiting or in prefill, a prefill-done request to the decode instance
with the fewest waiting (not admitted, or admitted beyond what its next iteration runs); ties are broken
at random. That is the Gateway API Inference Extension endpoint picker scoring by queue depth
(vllm:num_requests_waiting) with its max-score picker, which shuffles tied endpoints. `router="queue-first"`
breaks ties to the first instance instead: DistServe's scheduler (the judge of bench/serving_distserve.py
--sweep), which at low load sends most requests to the first instance. `router="queue+kv"` breaks ties
by KV-cache use (the picker's kv-cache scorer added).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from flotilla.serving.profile import DecodeFit, PrefillFit, Profile
from flotilla.serving.workload import SLO, Workload

Router = Literal["queue", "queue-first", "queue+kv"]
ROUTERS: tuple[Router, ...] = ("queue", "queue-first", "queue+kv")

CHECK_REQUESTS = 1600  # requests per check; the first WARMUP_SHARE are not counted
# A plan is promised only after a long check too: colocated engines behind the queue-depth router are
# metastable near their limit (the first instance's decode batch grows until TPOT collapses), which a
# short run does not reach; so the last third of a long run must meet the target as well.
CONFIRM_REQUESTS = 6000
WARMUP_SHARE = 0.1
# The check passes a layout only with this much attainment above the target: the sampling error of a
# check's attainment (about sqrt(0.09 / 1440) = 0.008 at 0.9) is not a margin a promise may spend.
CHECK_MARGIN = 0.012
# One confirming sample is enough only when it is clearly above the target: this far above it, and its
# last third not below the whole run (a queue at equilibrium shows no trend; a falling last third is the
# sign of a metastable queue on its way to collapse). On the planner's own samples (ten 6,000-request
# confirming runs of each sweep pick, docs/serving.md "Fourth pass") a layout that does not collapse
# spreads up to 0.03 below its mean and its last third falls at most 0.003 below its whole; a layout
# that collapses on some samples passes others either near the target or with a falling last third.
# Anything else gets a second confirming run on an independent sample, and both must pass.
CLEAR_MARGIN = 0.03
STEP_RUNS = True  # decode steps up to the next finish priced as one event (False: one by one; same results)


@dataclass(frozen=True)
class Layout:
    """Instances by role: (count, GPUs per instance)."""

    prefill: tuple[int, int] = (0, 0)
    decode: tuple[int, int] = (0, 0)
    colocated: tuple[int, int] = (0, 0)

    def __post_init__(self) -> None:
        disaggregated = self.prefill[0] > 0 or self.decode[0] > 0
        if disaggregated and (self.prefill[0] < 1 or self.decode[0] < 1):
            raise ValueError("layout: a disaggregated layout needs at least one prefill and one decode instance")
        if disaggregated == (self.colocated[0] > 0):
            raise ValueError("layout: either prefill and decode pools or colocated instances")

    @property
    def gpus(self) -> int:
        return sum(n * g for n, g in (self.prefill, self.decode, self.colocated))

    @property
    def mode(self) -> str:
        return "colocated" if self.colocated[0] else "disaggregated"

    def describe(self) -> str:
        if self.colocated[0]:
            return f"{self.colocated[0]}x{self.colocated[1]}-GPU colocated"
        return (f"{self.prefill[0]}x{self.prefill[1]}-GPU prefill + "
                f"{self.decode[0]}x{self.decode[1]}-GPU decode")


@dataclass(frozen=True)
class CheckResult:
    rate: float
    attainment: float  # joint: met both TTFT and TPOT
    ttft_met: float
    tpot_met: float
    requests: int
    last_third: float  # joint attainment of the last third of the requests: a queue still building shows here

    stopped_early: bool = False  # the misses already decided that it fails; the shares are of what was decided

    def meets(self, slo: SLO, margin: float = CHECK_MARGIN) -> bool:
        return (not self.stopped_early and self.attainment >= slo.attainment + margin
                and self.last_third >= slo.attainment)

    def clearly_meets(self, slo: SLO) -> bool:
        """Passes with room to spare and no sign of a queue still building: one sample is enough."""
        return (self.meets(slo) and self.attainment >= slo.attainment + CLEAR_MARGIN
                and self.last_third >= self.attainment)


def check(layout: Layout, profile: Profile, workload: Workload, rate: float, slo: SLO,
          requests: int = CHECK_REQUESTS, seed: int = 0, router: Router = "queue",
          pass_at: float | None = None, last_third_at: float | None = None) -> CheckResult:
    """Simulate `layout` fed Poisson arrivals at `rate` req/s with lengths drawn from the workload's
    sample (seeded: the same seed gives the same requests, scaled in time with the rate).

    `pass_at`: the joint attainment a pass needs; the simulation stops as soon as the counted requests'
    misses already rule it out (a layout far short of the rate costs a fraction of a full run).
    `last_third_at` (with `pass_at`): the attainment the last third needs as well (CheckResult.meets asks
    for the SLO's own): misses there past that share stop the run too."""
    if rate <= 0:
        raise ValueError(f"rate: must be > 0, got {rate}")
    if router not in ROUTERS:
        raise ValueError(f"router: must be one of {', '.join(ROUTERS)}, got {router!r}")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(workload.prompt_tokens), size=requests)
    prompts = [int(workload.prompt_tokens[i]) for i in picks]
    outputs = [int(workload.output_tokens[i]) for i in picks]
    arrivals = (np.cumsum(rng.exponential(1.0, size=requests)) / rate * 1000.0).tolist()  # ms
    first = int(requests * WARMUP_SHARE)
    sim = _Sim(layout, profile, prompts, outputs, router, seed)
    if pass_at is not None:
        third = max((requests - first) // 3, 1)
        allowed_there = third if last_third_at is None else math.floor((1.0 - last_third_at) * third + 1e-9)
        sim.watch(first, slo, int((1.0 - pass_at) * (requests - first)), requests - third, allowed_there)
    ttft, tpot = sim.run(arrivals)
    if sim.stopped:
        n = requests - first
        return CheckResult(rate, 1.0 - sim.joint_misses / n, 1.0 - sim.ttft_misses / n, 1.0 - sim.tpot_misses / n,
                           n, 1.0 - sim.joint_misses / n, stopped_early=True)
    counted = slice(first, requests)
    ttft_ok = np.asarray(ttft[counted]) <= slo.ttft_ms
    tpot_ok = np.asarray(tpot[counted]) <= slo.tpot_ms
    joint = ttft_ok & tpot_ok
    return CheckResult(rate, float(np.mean(joint)), float(np.mean(ttft_ok)), float(np.mean(tpot_ok)),
                       len(ttft_ok), float(np.mean(joint[-max(len(joint) // 3, 1):])))


class _Sim:
    def __init__(self, layout: Layout, profile: Profile, prompts: list[int], outputs: list[int],
                 router: Router, seed: int = 0) -> None:
        self.prompts, self.outputs, self.router = prompts, outputs, router
        self.ties = random.Random(seed)
        n = len(prompts)
        self.arrival = [0.0] * n
        self.handoff = [0.0] * n
        self.ttft = [math.inf] * n
        self.tpot = [math.inf] * n
        self.events: list[tuple[float, int, int, int]] = []  # (time, seq, instance, version)
        self.seq = 0
        self.front: list[_Engine] = []  # where new requests go
        self.back: list[_Decode] = []  # where prefill-done requests go (disaggregated)
        chunked = profile.chunked_prefill
        if layout.colocated[0]:
            g = layout.colocated[1]
            self.front = [_Colocated(self, len(self.front) + i, profile.prefill_fit(g), profile.decode_fit(g),
                                     chunked) for i in range(layout.colocated[0])]
        else:
            self.front = [_Prefill(self, i, profile.prefill_fit(layout.prefill[1])) for i in range(layout.prefill[0])]
            self.back = [_Decode(self, len(self.front) + i, profile.decode_fit(layout.decode[1]))
                         for i in range(layout.decode[0])]
        self.engines: list[_Engine] = [*self.front, *self.back]
        # what each engine reports waiting, kept as it changes (after an arrival is enqueued, after an
        # iteration ends, after a hand-off) so that a pick reads one list instead of asking every instance
        self.front_loads = [0] * len(self.front)
        self.back_loads = [0] * len(self.back)
        for pool, loads in ((self.front, self.front_loads), (self.back, self.back_loads)):
            for slot, engine in enumerate(pool):
                engine.loads, engine.slot = loads, slot
                engine.loads[slot] = engine.waiting_load()
        self.watched, self.allowed = n, n  # requests from `watched` on are counted; stop past `allowed` misses
        self.last_third, self.allowed_there, self.misses_there = n, n, 0  # and past `allowed_there` from `last_third`
        self.ttft_ms = self.tpot_ms = math.inf
        self.ttft_misses = self.tpot_misses = self.joint_misses = 0
        self.stopped = False

    def watch(self, first: int, slo: SLO, allowed_misses: int, last_third: int, allowed_there: int) -> None:
        self.watched, self.allowed = first, allowed_misses
        self.last_third, self.allowed_there = last_third, allowed_there
        self.ttft_ms, self.tpot_ms = slo.ttft_ms, slo.tpot_ms

    def at(self, time: float, engine: _Engine) -> None:
        self.seq += 1
        engine.version += 1
        heapq.heappush(self.events, (time, self.seq, engine.index, engine.version))

    def run(self, arrivals: list[float]) -> tuple[list[float], list[float]]:
        i, n = 0, len(arrivals)
        events = self.events
        while (i < n or events) and not self.stopped:
            if i < n and (not events or arrivals[i] <= events[0][0]):
                now = arrivals[i]
                self.arrival[i] = now
                self._route(self.front, self.front_loads, i, now)
                i += 1
                continue
            now, _, index, version = heapq.heappop(events)
            engine = self.engines[index]
            if version == engine.version:
                engine.iteration_done(now)
                engine.loads[engine.slot] = engine.waiting_load()
        return self.ttft, self.tpot

    def _route(self, engines: Sequence[_Engine], loads: list[int], request: int, now: float) -> None:
        engine = self._pick(engines, loads)
        engine.enqueue(request, now)
        loads[engine.slot] = engine.waiting_load()

    def _pick(self, engines: Sequence[_Engine], loads: list[int]) -> _Engine:
        """`loads`: the pool's waiting loads, as kept by run() and to_decode()."""
        if len(engines) == 1:
            return engines[0]
        if self.router == "queue-first":
            return engines[loads.index(min(loads))]
        if self.router == "queue+kv":
            return min(engines, key=lambda e: (loads[e.slot], e.kv_use()))
        least = min(loads)
        tied = loads.count(least)
        at = loads.index(least)
        if tied > 1:  # the k-th of the tied, k at random (the same draw as picking from a list of them)
            for _ in range(self.ties.randrange(tied)):
                at = loads.index(least, at + 1)
        return engines[at]

    def first_token(self, request: int, now: float) -> None:
        self.ttft[request] = now - self.arrival[request]
        self.handoff[request] = now
        if self.outputs[request] <= 1:
            self.tpot[request] = 0.0
        if request >= self.watched and self.ttft[request] > self.ttft_ms:
            self.ttft_misses += 1
            self._missed(request)

    def to_decode(self, request: int, now: float) -> None:
        if self.outputs[request] > 1:
            self._route(self.back, self.back_loads, request, now)

    def finished(self, request: int, now: float) -> None:
        self.tpot[request] = (now - self.handoff[request]) / (self.outputs[request] - 1)
        if request >= self.watched and self.tpot[request] > self.tpot_ms:
            self.tpot_misses += 1
            if self.ttft[request] <= self.ttft_ms:
                self._missed(request)

    def _missed(self, request: int) -> None:
        self.joint_misses += 1
        if request >= self.last_third:
            self.misses_there += 1
        if self.joint_misses > self.allowed or self.misses_there > self.allowed_there:
            self.stopped = True


class _Engine:
    index: int
    version: int = 0
    loads: list[int]  # its pool's waiting loads (the sim's), and its place there
    slot: int

    def enqueue(self, request: int, now: float) -> None:
        raise NotImplementedError

    def iteration_done(self, now: float) -> None:
        raise NotImplementedError

    def waiting_load(self) -> int:
        raise NotImplementedError

    def kv_use(self) -> float:
        return 0.0


class _Prefill(_Engine):
    def __init__(self, sim: _Sim, index: int, fit: PrefillFit) -> None:
        self.sim, self.index, self.fit = sim, index, fit
        self.queue: deque[int] = deque()
        self.batch: list[int] = []

    def waiting_load(self) -> int:
        return len(self.queue) + len(self.batch)

    def enqueue(self, request: int, now: float) -> None:
        self.queue.append(request)
        if not self.batch:
            self._start(now)

    def _start(self, now: float) -> None:
        batch = _take_prompts(self.queue, self.sim.prompts, self.fit.max_batch_tokens)
        self.batch = batch
        if batch:
            self.sim.at(now + _prefill_ms(self.fit, [self.sim.prompts[r] for r in batch]), self)

    def iteration_done(self, now: float) -> None:
        done, self.batch = self.batch, []
        for r in done:
            self.sim.first_token(r, now)
            self.sim.to_decode(r, now)
        self._start(now)


class _Decode(_Engine):
    """Continuous batching; `steps` counts the iterations each running request has made (fractional
    when the batch-token cap lets only part of the batch run)."""

    def __init__(self, sim: _Sim, index: int, fit: DecodeFit) -> None:
        self.sim, self.index, self.fit = sim, index, fit
        self.cap = float(fit.batch_token_cap)  # context tokens one iteration runs
        self.small, self.large_from, self.large = fit.pieces()  # looked up once: steps are priced in the hot path
        self.kv = float(fit.kv_cache_tokens)  # context tokens the admitted requests may hold
        self.waiting: deque[int] = deque()
        self.running: list[tuple[float, int]] = []  # heap of (step at which it finishes, request)
        self.context = 0.0  # KV tokens of the running requests
        self.steps = 0.0
        self.share = 1.0  # part of the batch the iteration in progress runs
        self.busy = False
        self.pending = 1  # decode steps the event in flight stands for
        # a run of steps up to the next finish taken as one event while nothing changes the batch:
        # (start ms, first step ms, ms each step adds as the context grows, steps)
        self.jump: tuple[float, float, float, int] | None = None

    def waiting_load(self) -> int:
        # what the engine reports waiting: those not admitted, and the admitted that the next iteration
        # does not run (beyond the per-iteration cap: DistServe leaves them in its queue, vLLM preempts them)
        if self.context > self.cap:
            return len(self.waiting) + int(len(self.running) * (1.0 - self.cap / self.context))
        return len(self.waiting)

    def kv_use(self) -> float:
        return self.context / self.kv

    def enqueue(self, request: int, now: float) -> None:
        self.waiting.append(request)
        if not self.busy:
            self._start(now)
        elif self.jump:
            self._interrupt(now)

    def _admit(self) -> None:
        prompts, outputs, fit = self.sim.prompts, self.sim.outputs, self.fit
        while self.waiting and len(self.running) < fit.max_batch_size:
            r = self.waiting[0]
            need = prompts[r] + 1
            if self.running and self.context + need > self.kv:
                break
            self.waiting.popleft()
            self.context += need
            heapq.heappush(self.running, (self.steps + outputs[r] - 1, r))

    def _step_ms(self, extra_fixed_ms: float = 0.0, extra_ms: float = 0.0) -> float:
        context = self.context
        share = self.share = min(1.0, self.cap / context) if context > 0 else 1.0
        batch = share * len(self.running)  # the requests this iteration runs
        constant, per_request, per_token = self.large if batch >= self.large_from else self.small
        step = constant + per_request * batch + per_token * (share * context)  # DecodeFit.step_ms
        return max(constant, extra_fixed_ms) - constant + extra_ms + step

    def _start(self, now: float) -> None:
        if self.waiting:
            self._admit()
        self.busy = bool(self.running)
        if self.busy:
            self.sim.at(now + self._decode_run_ms(now), self)

    def _decode_run_ms(self, now: float) -> float:
        """How long the decode iterations up to the next finish take, run as one event: the batch does not
        change before then unless a request arrives (which ends the run at the step in progress), so the
        steps are priced in closed form (each adds the batch's growth in context), not one by one."""
        first = self._step_ms()
        self.pending, self.jump = 1, None
        batch = len(self.running)
        if self.share < 1.0 or batch == 0 or not STEP_RUNS:
            return first
        steps = math.ceil(self.running[0][0] - self.steps - 1e-9)
        steps = min(steps, int((self.cap - self.context) // batch) + 1)  # every step within the cap
        if steps <= 1:
            return first
        constant, per_request, per_token = self.large if batch >= self.large_from else self.small
        base = constant + per_request * batch
        growth = (base + per_token * (self.context + batch)) - (base + per_token * self.context)
        self.pending, self.jump = steps, (now, first, growth, steps)
        return steps * first + growth * steps * (steps - 1) / 2

    def _interrupt(self, now: float) -> None:
        """A request arrived during a run of steps: the run ends with the step in progress."""
        assert self.jump is not None
        start, first, growth, steps = self.jump

        def took(k: int) -> float:
            return k * first + growth * k * (k - 1) / 2

        elapsed = now - start
        half = first - growth / 2
        done = int(elapsed / first) if growth <= 0 else int((-half + math.sqrt(half * half + 2 * growth * elapsed)) / growth)
        done = max(0, min(done, steps - 1))
        while done + 1 < steps and took(done + 1) <= elapsed:
            done += 1
        while done > 0 and took(done) > elapsed:
            done -= 1
        self.pending, self.jump = done + 1, None
        self.sim.at(start + took(done + 1), self)

    def _advance(self, now: float) -> None:
        """The iterations of the event have ended: every request made `share` of a step in each."""
        self.steps += self.share * self.pending
        self.context += self.share * len(self.running) * self.pending
        prompts, outputs = self.sim.prompts, self.sim.outputs
        while self.running and self.running[0][0] <= self.steps + 1e-9:
            _, r = heapq.heappop(self.running)
            self.context -= prompts[r] + outputs[r]
            self.sim.finished(r, now)
        if not self.running:
            self.context = 0.0

    def iteration_done(self, now: float) -> None:
        self._advance(now)
        self._start(now)


class _Colocated(_Decode):
    def __init__(self, sim: _Sim, index: int, prefill: PrefillFit, decode: DecodeFit, chunked: bool) -> None:
        super().__init__(sim, index, decode)
        self.prefill, self.chunked = prefill, chunked
        self.prompts: deque[int] = deque()
        self.done_tokens: dict[int, int] = {}  # chunked: prompt tokens already run, for the prompt at the front
        self.in_prefill: list[tuple[int, int, int]] = []  # (request, first token, last token) run this iteration
        self.decoding = False  # the iteration in progress advances the decode batch

    def waiting_load(self) -> int:
        return len(self.prompts)  # those in prefill included: they leave when their prefill ends

    def enqueue(self, request: int, now: float) -> None:
        self.prompts.append(request)
        if not self.busy:
            self._begin(now)
        elif self.jump:
            self._interrupt(now)

    def _begin(self, now: float) -> None:
        self.pending, self.jump = 1, None
        if self.waiting:
            self._admit()
        prompts = self.sim.prompts
        fixed, work = 0.0, 0.0
        self.in_prefill = []
        if self.chunked:
            budget = self.prefill.max_batch_tokens - len(self.running)
            per_token, per_square = self.prefill.per_token_ms, self.prefill.per_token_squared_ms
            done_tokens = self.done_tokens
            for r in self.prompts:
                if budget <= 0:
                    break
                start = done_tokens.get(r, 0) if done_tokens else 0
                end = min(prompts[r], start + budget)
                self.in_prefill.append((r, start, end))
                work += per_token * (end - start) + per_square * (end * end - start * start)
                budget -= end - start
            if self.in_prefill:
                fixed = self.prefill.constant_ms
            self.decoding = bool(self.running)
            if not (self.in_prefill or self.running):
                self.busy = False
                return
            if not self.in_prefill:
                duration = self._decode_run_ms(now)
            else:
                duration = self._step_ms(fixed, work) if self.running else fixed + work
        elif self.prompts:  # prefill first, decode waits
            batch = _take_prompts(self.prompts, prompts, self.prefill.max_batch_tokens, keep=True)
            self.in_prefill = [(r, 0, prompts[r]) for r in batch]
            self.decoding = False
            duration = _prefill_ms(self.prefill, [prompts[r] for r in batch])
        elif self.running:
            self.decoding = True
            duration = self._decode_run_ms(now)
        else:
            self.busy = False
            return
        self.busy = True
        self.sim.at(now + duration, self)

    def iteration_done(self, now: float) -> None:
        if self.decoding:
            self._advance(now)
        for r, _, end in self.in_prefill:
            if end >= self.sim.prompts[r]:
                self.prompts.remove(r)
                self.done_tokens.pop(r, None)
                self.sim.first_token(r, now)
                if self.sim.outputs[r] > 1:
                    self.waiting.append(r)
            else:
                self.done_tokens[r] = end
        self.in_prefill = []
        self._begin(now)


def _take_prompts(queue: deque[int], prompts: list[int], max_tokens: int, keep: bool = False) -> list[int]:
    """Whole prompts from the front while they fit `max_tokens` (the first one always). `keep`: leave
    them in the queue (the caller removes each when its prefill ends)."""
    batch: list[int] = []
    tokens = 0
    for r in queue:
        if batch and tokens + prompts[r] > max_tokens:
            break
        batch.append(r)
        tokens += prompts[r]
    if not keep:
        for _ in batch:
            queue.popleft()
    return batch


def _prefill_ms(fit: PrefillFit, lengths: list[int]) -> float:
    return fit.batch_ms(lengths)
