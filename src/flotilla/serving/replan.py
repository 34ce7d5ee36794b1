"""Re-planning from observed load, with hysteresis.

The controller hands the Replanner `ObservedWindow`s: the latest one every planner interval, and at once
one that calls for a scale-up by rate (`short_of_capacity`). Capacity is planned for an upper quantile
of the arrival rate, not for the rate times a fixed headroom: a window of T seconds at rate r estimates
the rate within a Poisson standard deviation sqrt(r/T) (windows that agree are pooled), and the margin
is z of those deviations, z leaving the capacity short no more often than half the SLO's miss budget,
(1 - attainment) / 2: z = 1.645 at attainment 0.9. The rules:

* Scale up at once when the estimated rate exceeds the current plan's capacity, or when the window
  missed the SLO attainment target (then to at least the capacity plus its margin). The new plan is
  sized for the estimate plus its margin, so the margin is also the hysteresis: noise within it
  changes nothing.
* Scale down only when the current plan has held for `scale_down_delay_s` and a smaller plan fits the
  peak of the last `peak_memory_s` seconds: its busiest minute with that minute's margin (what
  static-peak sizes for, over the whole trace), and every window's own rate (a window the smaller
  plan could not take would scale it straight back up). The memory starts short (120 s) and learns:
  when the load comes back to a level the plan had let go (a scale-up after a scale-down), the memory
  grows to the time since the previous rise, so peaks that recur keep their capacity through the
  troughs between them (up to `max_peak_memory_s`). Only when the GPU-seconds saved over
  `benefit_horizon_s` exceed the cost of the change (GPUs of instances started or stopped, times
  `change_cost_s` each).
* A different layout (another GPUs-per-instance, colocated <-> disaggregated) replaces more
  instances than growing or shrinking the current one, so it is chosen only when its GPU saving over
  `benefit_horizon_s` exceeds the extra change cost; otherwise the current layout is resized.
* Rises shorter than an instance start are ridden out, not followed: once a scale-up's instances serve,
  a rate back within the capacity before it means the rise was gone before the capacity added for it
  served. From then on a rise (or a missed window) does not scale up while the misses the current plan's
  windows report stay within the SLO's miss budget over the memory (the SLO counts requests, not
  windows), and scale-down goes to the busiest minute's plan. A plan that spends more than the budget
  sends the re-planner back to following every rise.
* Every plan adopted is checked first (flotilla.serving.check, at the rate it is adopted for, on the
  observed lengths); one that fails gives way to the next larger plan, and when none passes the last is
  adopted flagged at risk. A scale-down whose plan fails its check is not made.
* For `settle_s` after a change's instances serve (`instance_start_s`), a missed attainment does not
  trigger another scale-up: the window still holds the queue built before they were ready.
* Lengths are averaged over the windows of the last `length_memory_s` (weighted by rate), so one
  window's noise in the mean lengths does not move the capacity estimate.
* A plan that has the same shape as the current one is never re-issued.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from statistics import NormalDist
from typing import Any

from flotilla.serving.check import CheckResult, check
from flotilla.serving.planner import (InstanceCapacities, Plan, PlanRequest, instance_capacities, plan,
                                     plan_capacity, plan_from_capacities)
from flotilla.serving.search import layout_of
from flotilla.serving.workload import Workload


@dataclass(frozen=True)
class ObservedWindow:
    """Serving statistics over one window (what the controller aggregates from pods or a router)."""

    time: float  # end of the window, seconds (any monotonic clock)
    requests_per_second: float
    mean_prompt_tokens: float
    mean_output_tokens: float
    p90_prompt_tokens: float | None = None
    p90_output_tokens: float | None = None
    ttft_p90_ms: float | None = None
    tpot_p90_ms: float | None = None
    attainment: float | None = None  # fraction of the window's requests within both TTFT and TPOT
    requests: int = 0  # how many requests the latency figures are computed from
    seconds: float | None = None  # the span the rate was measured over (default: the time since the last window)


@dataclass(frozen=True)
class ReplanPolicy:
    instance_start_s: float = 30.0  # from a plan change until a new instance serves
    window_s: float = 30.0  # window length assumed before two windows have been seen (spec.planner.intervalSeconds)
    pool_windows: int = 4  # the most recent windows pooled into one estimate when they agree
    scale_down_delay_s: float = 120.0
    length_memory_s: float = 300.0  # mean lengths are averaged over the windows of this long
    peak_memory_s: float = 120.0  # a smaller plan must fit the busiest minute this long (at first)
    max_peak_memory_s: float = 3600.0  # the longest the memory grows to for peaks that come back
    peak_window_s: float = 60.0  # a peak is the busiest span this long (static-peak's busiest minute)
    change_cost_s: float = 60.0  # GPU-seconds lost per GPU of an instance started or stopped
    benefit_horizon_s: float = 600.0
    min_requests_for_attainment: int = 50  # fewer samples say nothing about attainment
    settle_s: float = 60.0  # once new instances serve, their first windows still hold the queue built before
    check: bool = True  # check a plan by simulation (flotilla.serving.check) before adopting it
    check_steps: int = 3  # a plan that fails its check gives way to the next larger one, this many times
    replay_requests: int = 4000  # the most requests a replay of the remembered load simulates


@dataclass(frozen=True)
class ReplanMemory:
    """What a Replanner remembers beyond its current plan (the plan lives in spec.plan): the recent windows and
    its hysteresis. Kept by the controller so that a restart resumes it instead of forgetting up to an hour."""

    windows: tuple[ObservedWindow, ...]
    since: float | None
    peak_memory_s: float
    last_up: float | None
    down_since_up: bool
    rise: tuple[float, float] | None = None  # a scale-up not yet serving: (when, the capacity before it)
    short_rises: bool = False  # the last rise was over before the capacity added for it served
    rise_start: float | None = None  # when the latest rise over the plan's capacity began
    over: bool = False  # whether the latest window was over the plan's capacity
    ride_failed: bool = False  # a plan riding out short rises missed the target

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReplanMemory:
        """ValueError (or TypeError) when `d` is not what `to_dict` wrote (one written before the rise fields
        were kept resumes without them)."""
        rise = d.get("rise")
        return cls(tuple(ObservedWindow(**w) for w in d["windows"]), d["since"], float(d["peak_memory_s"]),
                   d["last_up"], bool(d["down_since_up"]), (float(rise[0]), float(rise[1])) if rise else None,
                   bool(d.get("short_rises", False)), d.get("rise_start"), bool(d.get("over", False)),
                   bool(d.get("ride_failed", False)))


@dataclass(frozen=True)
class ReplanDecision:
    plan: Plan | None  # None: keep the current plan
    reason: str


class Replanner:
    """Holds the current plan and the recent windows; `observe` decides whether to change."""

    def __init__(self, template: PlanRequest, current: Plan, policy: ReplanPolicy | None = None) -> None:
        self.template = template  # SLO, profile, GPU bounds; its workload is replaced by observations
        self.current = current
        self.policy = policy or ReplanPolicy()
        self._windows: deque[ObservedWindow] = deque()
        self._since: float | None = None  # when the current plan took effect
        self._memory = self.policy.peak_memory_s  # grows to the period of peaks that came back
        self._last_up: float | None = None  # when the load last made the plan grow
        self._down_since_up = False  # whether the plan shrank after that
        self._rise: tuple[float, float] | None = None  # a scale-up not yet serving: (when, capacity before)
        self._short_rises = False  # the last rise was over before the capacity added for it served
        self._rise_start: float | None = None  # when the latest rise over capacity began
        self._over = False  # whether the latest window was over capacity
        self._ride_failed = False  # a plan riding out short rises missed the target: follow them again

    def memory(self) -> ReplanMemory:
        return ReplanMemory(tuple(self._windows), self._since, self._memory, self._last_up, self._down_since_up,
                            self._rise, self._short_rises, self._rise_start, self._over, self._ride_failed)

    def resume(self, memory: ReplanMemory) -> None:
        """Take up where a Replanner of the same plan left off (before a restart)."""
        self._windows = deque(memory.windows)
        self._since, self._memory = memory.since, memory.peak_memory_s
        self._last_up, self._down_since_up = memory.last_up, memory.down_since_up
        self._rise, self._short_rises = memory.rise, memory.short_rises
        self._rise_start, self._over, self._ride_failed = memory.rise_start, memory.over, memory.ride_failed

    @classmethod
    def start(cls, request: PlanRequest, policy: ReplanPolicy | None = None) -> Replanner:
        """A Replanner whose first plan serves the request's rate (spec.workload) with its margin."""
        policy = policy or ReplanPolicy()
        rate = provisioned_rate(request.workload.requests_per_second, policy.window_s, request.slo.attainment)
        # the re-planner's own analytical world (per-phase budgets, no check): its first plan is sized by it too
        return cls(request, plan(replace(request, workload=request.workload.at_rate(rate), check=False)), policy)

    def observe(self, window: ObservedWindow) -> ReplanDecision:
        policy = self.policy
        self._windows.append(window)
        while self._windows and self._windows[0].time < window.time - max(self._memory, policy.length_memory_s):
            self._windows.popleft()
        if self._since is None:
            self._since = window.time
        caps = self._capacities(self._windows)
        capacity = plan_capacity(self.current, caps)
        rate = window.requests_per_second
        missed = (window.attainment is not None and window.requests >= policy.min_requests_for_attainment
                  and window.attainment < self.template.slo.attainment
                  and window.time - self._since >= policy.instance_start_s + policy.settle_s)

        windows = list(self._windows)
        estimate, margin = self._estimate(windows)
        planned = estimate + margin
        self._learn_rise(window)
        over = estimate > capacity
        if over and not self._over and self._short_rises:
            self._remember_return(window.time, ridden=True)
        self._over = over
        remembered = [w for w in windows if w.time >= window.time - self._memory]
        if over or missed:
            ride = self._rides_out(remembered) if self._short_rises and not self._ride_failed else None
            if ride is not None:
                return ReplanDecision(None, f"keep: {self.current.describe()} rides out rises shorter than an "
                                            f"instance start: {ride}")
            attainment = self.template.slo.attainment
            target = max(planned, provisioned_rate(capacity, self._span(windows), attainment) if missed else 0.0)
            candidate = self._checked(self._plan(caps, target), caps, target, windows)
            if candidate.shape() != self.current.shape() and plan_capacity(candidate, caps) > capacity:
                why = (f"attainment {window.attainment:.3f} below target {self.template.slo.attainment}"
                       if missed else f"rate {estimate:.2f} req/s over {capacity:.2f}; plans for {planned:.2f}")
                self._remember_return(window.time)
                self._rise = (window.time, capacity)
                return self._adopt(candidate, window, f"scale up: {why}; {candidate.reason}")
            return ReplanDecision(None, f"keep: {self.current.describe()} is the best the budget allows")

        span_covered = window.time - self._since >= policy.scale_down_delay_s
        peak, peak_planned = self._peak(remembered)
        # Nor below any window in memory with its own margin: the smaller plan must not be scaled straight
        # back up by the next window of the same load (the margin is the hysteresis).
        attainment = self.template.slo.attainment
        every = max(peak_planned, *(provisioned_rate(w.requests_per_second, self._span(remembered, i), attainment)
                                    for i, w in enumerate(remembered)))
        candidate = self._plan(caps, every)
        if span_covered and self._short_rises:
            # Rises shorter than an instance start are ridden out, not followed: the busiest minute's plan
            # (static-peak's sizing, no margin: what it serves is watched), until it misses the target.
            minute = self._plan(caps, peak)
            # not in the middle of a rise: the smaller plan would be judged on a burst it never saw begin
            if (not self._ride_failed and minute.gpus < min(candidate.gpus, self.current.gpus)
                    and estimate <= plan_capacity(minute, caps) and window.attainment is not None):
                candidate, every = minute, peak
        if span_covered and candidate.gpus < self.current.gpus:
            candidate = self._checked(candidate, caps, every, windows)
        if span_covered and candidate.gpus < self.current.gpus and not candidate.slo_at_risk:
            saved = (self.current.gpus - candidate.gpus) * policy.benefit_horizon_s
            cost = _changed_gpus(self.current, candidate) * policy.change_cost_s
            if saved > cost:
                self._down_since_up = True
                return self._adopt(candidate, window,
                                   f"scale down: peak {peak:.2f} req/s over {self._memory:.0f} s "
                                   f"fits {candidate.gpus} GPUs instead of {self.current.gpus}; {candidate.reason}")
        return ReplanDecision(None, f"keep: {self.current.describe()} serves {capacity:.2f} req/s, "
                                    f"observed {rate:.2f}")

    def short_of_capacity(self, window: ObservedWindow) -> bool:
        """Whether `window` calls for a scale-up by rate (observe's first rule), without observing it: a
        caller that observes at an interval can observe such a window at once instead of at its next pass."""
        windows = [*self._windows, window]
        return self._estimate(windows)[0] > plan_capacity(self.current, self._capacities(windows))

    def _gap(self, windows: Sequence[ObservedWindow], i: int = -1) -> float:
        """Time between window i and the one before it (the policy's window length for the first)."""
        i %= len(windows)
        if i >= 1 and windows[i].time > windows[i - 1].time:
            return windows[i].time - windows[i - 1].time
        return self.policy.window_s

    def _span(self, windows: Sequence[ObservedWindow], i: int = -1) -> float:
        """How many seconds window i's rate was measured over (its own `seconds`, else its gap)."""
        given = windows[i].seconds
        return given if given is not None and given > 0 else self._gap(windows, i)

    def _remember_return(self, now: float, ridden: bool = False) -> None:
        """A scale-up after a scale-down means the load came back to a level the plan had let go: from
        then on the plan keeps its capacity through troughs as long as the one just seen (the time since the
        previous rise, plus one peak window), up to `max_peak_memory_s`. So does a rise the plan rides out
        (`ridden`) after the one before it: the busiest minute the plan is sized for must be the one of a
        whole period of such rises."""
        if ridden:
            previous, self._rise_start = self._rise_start, now
            if previous is not None:
                self._grow_memory(now - previous + self.policy.peak_window_s)
            return
        if self._last_up is not None and self._down_since_up:
            self._grow_memory(now - self._last_up + self.policy.peak_window_s)
        self._last_up, self._down_since_up, self._rise_start = now, False, now

    def _grow_memory(self, period: float) -> None:
        self._memory = min(max(self._memory, period), max(self.policy.max_peak_memory_s, self.policy.peak_memory_s))

    def _learn_rise(self, window: ObservedWindow) -> None:
        """Once the capacity of a scale-up serves, whether the rise that asked for it is still there: a rise
        gone by then (the rate back within the capacity before it, up to its noise) could not be followed,
        and rises like it are ridden out from then on (while what the plan serves meets the SLO)."""
        if self._rise is None or window.time < self._rise[0] + self.policy.instance_start_s:
            return
        # back within the capacity before, up to the window's own Poisson noise
        rate, span = window.requests_per_second, self._span([window])
        self._short_rises = rate - _margin_z(self.template.slo.attainment) * math.sqrt(rate / span) <= self._rise[1]
        self._rise = None

    def _rides_out(self, remembered: Sequence[ObservedWindow]) -> str | None:
        """Why the current plan rides out the remembered load, or None when it does not: the requests its
        own windows report missing (once its instances served; at least `min_requests_for_attainment` of
        them judged, so windows without attainment never let a rise be ridden out) stay within the miss budget of the whole
        memory, (1 - attainment) of the requests the remembered windows saw. The SLO counts requests, not
        windows: a burst that misses is paid for by the troughs of its period, and the memory holds one
        period of the rises ridden out. What is observed is what the deployment really does; no model of a
        burst is trusted here (the check's engines collapse under an overload the engines ride out)."""
        served = self._since + self.policy.instance_start_s if self._since is not None else -math.inf
        judged = [w for w in remembered if w.attainment is not None and w.time >= served]
        if sum(w.requests for w in judged) < self.policy.min_requests_for_attainment:
            return None  # nothing to judge it by (windows without attainment, as vLLM's metrics give): follow
        missed = sum((1.0 - (w.attainment or 0.0)) * w.requests for w in judged)
        expected = sum(w.requests_per_second * self._span(remembered, i) for i, w in enumerate(remembered))
        budget = (1.0 - self.template.slo.attainment) * expected
        if missed > budget:
            self._ride_failed = True
            return None
        return (f"its windows missed {missed:.0f} requests, within the {budget:.0f} the SLO allows over the "
                f"last {self._memory:.0f} s")

    def _checked(self, candidate: Plan, caps: InstanceCapacities, rate: float,
                 windows: Sequence[ObservedWindow]) -> Plan:
        """The candidate once the check (flotilla.serving.check, on the observed lengths at `rate`) passes it;
        a candidate that fails gives way to the next larger plan, up to `check_steps` times; when none
        passes, the last is flagged at risk, with what its check met."""
        if not self.policy.check or rate <= 0:
            return candidate
        workload, slo = self._lengths(windows), self.template.slo
        failed: list[str] = []
        for _ in range(max(self.policy.check_steps, 1)):
            result: CheckResult = check(layout_of(candidate), self.template.profile, workload, rate, slo,
                                        router=self.template.router)  # type: ignore[arg-type]
            if result.meets(slo):
                note = f"; checked at {rate:.2f} req/s: {result.attainment:.1%} meet TTFT and TPOT"
                if failed:
                    note += " (failed the check: " + ", ".join(failed) + ")"
                return replace(candidate, reason=candidate.reason + note)
            failed.append(f"{candidate.describe()} {result.attainment:.1%}")
            larger = self._plan(caps, plan_capacity(candidate, caps) * (1 + 1e-6) + 1e-6)
            if larger.gpus <= candidate.gpus:
                break
            candidate = larger
        return replace(candidate, slo_at_risk=True,
                       reason=f"SLO at risk: failed the check at {rate:.2f} req/s: " + ", ".join(failed)
                              + f"; {candidate.reason}")

    def _peak(self, windows: Sequence[ObservedWindow]) -> tuple[float, float]:
        """The busiest `peak_window_s` of the windows (their rates pooled over that span, as static-peak
        sizes for the trace's busiest minute) and the rate to provision for it (with its margin)."""
        attainment = self.template.slo.attainment
        best = (0.0, 0.0)
        for j, last in enumerate(windows):
            span = [(w, self._span(windows, i)) for i, w in enumerate(windows[:j + 1])
                    if w.time > last.time - self.policy.peak_window_s]
            seconds = sum(s for _, s in span)
            rate = sum(w.requests_per_second * s for w, s in span) / seconds
            best = max(best, (rate, provisioned_rate(rate, seconds, attainment)), key=lambda b: b[1])
        return best

    def _miss_budget(self) -> float:
        return (1 - self.template.slo.attainment) / 2

    def _estimate(self, windows: Sequence[ObservedWindow]) -> tuple[float, float]:
        """The rate now and the margin to provision above it (z standard deviations of the estimate). The
        rate pools the last `pool_windows` windows when they fit one rate within their Poisson noise (one
        short window is noisy, several that agree are not); otherwise it is the latest window's own
        (the load has moved). No trend is extrapolated: a load that has just started or stepped looks like
        a slope that will not go on, and the controller's short scrape windows see a new level within one
        scrape."""
        recent = list(windows)[-self.policy.pool_windows:]
        variances = [self._variance(recent, i) for i in range(len(recent))]
        level, variance = recent[-1].requests_per_second, variances[-1]
        if len(recent) >= 2:
            weights = [1 / v for v in variances]
            pooled = sum(w.requests_per_second * wt for w, wt in zip(recent, weights)) / sum(weights)
            misfit = sum((w.requests_per_second - pooled) ** 2 * wt for w, wt in zip(recent, weights))
            if misfit <= _chi_square_quantile(len(recent) - 1, 1 - self._miss_budget()):
                level, variance = pooled, 1 / sum(weights)
        z = _margin_z(self.template.slo.attainment)
        return level, z * math.sqrt(variance)

    def _variance(self, windows: Sequence[ObservedWindow], i: int) -> float:
        """The Poisson variance of window i's rate (at least that of one request in its span)."""
        span = self._span(windows, i)
        return max(windows[i].requests_per_second / span, 1.0 / span ** 2)

    def _capacities(self, windows: Sequence[ObservedWindow]) -> InstanceCapacities:
        t = self.template
        return instance_capacities(self._lengths(windows), t.slo, t.profile, t.allow_colocated, t.prefill_gpus,
                                   t.decode_gpus, t.allow_disaggregated)

    def _lengths(self, recent: Sequence[ObservedWindow]) -> Workload:
        """Lengths averaged over the windows of the last length_memory_s, weighted by their rates."""
        latest = recent[-1].time
        windows = [w for w in recent if w.time >= latest - self.policy.length_memory_s]
        weights = [max(w.requests_per_second, 1e-9) for w in windows]

        def average(values: list[float | None]) -> float | None:
            known = [(wt, v) for wt, v in zip(weights, values) if v is not None]
            return sum(wt * v for wt, v in known) / sum(wt for wt, _ in known) if known else None

        prompt = average([w.mean_prompt_tokens for w in windows]) or 1.0
        output = average([w.mean_output_tokens for w in windows]) or 1.0
        return Workload.from_means(windows[-1].requests_per_second, max(prompt, 1.0), max(output, 1.0),
                                   average([w.p90_prompt_tokens for w in windows]),
                                   average([w.p90_output_tokens for w in windows]))

    def _plan(self, caps: InstanceCapacities, rate: float) -> Plan:
        """The best plan for `rate`, unless resizing the current layout is cheaper once the cost of
        replacing instances is counted."""
        best = plan_from_capacities(caps, rate, self.template.min_gpus, self.template.max_gpus)
        current = self.current
        if current.mode == "colocated":
            g = current.colocated_gpus_per_instance
            same = InstanceCapacities({}, {}, {g: caps.colocated[g]} if g in caps.colocated else {})
        else:
            gp, gd = current.prefill_gpus_per_instance, current.decode_gpus_per_instance
            same = InstanceCapacities({gp: caps.prefill[gp]} if gp in caps.prefill else {},
                                      {gd: caps.decode[gd]} if gd in caps.decode else {}, {})
        layout = [*same.colocated.values()] if current.mode == "colocated" else [*same.prefill.values(),
                                                                                 *same.decode.values()]
        if len(layout) < (1 if current.mode == "colocated" else 2) or min(layout) <= 0:
            return best  # the current layout is not offered any more, or cannot meet the SLO now
        resized = plan_from_capacities(same, rate, self.template.min_gpus, self.template.max_gpus)
        if resized.predicted_goodput < min(rate, best.predicted_goodput):
            return best  # the current layout cannot serve what the best one can
        saving = (resized.gpus - best.gpus) * self.policy.benefit_horizon_s
        extra_cost = (_changed_gpus(current, best) - _changed_gpus(current, resized)) * self.policy.change_cost_s
        return best if saving > extra_cost else resized

    def _adopt(self, candidate: Plan, window: ObservedWindow, reason: str) -> ReplanDecision:
        self.current = replace(candidate, reason=reason)
        self._since = window.time
        return ReplanDecision(self.current, reason)


def provisioned_rate(rate: float, window_s: float, attainment: float) -> float:
    """The upper quantile of a rate observed as `rate` over `window_s` seconds: z Poisson standard
    deviations above it, z leaving the capacity short no more often than half the SLO's miss budget."""
    return rate + _margin_z(attainment) * math.sqrt(max(rate, 0.0) / max(window_s, 1e-9))


def _margin_z(attainment: float) -> float:
    """Standard deviations of margin that leave capacity short no more often than half the miss budget."""
    return NormalDist().inv_cdf(1 - (1 - attainment) / 2)


def _chi_square_quantile(df: int, p: float) -> float:
    """The p-quantile of a chi-square distribution with df degrees of freedom (Wilson-Hilferty)."""
    z = NormalDist().inv_cdf(p)
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _changed_gpus(old: Plan, new: Plan) -> int:
    """GPUs in instances started or stopped when going from `old` to `new`."""
    changed = 0
    for count, gpus in ((0, 1), (2, 3), (4, 5)):
        o_n, o_g, n_n, n_g = old.shape()[count], old.shape()[gpus], new.shape()[count], new.shape()[gpus]
        changed += abs(o_n - n_n) * o_g if o_g == n_g else o_n * o_g + n_n * n_g
    return changed
