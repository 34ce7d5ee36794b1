"""Serving statistics from vLLM's Prometheus metrics.

vLLM exposes cumulative counters and histograms; one window is the difference between two
scrapes of the same ServingDeployment: the controller's own (flotilla.controller.scrape), or a router's
or sidecar's that posts each scrape as text.
Series with different labels (pods, models) are summed. Used, by vLLM name:

| metric | gives |
|---|---|
| `vllm:request_success_total` | finished requests |
| `vllm:num_requests_running`, `vllm:num_requests_waiting` (gauges) | requests in the engine -> with the finished ones, the arrival rate |
| `vllm:request_prompt_tokens` (histogram) | mean and p90 prompt length |
| `vllm:request_generation_tokens` (histogram) | mean and p90 output length |
| `vllm:time_to_first_token_seconds` (histogram) | TTFT p90 |
| `vllm:time_per_output_token_seconds` (histogram) | TPOT p90 |

The rate is of arrivals, not completions: the requests finished in the window plus the change in the
requests the engines hold (running or waiting). vLLM counts a request when it ends, TTFT + every output
token after it arrived, so a finish rate lags a load change by a request's whole life, and on engines the
new load overwhelms it climbs only as fast as they finish (it is capped by their throughput); requests
that arrived and are still in the engine show at once. (A request still being prefilled elsewhere, in
P/D, is not in the decode engine yet: the lag left is one TTFT.) An engine without the gauges gives the
finish rate.

Joint TTFT-and-TPOT attainment cannot be read from two separate histograms, so it is left
unknown (the re-planner then judges by rate and lengths).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from flotilla.serving.replan import ObservedWindow

SUCCESS = "vllm:request_success"
IN_ENGINE = ("vllm:num_requests_running", "vllm:num_requests_waiting")
HISTOGRAMS = ("vllm:request_prompt_tokens", "vllm:request_generation_tokens", "vllm:time_to_first_token_seconds",
              "vllm:time_per_output_token_seconds")


@dataclass
class Scrape:
    time: float
    requests: float = 0.0
    in_engine: float = 0.0  # requests running or waiting at the scrape
    # histogram -> {"sum": x, "count": n, "buckets": {le: cumulative count}}
    histograms: dict[str, dict] = field(default_factory=dict)


def parse(text: str, now: float) -> Scrape:
    """Raises ValueError on text that is not the Prometheus exposition format."""
    scrape = Scrape(now)
    hist: dict[str, dict] = {h: {"sum": 0.0, "count": 0.0, "buckets": defaultdict(float)} for h in HISTOGRAMS}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == f"{SUCCESS}_total" or (s.name == SUCCESS and family.type == "counter"):
                scrape.requests += s.value
            elif s.name in IN_ENGINE:
                scrape.in_engine += s.value
            for h in HISTOGRAMS:
                if s.name == f"{h}_sum":
                    hist[h]["sum"] += s.value
                elif s.name == f"{h}_count":
                    hist[h]["count"] += s.value
                elif s.name == f"{h}_bucket":
                    hist[h]["buckets"][float(s.labels["le"])] += s.value
    scrape.histograms = hist
    return scrape


def add(total: Scrape, one: Scrape) -> None:
    """Adds one engine's scrape into `total` (several engines' counters, summed)."""
    total.requests += one.requests
    total.in_engine += one.in_engine
    for h, values in one.histograms.items():
        into = total.histograms.setdefault(h, {"sum": 0.0, "count": 0.0, "buckets": defaultdict(float)})
        into["sum"] += values["sum"]
        into["count"] += values["count"]
        for le, c in values["buckets"].items():
            into["buckets"][le] = into["buckets"].get(le, 0.0) + c


def _delta(new: dict, old: dict | None) -> dict:
    old = old or {"sum": 0.0, "count": 0.0, "buckets": {}}
    return {"sum": new["sum"] - old["sum"], "count": new["count"] - old["count"],
            "buckets": {le: c - old["buckets"].get(le, 0.0) for le, c in new["buckets"].items()}}


def quantile(buckets: dict[float, float], q: float) -> float | None:
    """The q-quantile of a (delta) cumulative histogram, interpolated linearly inside its bucket."""
    edges = sorted(buckets)
    if not edges or buckets[edges[-1]] <= 0:
        return None
    target, lower, below = q * buckets[edges[-1]], 0.0, 0.0
    for le in edges:
        count = buckets[le]
        if count >= target:
            if math.isinf(le):
                return lower
            inside = count - below
            return lower + (le - lower) * ((target - below) / inside if inside > 0 else 1.0)
        lower, below = le, count
    return lower


def window(old: Scrape, new: Scrape) -> ObservedWindow | None:
    """The window between two scrapes; None if no request finished in it (nothing to learn of lengths)."""
    seconds = new.time - old.time
    done = new.requests - old.requests
    if seconds <= 0 or done <= 0:
        return None
    if any(h not in new.histograms for h in HISTOGRAMS):
        return None
    d = {h: _delta(new.histograms[h], old.histograms.get(h)) for h in HISTOGRAMS}
    prompt, output = d["vllm:request_prompt_tokens"], d["vllm:request_generation_tokens"]
    if prompt["count"] <= 0 or output["count"] <= 0:
        return None

    def p90(h: str, scale: float = 1.0) -> float | None:
        value = quantile(d[h]["buckets"], 0.9)
        return None if value is None else value * scale

    arrived = max(done + new.in_engine - old.in_engine, 0.0)
    return ObservedWindow(
        time=new.time, requests_per_second=arrived / seconds,
        mean_prompt_tokens=max(1.0, prompt["sum"] / prompt["count"]),
        mean_output_tokens=max(1.0, output["sum"] / output["count"]),
        p90_prompt_tokens=p90("vllm:request_prompt_tokens"), p90_output_tokens=p90("vllm:request_generation_tokens"),
        ttft_p90_ms=p90("vllm:time_to_first_token_seconds", 1000.0),
        tpot_p90_ms=p90("vllm:time_per_output_token_seconds", 1000.0),
        attainment=None, requests=int(done), seconds=seconds)
