"""Request-level discrete-event simulator of a PD-disaggregated (or colocated) deployment.

Every request of a trace is routed to a prefill instance (the least queued prompt tokens), prefilled
in a batch of queued prompts up to the profile's maxBatchTokens, then handed to the decode instance
with the least reserved KV cache, where it joins the continuous batch once its prompt+output tokens fit
in the KV cache; each decode step takes `DecodeFit.step_ms(batch, context)`. A colocated instance
holds both queues and runs prefill first, so prefills stall its decode batch (the interference).
KV-cache transfer between prefill and decode is not modelled (DistServe places the phases so that it
is small next to a prefill).

A policy chooses the plan: at the start, and (adaptive) every `interval_s` from the window just seen.
New instances take `startup_s` to become ready; an instance taken out of the plan finishes its work
and then frees its GPUs; an instance starts only when its GPUs are free, so a change never holds more
than `budget` GPUs, even while old and new instances coexist.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from flotilla.serving.planner import Plan, PlanRequest, instance_capacities, plan_from_capacities
from flotilla.serving.profile import DecodeFit, PrefillFit, Profile
from flotilla.serving.replan import ObservedWindow, ReplanPolicy, Replanner
from flotilla.serving.workload import SLO, Workload
from flotilla.sim.serving_trace import Trace

POLICIES = ("adaptive", "static-best", "fixed-1-1", "colocated")


class _Request:
    __slots__ = ("arrival", "prompt", "output", "first_token", "done")

    def __init__(self, arrival: float, prompt: int, output: int) -> None:
        self.arrival, self.prompt, self.output = arrival, prompt, output
        self.first_token = math.nan
        self.done = math.nan


class _Instance:
    def __init__(self, sim: ServingSim, role: str, gpus: int, prefill: PrefillFit | None,
                 decode: DecodeFit | None) -> None:
        self.sim, self.role, self.gpus = sim, role, gpus
        self.prefill, self.decode = prefill, decode
        self.ready = False
        self.draining = False
        self.busy = False
        self.prefill_queue: deque[_Request] = deque()
        self.queued_tokens = 0
        self.decode_queue: deque[_Request] = deque()
        self.queued_reserve = 0
        self.running: list[tuple[int, int, _Request]] = []  # heap of (finishing step, seq, request)
        self.context = 0  # KV-cache tokens in use by the batch
        self.reserved = 0  # KV-cache tokens reserved by the batch (prompt + output each)
        self.steps = 0

    def load(self) -> float:
        if self.role == "prefill":
            return self.queued_tokens
        if self.role == "decode":
            return self.reserved + self.queued_reserve
        return self.queued_tokens + self.reserved + self.queued_reserve

    def idle(self) -> bool:
        return not (self.busy or self.prefill_queue or self.decode_queue or self.running)

    def add_prefill(self, request: _Request, now: float) -> None:
        self.prefill_queue.append(request)
        self.queued_tokens += request.prompt
        self.kick(now)

    def add_decode(self, request: _Request, now: float) -> None:
        self.decode_queue.append(request)
        self.queued_reserve += request.prompt + request.output
        self.kick(now)

    def _fits(self, request: _Request) -> bool:
        assert self.decode is not None
        # An empty batch takes any request, so one longer than the KV cache cannot wait forever.
        return not self.running or (len(self.running) < self.decode.max_batch_size
                                    and self.reserved + request.prompt + request.output <= self.decode.kv_cache_tokens)

    def _join_batch(self, request: _Request) -> None:
        self.reserved += request.prompt + request.output
        self.context += request.prompt + 1
        heapq.heappush(self.running, (self.steps + request.output - 1, id(request), request))

    def kick(self, now: float) -> None:
        if self.busy or not self.ready:
            return
        if self.prefill is not None and self.prefill_queue:
            batch = self._take_prefill_batch()
            if batch:
                self.busy = True
                self.sim.at(now + self.prefill.batch_ms([r.prompt for r in batch]) / 1000.0,
                            self._prefill_done, batch)
                return
        if self.decode is not None:
            while self.decode_queue and self._fits(self.decode_queue[0]):
                request = self.decode_queue.popleft()
                self.queued_reserve -= request.prompt + request.output
                self._join_batch(request)
            if self.running:
                self.busy = True
                self.sim.at(now + self.decode.step_ms(len(self.running), self.context) / 1000.0,
                            self._step_done, None)
                return
        if self.draining and self.idle():
            self.sim.retire_idle(now)

    def _take_prefill_batch(self) -> list[_Request]:
        assert self.prefill is not None
        batch: list[_Request] = []
        tokens = 0
        colocated = self.decode is not None
        while self.prefill_queue:
            request = self.prefill_queue[0]
            if batch and tokens + request.prompt > self.prefill.max_batch_tokens:
                break
            if colocated and request.output > 1 and not self._fits(request):
                break  # no room in this instance's batch: decode first to free memory
            self.prefill_queue.popleft()
            self.queued_tokens -= request.prompt
            tokens += request.prompt
            batch.append(request)
            if colocated and request.output > 1:
                self._join_batch(request)
        return batch

    def _prefill_done(self, now: float, batch: list[_Request]) -> None:
        self.busy = False
        for request in batch:
            request.first_token = now
            if request.output == 1:
                self.sim.finish(request, now)
            elif self.decode is None:
                self.sim.route_decode(request, now)
        self.kick(now)

    def _step_done(self, now: float, _: None) -> None:
        self.busy = False
        self.steps += 1
        self.context += len(self.running)
        while self.running and self.running[0][0] <= self.steps:
            _, _, request = heapq.heappop(self.running)
            self.context -= request.prompt + request.output
            self.reserved -= request.prompt + request.output
            self.sim.finish(request, now)
        self.kick(now)


@dataclass(frozen=True)
class SimResult:
    policy: str
    requests: int
    duration_s: float
    attainment: float  # fraction of all requests within both TTFT and TPOT
    goodput: float  # req/s within the SLO, counting only windows that met the attainment target
    mean_gpus: float  # time-averaged GPUs held
    max_gpus: int  # most GPUs held at any instant
    goodput_per_gpu: float
    ttft_p50_ms: float
    ttft_p90_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p90_ms: float
    tpot_p99_ms: float
    plan_changes: int

    def to_dict(self) -> dict[str, float | int | str]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


class Policy(Protocol):
    name: str

    def initial_plan(self) -> Plan: ...

    def on_window(self, window: ObservedWindow) -> Plan | None: ...


class ServingSim:
    def __init__(self, trace: Trace, profile: Profile, slo: SLO, budget: int, policy: Policy,
                 interval_s: float = 30.0, startup_s: float = 30.0) -> None:
        self.trace, self.profile, self.slo, self.budget = trace, profile, slo, budget
        self.policy, self.interval_s, self.startup_s = policy, interval_s, startup_s
        self._events: list[tuple[float, int, Callable, object]] = []
        self._seq = 0
        self.instances: list[_Instance] = []
        self._pending: deque[tuple[str, int]] = deque()  # instances waiting for free GPUs
        self._backlog: dict[str, deque[_Request]] = {"prefill": deque(), "decode": deque()}
        self._gpus = 0
        self._gpu_seconds = 0.0
        self._max_gpus = 0
        self._last_change = 0.0
        self._finished: list[_Request] = []  # completed in the current observation window
        self._window_arrivals: list[_Request] = []
        self._startup_s = 0.0  # the first plan's instances are up at time 0
        self.plan_changes = 0

    # --- event loop -------------------------------------------------------------------------
    def at(self, time: float, callback: Callable, arg: object) -> None:
        self._seq += 1
        heapq.heappush(self._events, (time, self._seq, callback, arg))

    def run(self) -> SimResult:
        requests = [_Request(float(t), int(p), int(o)) for t, p, o in
                    zip(self.trace.arrival_s, self.trace.prompt_tokens, self.trace.output_tokens)]
        self._apply(self.policy.initial_plan(), 0.0)
        self._startup_s = self.startup_s
        for request in requests:
            self.at(request.arrival, self._arrive, request)
        end_of_arrivals = requests[-1].arrival
        tick = self.interval_s
        while tick <= end_of_arrivals:
            self.at(tick, self._window, None)
            tick += self.interval_s
        now = 0.0
        while self._events:
            now, _, callback, arg = heapq.heappop(self._events)
            callback(now, arg)
        self._account(now)
        return self._result(requests, now)

    # --- routing ----------------------------------------------------------------------------
    def _arrive(self, now: float, request: _Request) -> None:
        self._window_arrivals.append(request)
        target = self._pick(lambda i: i.prefill is not None)
        if target is None:
            self._backlog["prefill"].append(request)
        else:
            target.add_prefill(request, now)

    def route_decode(self, request: _Request, now: float) -> None:
        target = self._pick(lambda i: i.decode is not None)
        if target is None:
            self._backlog["decode"].append(request)
        else:
            target.add_decode(request, now)

    def _pick(self, accepts: Callable[[_Instance], bool]) -> _Instance | None:
        ready = [i for i in self.instances if i.ready and accepts(i)]
        serving = [i for i in ready if not i.draining] or ready
        return min(serving, key=_Instance.load) if serving else None

    def finish(self, request: _Request, now: float) -> None:
        request.done = now
        self._finished.append(request)

    # --- plans and instances ----------------------------------------------------------------
    def _apply(self, new: Plan, now: float) -> None:
        wanted = {"prefill": (new.prefill_replicas, new.prefill_gpus_per_instance),
                  "decode": (new.decode_replicas, new.decode_gpus_per_instance),
                  "colocated": (new.colocated_replicas, new.colocated_gpus_per_instance)}
        self._pending = deque(p for p in self._pending if wanted[p[0]][1] == p[1])
        for role, (count, gpus) in wanted.items():
            live = [i for i in self.instances if i.role == role and not i.draining]
            pending = sum(1 for p in self._pending if p[0] == role)
            for instance in live:
                if instance.gpus != gpus:
                    self._drain(instance, now)
            live = [i for i in live if i.gpus == gpus]
            surplus = len(live) + pending - count
            while surplus > 0 and pending > 0:
                self._pending.remove((role, gpus))
                pending -= 1
                surplus -= 1
            for instance in sorted(live, key=_Instance.load)[:max(surplus, 0)]:
                self._drain(instance, now)
            for _ in range(-surplus):
                self._pending.append((role, gpus))
        self._start_pending(now)
        self.retire_idle(now)

    def _drain(self, instance: _Instance, now: float) -> None:
        instance.draining = True
        if not instance.ready:
            self._stop(instance, now)

    def retire_idle(self, now: float) -> None:
        """Stop draining instances that are idle, once a ready instance does their work, or at once
        when the GPUs they hold are what a pending instance waits for (the budget comes first)."""
        for instance in [i for i in self.instances if i.draining and i.idle()]:
            replaced = any(i.ready and not i.draining and (i.prefill is not None or instance.prefill is None)
                           and (i.decode is not None or instance.decode is None) for i in self.instances)
            blocked = bool(self._pending) and self._gpus + self._pending[0][1] > self.budget
            if replaced or blocked:
                self._stop(instance, now)

    def _stop(self, instance: _Instance, now: float) -> None:
        self.instances.remove(instance)
        self._set_gpus(now, self._gpus - instance.gpus)
        self._start_pending(now)

    def _start_pending(self, now: float) -> None:
        while self._pending and self._gpus + self._pending[0][1] <= self.budget:
            role, gpus = self._pending.popleft()
            instance = _Instance(self, role, gpus,
                                 self.profile.prefill_fit(gpus) if role != "decode" else None,
                                 self.profile.decode_fit(gpus) if role != "prefill" else None)
            self.instances.append(instance)
            self._set_gpus(now, self._gpus + gpus)
            self.at(now + self._startup_s, self._ready, instance)

    def _ready(self, now: float, instance: _Instance) -> None:
        if instance not in self.instances:
            return
        instance.ready = True
        for kind, accepts in (("prefill", instance.prefill), ("decode", instance.decode)):
            backlog = self._backlog[kind]
            while accepts is not None and backlog:
                request = backlog.popleft()
                (instance.add_prefill if kind == "prefill" else instance.add_decode)(request, now)
        self.retire_idle(now)

    def _set_gpus(self, now: float, gpus: int) -> None:
        self._account(now)
        self._gpus = gpus
        self._max_gpus = max(self._max_gpus, gpus)

    def _account(self, now: float) -> None:
        self._gpu_seconds += self._gpus * (now - self._last_change)
        self._last_change = now

    # --- observation ------------------------------------------------------------------------
    def _window(self, now: float, _: None) -> None:
        arrived = self._window_arrivals
        self._window_arrivals = []
        done = self._finished
        self._finished = []
        ttft = np.array([r.first_token - r.arrival for r in done]) * 1000.0
        tpot = np.array([_tpot_s(r) for r in done]) * 1000.0
        met = int(np.sum((ttft <= self.slo.ttft_ms) & (tpot <= self.slo.tpot_ms))) if done else 0
        prompts = np.array([r.prompt for r in arrived] or [1])
        outputs = np.array([r.output for r in arrived] or [1])
        window = ObservedWindow(
            time=now, requests_per_second=len(arrived) / self.interval_s,
            mean_prompt_tokens=float(prompts.mean()), mean_output_tokens=float(outputs.mean()),
            p90_prompt_tokens=float(np.percentile(prompts, 90)), p90_output_tokens=float(np.percentile(outputs, 90)),
            ttft_p90_ms=float(np.percentile(ttft, 90)) if done else None,
            tpot_p90_ms=float(np.percentile(tpot, 90)) if done else None,
            attainment=met / len(done) if done else None, requests=len(done))
        new = self.policy.on_window(window)
        if new is not None:
            self.plan_changes += 1
            self._apply(new, now)

    def _result(self, requests: list[_Request], end: float) -> SimResult:
        ttft = np.array([r.first_token - r.arrival for r in requests]) * 1000.0
        tpot = np.array([_tpot_s(r) for r in requests]) * 1000.0
        within = (ttft <= self.slo.ttft_ms) & (tpot <= self.slo.tpot_ms)
        met = int(within.sum())
        duration = max(end, 1e-9)
        mean_gpus = self._gpu_seconds / duration
        # Goodput counts the requests of the windows (by arrival) that met the attainment target.
        window_of = (np.array([r.arrival for r in requests]) // self.interval_s).astype(int)
        per_window_met = np.bincount(window_of, weights=within)
        per_window_all = np.bincount(window_of)
        good_windows = per_window_met >= self.slo.attainment * per_window_all
        goodput = float(per_window_met[good_windows].sum()) / duration
        pct = lambda a, q: float(np.percentile(a, q))  # noqa: E731
        return SimResult(self.policy.name, len(requests), duration, met / len(requests), goodput, mean_gpus,
                         self._max_gpus, goodput / mean_gpus if mean_gpus else 0.0,
                         pct(ttft, 50), pct(ttft, 90), pct(ttft, 99), pct(tpot, 50), pct(tpot, 90), pct(tpot, 99),
                         self.plan_changes)


def _tpot_s(request: _Request) -> float:
    return (request.done - request.first_token) / (request.output - 1) if request.output > 1 else 0.0


# --- policies ---------------------------------------------------------------------------------
def workload_statistics(trace: Trace, mask: np.ndarray | None = None, seconds: float | None = None) -> Workload:
    """What a controller knows of (part of) a trace: its rate, mean and 90th-percentile lengths."""
    prompts = trace.prompt_tokens if mask is None else trace.prompt_tokens[mask]
    outputs = trace.output_tokens if mask is None else trace.output_tokens[mask]
    seconds = max(trace.duration_s, 1e-9) if seconds is None else seconds
    return Workload.from_means(len(prompts) / seconds, float(prompts.mean()), float(outputs.mean()),
                               float(np.percentile(prompts, 90)), float(np.percentile(outputs, 90)))


@dataclass
class StaticPolicy:
    name: str
    plan: Plan

    def initial_plan(self) -> Plan:
        return self.plan

    def on_window(self, window: ObservedWindow) -> Plan | None:
        return None


class AdaptivePolicy:
    """The Replanner, started from a plan for the rate and length statistics of the trace's first
    interval (what `spec.workload` would say)."""

    name = "adaptive"

    def __init__(self, first: Workload, slo: SLO, profile: Profile, budget: int) -> None:
        self.replanner = Replanner.start(PlanRequest(first, slo, profile, min_gpus=1, max_gpus=budget))

    def initial_plan(self) -> Plan:
        return self.replanner.current

    def on_window(self, window: ObservedWindow) -> Plan | None:
        return self.replanner.observe(window).plan


def make_policy(name: str, trace: Trace, slo: SLO, profile: Profile, budget: int, interval_s: float = 30.0) -> Policy:
    """Build one of POLICIES for a trace and a GPU budget. fixed-1-1 and colocated hold the whole
    budget; static-best holds what the planner chose for the average load."""
    average = workload_statistics(trace)
    if name == "adaptive":
        return AdaptivePolicy(workload_statistics(trace, trace.arrival_s < interval_s, interval_s),
                              slo, profile, budget)
    caps = instance_capacities(average, slo, profile)
    if name == "static-best":
        # The planner's plan for the trace's average load (with the adaptive policy's headroom), kept.
        rate = average.requests_per_second * (1 + ReplanPolicy().headroom)
        return StaticPolicy(name, plan_from_capacities(caps, rate, 1, budget))
    if name == "fixed-1-1":
        gp = max(caps.prefill, key=lambda g: caps.prefill[g] / g)
        gd = max(caps.decode, key=lambda g: caps.decode[g] / g)
        pairs = max(budget // (gp + gd), 1)
        return StaticPolicy(name, Plan("disaggregated", pairs, gp, pairs, gd, 0, 0,
                                       min(pairs * caps.prefill[gp], pairs * caps.decode[gd]),
                                       average.requests_per_second, False, "fixed 1:1 baseline"))
    if name == "colocated":
        if not caps.colocated:
            raise ValueError(f"profile {profile.name!r}: no GPU count has both prefill and decode fits")
        g = max(caps.colocated, key=lambda g: caps.colocated[g] / g)
        n = max(budget // g, 1)
        return StaticPolicy(name, Plan("colocated", 0, 0, 0, 0, n, g, n * caps.colocated[g],
                                       average.requests_per_second, False, "colocated baseline"))
    raise ValueError(f"policy: unknown {name!r}; choose from {', '.join(POLICIES)}")


def simulate(trace: Trace, profile: Profile, slo: SLO, budget: int, policy: str,
             interval_s: float = 30.0, startup_s: float = 30.0) -> SimResult:
    if len(trace) == 0:
        raise ValueError("trace: no requests")
    return ServingSim(trace, profile, slo, budget, make_policy(policy, trace, slo, profile, budget, interval_s),
                      interval_s, startup_s).run()
