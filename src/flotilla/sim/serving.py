"""Request-level discrete-event simulator of a PD-disaggregated (or colocated) deployment.

Every instance is an engine double (flotilla.testing.engine): iteration-level continuous batching
under the profile's maxBatchTokens budget, chunked prefill on colocated instances, a KV cache in
blocks with recompute preemption, per-iteration times from the profile's published fits (for
opt-13b-a100 both of DistServe's decode pieces). A request goes to the instance holding the fewest
prompt+output tokens that takes prompts; a prefill instance hands it, after the KV transfer, to the
least loaded decode instance. Latencies come from the engines' scheduling, never from the planner's
latency model, so the simulator judges the planner's plans rather than restating them.

A policy chooses the plan: at the start, and (adaptive) from the windows a controller scrapes every
`scrape_s`, as the controller does: the latest window is evaluated every `interval_s`, and at once when it
calls for a scale-up by rate (flotilla.controller.replan).
New instances take `startup_s` to become ready; an instance taken out of the plan finishes its work
and then frees its GPUs; an instance starts only when its GPUs are free, so a change never holds more
than `budget` GPUs, even while old and new instances coexist.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from flotilla.serving.planner import (InstanceCapacities, Plan, PlanRequest, instance_capacities,
                                     plan_from_capacities)
from flotilla.serving.profile import Profile
from flotilla.serving.replan import ObservedWindow, ReplanPolicy, Replanner, provisioned_rate
from flotilla.serving.workload import SLO, Workload
from flotilla.sim.serving_trace import Trace
from flotilla.testing.engine import OPT_13B_A100 as ENGINE_OPT_13B_A100
from flotilla.testing.engine import Engine, EngineProfile, Iteration, Request, StepFit
from flotilla.testing.engine.core import Role

# Planner profiles whose published timings the engine double carries in full.
ENGINE_PROFILES = {"opt-13b-a100": ENGINE_OPT_13B_A100}

POLICIES = ("adaptive", "adaptive-colocated", "adaptive-disaggregated", "static-peak", "static-best", "fixed-1-1",
            "colocated", "reactive")
PEAK_WINDOW_S = 60.0
SCRAPE_S = 15.0  # the controller's default --scrape-interval


class _Instance:
    """One engine of the deployment, stepped in simulated time: the engine double decides what each
    iteration computes and how long it takes (flotilla.testing.engine)."""

    def __init__(self, sim: ServingSim, role: Role, gpus: int, engine: Engine) -> None:
        self.sim, self.role, self.gpus, self.engine = sim, role, gpus, engine
        self.takes_prompts = role != "decode"
        self.takes_decodes = role != "prefill"
        self.ready = False
        self.draining = False
        self.busy = False

    def load(self) -> int:
        return self.engine.load

    def idle(self) -> bool:
        return not self.busy and self.engine.idle()

    def add(self, request: Request, now: float) -> None:
        self.engine.add(request, now)
        self.kick(now)

    def kick(self, now: float) -> None:
        if self.busy or not self.ready:
            return
        iteration = self.engine.step(now)
        if iteration is not None:
            self.busy = True
            self.sim.at(iteration.end, self._done, iteration)
        elif self.draining and self.idle():
            self.sim.retire_idle(now)

    def _done(self, now: float, iteration: Iteration) -> None:
        self.busy = False
        for request in iteration.finished:
            self.sim.finish(request, now)
        for handoff in iteration.handoffs:
            self.sim.at(handoff.ready_at, self.sim.route_decode, handoff.request)
        self.kick(now)


def engine_profile(profile: Profile) -> EngineProfile:
    """The engine double's timings for a planner profile: the published fits themselves for a shipped
    profile the engine double has (with both of DistServe's decode pieces), else the profile's own
    coefficients (one decode piece; no KV transfer time, the model size being unknown)."""
    if profile.name in ENGINE_PROFILES:
        return ENGINE_PROFILES[profile.name]
    decode = {f.gpus: f for f in profile.decode}
    fits = {}
    for p in profile.prefill:
        if p.gpus in decode:
            d = decode[p.gpus]
            piece = (d.constant_ms, d.per_context_token_ms, d.per_request_ms)
            fits[p.gpus] = StepFit(p.gpus, (p.constant_ms, p.per_token_ms, p.per_token_squared_ms), piece, piece,
                                   d.max_batch_size + 1, d.kv_cache_tokens)
    return EngineProfile(profile.name, profile.provenance, 0, fits)


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
    modes: dict[str, int]  # plans applied (the first one and every change), by mode
    at_risk_plans: int = 0  # plans applied that were flagged SLO at risk (said they would not meet the load)
    decision_ms: tuple[float, ...] = ()  # CPU time of each re-planning decision (adaptive policies), the check included

    @property
    def gpu_hours(self) -> float:
        return self.mean_gpus * self.duration_s / 3600.0

    def to_dict(self) -> dict[str, float | int | str]:
        out = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items() if k != "decision_ms"}
        if self.decision_ms:
            out["decision_p99_ms"] = round(_p99(self.decision_ms), 1)
        return out


class Policy(Protocol):
    name: str

    def initial_plan(self) -> Plan: ...

    def on_window(self, window: ObservedWindow) -> Plan | None: ...


class ServingSim:
    def __init__(self, trace: Trace, profile: Profile, slo: SLO, budget: int, policy: Policy,
                 interval_s: float = 30.0, startup_s: float = 30.0, scrape_s: float | None = None) -> None:
        self.trace, self.profile, self.slo, self.budget = trace, profile, slo, budget
        self.engine_profile = engine_profile(profile)
        self.policy, self.interval_s, self.startup_s = policy, interval_s, startup_s
        self.scrape_s = scrape_s or interval_s
        self._events: list[tuple[float, int, Callable, object]] = []
        self._seq = 0
        self.instances: list[_Instance] = []
        self._pending: deque[tuple[str, int]] = deque()  # instances waiting for free GPUs
        self._backlog: dict[str, deque[Request]] = {"prefill": deque(), "decode": deque()}
        self._gpus = 0
        self._gpu_seconds = 0.0
        self._max_gpus = 0
        self._last_change = 0.0
        self._finished: list[Request] = []  # completed in the current observation window
        self._window_arrivals: list[Request] = []
        self._startup_s = 0.0  # the first plan's instances are up at time 0
        self.plan_changes = 0
        self.at_risk_plans = 0
        self.modes: dict[str, int] = {}  # plans applied, by mode

    # --- event loop -------------------------------------------------------------------------
    def at(self, time: float, callback: Callable, arg: object) -> None:
        self._seq += 1
        heapq.heappush(self._events, (time, self._seq, callback, arg))

    def run(self) -> SimResult:
        requests = [Request(str(i), int(p), int(o), arrival=float(t)) for i, (t, p, o) in
                    enumerate(zip(self.trace.arrival_s, self.trace.prompt_tokens, self.trace.output_tokens))]
        self._apply(self.policy.initial_plan(), 0.0)
        self._startup_s = self.startup_s
        for request in requests:
            self.at(request.arrival, self._arrive, request)
        end_of_arrivals = requests[-1].arrival
        tick = self.scrape_s
        while tick <= end_of_arrivals:
            self.at(tick, self._window, None)
            tick += self.scrape_s
        now = 0.0
        while self._events:
            now, _, callback, arg = heapq.heappop(self._events)
            callback(now, arg)
        self._account(now)
        return self._result(requests, now)

    # --- routing ----------------------------------------------------------------------------
    def _arrive(self, now: float, request: Request) -> None:
        self._window_arrivals.append(request)
        target = self._pick(lambda i: i.takes_prompts)
        if target is None:
            self._backlog["prefill"].append(request)
        else:
            target.add(request, now)

    def route_decode(self, now: float, request: Request) -> None:
        target = self._pick(lambda i: i.takes_decodes)
        if target is None:
            self._backlog["decode"].append(request)
        else:
            target.add(request, now)

    def _pick(self, accepts: Callable[[_Instance], bool]) -> _Instance | None:
        ready = [i for i in self.instances if i.ready and accepts(i)]
        serving = [i for i in ready if not i.draining] or ready
        return min(serving, key=_Instance.load) if serving else None

    def finish(self, request: Request, now: float) -> None:
        self._finished.append(request)

    # --- plans and instances ----------------------------------------------------------------
    def _apply(self, new: Plan, now: float) -> None:
        self.modes[new.mode] = self.modes.get(new.mode, 0) + 1
        self.at_risk_plans += int(new.slo_at_risk)
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
            replaced = any(i.ready and not i.draining and (i.takes_prompts or not instance.takes_prompts)
                           and (i.takes_decodes or not instance.takes_decodes) for i in self.instances)
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
            engine = Engine(role, gpus, self.engine_profile,  # type: ignore[arg-type]
                            max_num_batched_tokens=self.profile.prefill_fit(gpus).max_batch_tokens,
                            max_num_seqs=self.profile.decode_fit(gpus).max_batch_size)
            instance = _Instance(self, role, gpus, engine)  # type: ignore[arg-type]
            self.instances.append(instance)
            self._set_gpus(now, self._gpus + gpus)
            self.at(now + self._startup_s, self._ready, instance)

    def _ready(self, now: float, instance: _Instance) -> None:
        if instance not in self.instances:
            return
        instance.ready = True
        for kind, accepts in (("prefill", instance.takes_prompts), ("decode", instance.takes_decodes)):
            backlog = self._backlog[kind]
            while accepts and backlog:
                instance.add(backlog.popleft(), now)
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
        ttft = np.array([r.first_token_at - r.arrival for r in done]) * 1000.0
        tpot = np.array([_tpot_s(r) for r in done]) * 1000.0
        met = int(np.sum((ttft <= self.slo.ttft_ms) & (tpot <= self.slo.tpot_ms))) if done else 0
        prompts = np.array([r.prompt_tokens for r in arrived] or [1])
        outputs = np.array([r.max_tokens for r in arrived] or [1])
        window = ObservedWindow(
            time=now, requests_per_second=len(arrived) / self.scrape_s,
            mean_prompt_tokens=float(prompts.mean()), mean_output_tokens=float(outputs.mean()),
            p90_prompt_tokens=float(np.percentile(prompts, 90)), p90_output_tokens=float(np.percentile(outputs, 90)),
            ttft_p90_ms=float(np.percentile(ttft, 90)) if done else None,
            tpot_p90_ms=float(np.percentile(tpot, 90)) if done else None,
            attainment=met / len(done) if done else None, requests=len(done), seconds=self.scrape_s)
        observe = getattr(self.policy, "observe_pools", None)
        if observe is not None:  # a policy that scales on the engines' own gauges, as an HPA does
            observe(now, {role: [(i.engine.metrics.waiting, i.engine.metrics.kv_cache_usage) for i in self.instances
                                 if i.role == role and i.ready and not i.draining]
                          for role in ("prefill", "decode", "colocated")})
        new = self.policy.on_window(window)
        if new is not None:
            self.plan_changes += 1
            self._apply(new, now)

    def _result(self, requests: list[Request], end: float) -> SimResult:
        ttft = np.array([r.first_token_at - r.arrival for r in requests]) * 1000.0
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
                         self.plan_changes, dict(self.modes), self.at_risk_plans,
                         tuple(getattr(self.policy, "decision_ms", ())))


def _p99(values: tuple[float, ...] | list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def _tpot_s(request: Request) -> float:
    return request.tpot


# --- policies ---------------------------------------------------------------------------------
def workload_statistics(trace: Trace, mask: np.ndarray | None = None, seconds: float | None = None) -> Workload:
    """What a controller knows of (part of) a trace: its rate, mean and 90th-percentile lengths."""
    prompts = trace.prompt_tokens if mask is None else trace.prompt_tokens[mask]
    outputs = trace.output_tokens if mask is None else trace.output_tokens[mask]
    seconds = max(trace.duration_s, 1e-9) if seconds is None else seconds
    return Workload.from_means(len(prompts) / seconds, float(prompts.mean()), float(outputs.mean()),
                               float(np.percentile(prompts, 90)), float(np.percentile(outputs, 90)))


def peak_rate(trace: Trace, window_s: float) -> float:
    """The most requests that arrive in any `window_s` (sliding over arrivals), per second."""
    arrivals = trace.arrival_s
    ends = np.searchsorted(arrivals, arrivals + window_s, side="left")
    return float((ends - np.arange(len(arrivals))).max()) / window_s


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
    interval (what `spec.workload` would say), fed as the controller feeds it: the latest window every
    `interval_s`, and a window that calls for a scale-up by rate at once."""

    def __init__(self, first: Workload, slo: SLO, profile: Profile, budget: int, name: str = "adaptive",
                 allow_colocated: bool = True, allow_disaggregated: bool = True,
                 replan_policy: ReplanPolicy | None = None, interval_s: float = 30.0) -> None:
        self.name = name
        self.interval_s = interval_s
        self._evaluated = 0.0
        self.decision_ms: list[float] = []
        self.replanner = Replanner.start(PlanRequest(first, slo, profile, min_gpus=1, max_gpus=budget,
                                                     allow_colocated=allow_colocated,
                                                     allow_disaggregated=allow_disaggregated), replan_policy)

    def initial_plan(self) -> Plan:
        return self.replanner.current

    def on_window(self, window: ObservedWindow) -> Plan | None:
        due = window.time - self._evaluated >= self.interval_s - 1e-9
        if not (due or self.replanner.short_of_capacity(window)):
            return None
        self._evaluated = window.time
        start = time.process_time()
        decision = self.replanner.observe(window)
        self.decision_ms.append((time.process_time() - start) * 1000.0)
        return decision.plan


@dataclass(frozen=True)
class ReactiveSettings:
    """What a user of an HPA (or KEDA) on the engines' published gauges sets, per pool: the target
    average of vllm:num_requests_waiting (prefill and colocated pools) and of vllm:gpu_cache_usage_perc
    (decode and colocated pools) per instance; HPA's tolerance, its scale-down stabilization window (the
    most replicas recommended over the window is kept) and its default scale-up limit (per 15 s, double
    the replicas or 4 more, whichever is more)."""

    waiting_target: float = 2.0
    kv_target: float = 0.5
    tolerance: float = 0.1
    scale_down_window_s: float = 300.0


class ReactivePolicy:
    """A reactive autoscaler a user would run today: the layout's shape (mode, GPUs per instance) fixed as
    the planner gives it for the busiest minute, each pool's replica count scaled as an HPA scales a
    Deployment on the engines' gauges (ReactiveSettings), from the planner's plan for the first interval,
    within the budget. It sees no rate and no model: only queue length and KV-cache use."""

    def __init__(self, shape: Plan, first: Plan, budget: int, settings: ReactiveSettings, name: str = "reactive") -> None:
        self.name, self.budget, self.settings = name, budget, settings
        self.shape = shape
        if shape.mode == "colocated":
            self.gpus = {"colocated": shape.colocated_gpus_per_instance}
        else:
            self.gpus = {"prefill": shape.prefill_gpus_per_instance, "decode": shape.decode_gpus_per_instance}
        start = {"prefill": first.prefill_replicas, "decode": first.decode_replicas,
                 "colocated": first.colocated_replicas}
        self.replicas = {role: max(1, start[role] if first.mode == shape.mode else 1) for role in self.gpus}
        self._fit_budget()
        self._recommended: dict[str, deque[tuple[float, int]]] = {role: deque() for role in self.gpus}
        self._changed = False

    def _plan(self, reason: str) -> Plan:
        r, g = self.replicas, self.gpus
        return Plan(self.shape.mode, r.get("prefill", 0), g.get("prefill", 0), r.get("decode", 0), g.get("decode", 0),
                    r.get("colocated", 0), g.get("colocated", 0), 0.0, 0.0, False, reason)

    def initial_plan(self) -> Plan:
        return self._plan("reactive baseline: start")

    def _fit_budget(self) -> None:
        while sum(self.replicas[r] * self.gpus[r] for r in self.gpus) > self.budget:
            role = max((r for r in self.gpus if self.replicas[r] > 1), key=lambda r: self.replicas[r] * self.gpus[r],
                       default=None)
            if role is None:
                return
            self.replicas[role] -= 1

    def observe_pools(self, now: float, pools: dict[str, list[tuple[int, float]]]) -> None:
        st = self.settings
        for role in self.gpus:
            gauges = pools.get(role) or []
            current = self.replicas[role]
            if not gauges:
                desired = current
            else:
                ratios = []
                if role != "decode":
                    ratios.append(sum(w for w, _ in gauges) / len(gauges) / st.waiting_target)
                if role != "prefill":
                    ratios.append(sum(k for _, k in gauges) / len(gauges) / st.kv_target)
                ratio = max(ratios)
                # HPA: replicas from the ready pods' average; no change within the tolerance
                desired = current if abs(ratio - 1.0) <= st.tolerance else max(1, math.ceil(len(gauges) * ratio - 1e-9))
                desired = min(desired, max(2 * current, current + 4))
            window = self._recommended[role]
            window.append((now, desired))
            while window and window[0][0] < now - st.scale_down_window_s:
                window.popleft()
            target = desired if desired >= current else max(d for _, d in window)
            if target != current:
                self.replicas[role] = target
                self._changed = True
        self._fit_budget()

    def on_window(self, window: ObservedWindow) -> Plan | None:
        if not self._changed:
            return None
        self._changed = False
        return self._plan("reactive baseline: " + ", ".join(f"{self.replicas[r]} {r}" for r in self.gpus))


def make_policy(name: str, trace: Trace, slo: SLO, profile: Profile, budget: int, interval_s: float = 30.0,
                replan_policy: ReplanPolicy | None = None, startup_s: float = 30.0,
                scrape_s: float | None = None, reactive: ReactiveSettings | None = None) -> Policy:
    """Build one of POLICIES for a trace and a GPU budget. The adaptive ones re-plan every interval
    (adaptive-colocated and adaptive-disaggregated restricted to one mode); static-peak holds what the
    planner chose for the trace's busiest minute, static-best what it chose for the average load;
    fixed-1-1 1:1 prefill:decode pairs for the busiest minute; colocated holds the whole budget. The
    adaptive ones are told the interval, the scrape and the instances' start time, as a user would set
    them (unless `replan_policy` is given)."""
    average = workload_statistics(trace)
    replan_policy = replan_policy or ReplanPolicy(instance_start_s=startup_s, window_s=scrape_s or interval_s)
    if name.startswith("adaptive"):
        modes = {"adaptive": (True, True), "adaptive-colocated": (True, False),
                 "adaptive-disaggregated": (False, True)}
        if name not in modes:
            raise ValueError(f"policy: unknown {name!r}; choose from {', '.join(POLICIES)}")
        return AdaptivePolicy(workload_statistics(trace, trace.arrival_s < interval_s, interval_s),
                              slo, profile, budget, name, *modes[name], replan_policy=replan_policy,
                              interval_s=interval_s)
    caps = instance_capacities(average, slo, profile)
    if name == "reactive":
        first = workload_statistics(trace, trace.arrival_s < interval_s, interval_s)
        shape = plan_from_capacities(caps, peak_rate(trace, PEAK_WINDOW_S), 1, budget)
        one = InstanceCapacities(
            {g: c for g, c in caps.prefill.items() if g == shape.prefill_gpus_per_instance},
            {g: c for g, c in caps.decode.items() if g == shape.decode_gpus_per_instance},
            {g: c for g, c in caps.colocated.items() if g == shape.colocated_gpus_per_instance})
        if shape.mode == "colocated":
            one = InstanceCapacities({}, {}, one.colocated)
        else:
            one = InstanceCapacities(one.prefill, one.decode, {})
        start = plan_from_capacities(one, provisioned_rate(first.requests_per_second, interval_s, slo.attainment), 1, budget)
        return ReactivePolicy(shape, start, budget, reactive or ReactiveSettings())
    if name == "static-peak":
        # The same planner, sized once for the highest rate of any PEAK_WINDOW_S window of the trace.
        return StaticPolicy(name, plan_from_capacities(caps, peak_rate(trace, PEAK_WINDOW_S), 1, budget))
    if name == "static-best":
        # The planner's plan for the trace's average load (with the adaptive policy's margin), kept.
        rate = provisioned_rate(average.requests_per_second, interval_s, slo.attainment)
        return StaticPolicy(name, plan_from_capacities(caps, rate, 1, budget))
    if name == "fixed-1-1":
        # The classic P/D recipe as a user would size it: 1 prefill : 1 decode instance pairs, each role at
        # the GPUs per instance the planner gives it for the peak window, as many pairs as that peak needs.
        peak = peak_rate(trace, PEAK_WINDOW_S)
        layout = plan_from_capacities(InstanceCapacities(caps.prefill, caps.decode, {}), peak, 1, budget)
        gp, gd = layout.prefill_gpus_per_instance, layout.decode_gpus_per_instance
        pair = min(caps.prefill[gp], caps.decode[gd])
        pairs = max(min(math.ceil(peak / pair - 1e-9), budget // (gp + gd)), 1)
        return StaticPolicy(name, Plan("disaggregated", pairs, gp, pairs, gd, 0, 0, pairs * pair, peak,
                                       pairs * pair < peak, f"fixed 1:1 baseline: {pairs} pair(s) of "
                                       f"{gp}-GPU prefill + {gd}-GPU decode for the peak {peak:.2f} req/s"))
    if name == "colocated":
        if not caps.colocated:
            raise ValueError(f"profile {profile.name!r}: no GPU count has both prefill and decode fits")
        g = max(caps.colocated, key=lambda g: caps.colocated[g] / g)
        n = max(budget // g, 1)
        return StaticPolicy(name, Plan("colocated", 0, 0, 0, 0, n, g, n * caps.colocated[g],
                                       average.requests_per_second, False, "colocated baseline"))
    raise ValueError(f"policy: unknown {name!r}; choose from {', '.join(POLICIES)}")


def simulate(trace: Trace, profile: Profile, slo: SLO, budget: int, policy: str,
             interval_s: float = 30.0, startup_s: float = 30.0, replan_policy: ReplanPolicy | None = None,
             scrape_s: float | None = SCRAPE_S, reactive: ReactiveSettings | None = None) -> SimResult:
    """Play `trace` under `policy`; `replan_policy` tunes the adaptive policies (default: ReplanPolicy()).
    `scrape_s` None: one window per interval."""
    if len(trace) == 0:
        raise ValueError("trace: no requests")
    return ServingSim(trace, profile, slo, budget,
                      make_policy(policy, trace, slo, profile, budget, interval_s, replan_policy, startup_s,
                                  scrape_s, reactive),
                      interval_s, startup_s, scrape_s).run()
