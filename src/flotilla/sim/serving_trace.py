"""Serving request traces: seeded generators and the CSV format.

CSV: a header line, then one request per line with columns
    arrival_s       arrival time in seconds from the start of the trace (non-decreasing)
    prompt_tokens   prompt length (>= 1)
    output_tokens   tokens generated, the first one included (>= 1)
Extra columns are ignored.

Arrival patterns (rates in requests per second):
    steady   Poisson at the mean rate
    bursty   Poisson whose rate alternates between a base and 3x the base (a burst 20% of the time),
             in periods of duration/8; the mean is the given rate
    diurnal  Poisson with rate mean * (1 - 0.7*cos(2*pi*t/duration)): one compressed day, trough at the
             start and end, peak in the middle at 1.7x the mean
    step     Poisson at a base rate, tripled over the middle third of the duration (the mean is the
             given rate, 5/3 of the base)

Length shapes (lognormal, clipped to a 2048-token context):
    chat       ShareGPT-like: prompt median ~ 180, output median ~ 150, both long-tailed
    summarise  long-context summarisation: prompt median ~ 1200, output median ~ 80
    code       code completion: prompt median ~ 400, output median ~ 40
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

ARRIVALS = ("steady", "bursty", "diurnal", "step")
# shape -> (prompt median, prompt sigma, output median, output sigma)
LENGTH_SHAPES: dict[str, tuple[float, float, float, float]] = {
    "chat": (180.0, 0.9, 150.0, 0.8),
    "summarise": (1200.0, 0.35, 80.0, 0.5),
    "code": (400.0, 0.6, 40.0, 0.7),
}
MAX_CONTEXT = 2048
BURST_FACTOR = 3.0
BURST_SHARE = 0.2
DIURNAL_SWING = 0.7


@dataclass(frozen=True)
class Trace:
    arrival_s: np.ndarray  # float, non-decreasing
    prompt_tokens: np.ndarray  # int
    output_tokens: np.ndarray  # int

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1]) if len(self) else 0.0


def rate_at(arrival: str, mean_rate: float, duration_s: float, t: np.ndarray) -> np.ndarray:
    """The arrival rate of a pattern at times t."""
    if arrival == "steady":
        return np.full_like(t, mean_rate, dtype=float)
    if arrival == "bursty":
        base = mean_rate / (1 - BURST_SHARE + BURST_SHARE * BURST_FACTOR)
        phase = np.mod(t / (duration_s / 8), 1.0)
        return np.where(phase >= 1 - BURST_SHARE, base * BURST_FACTOR, base)
    if arrival == "diurnal":
        return mean_rate * (1 - DIURNAL_SWING * np.cos(2 * math.pi * t / duration_s))
    if arrival == "step":
        base = mean_rate * 3 / 5
        middle = (t >= duration_s / 3) & (t < 2 * duration_s / 3)
        return np.where(middle, base * 3, base)
    raise ValueError(f"arrival: unknown pattern {arrival!r}; choose from {', '.join(ARRIVALS)}")


def generate(arrival: str, shape: str, mean_rate: float, duration_s: float, seed: int) -> Trace:
    """A seeded trace: non-homogeneous Poisson arrivals (by thinning) with lengths of the given shape."""
    if shape not in LENGTH_SHAPES:
        raise ValueError(f"shape: unknown length shape {shape!r}; choose from {', '.join(LENGTH_SHAPES)}")
    if mean_rate <= 0:
        raise ValueError(f"rate: must be > 0, got {mean_rate}")
    if duration_s <= 0:
        raise ValueError(f"duration: must be > 0, got {duration_s}")
    rng = np.random.default_rng(seed)
    peak = float(rate_at(arrival, mean_rate, duration_s, np.linspace(0, duration_s, 1001)).max())
    candidates = np.cumsum(rng.exponential(1 / peak, size=int(peak * duration_s * 1.2) + 100))
    candidates = candidates[candidates < duration_s]
    keep = rng.random(len(candidates)) < rate_at(arrival, mean_rate, duration_s, candidates) / peak
    arrivals = candidates[keep]
    prompts, outputs = _sample_lengths(shape, len(arrivals), rng)
    return Trace(arrivals, prompts, outputs)


def _sample_lengths(shape: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    p_median, p_sigma, o_median, o_sigma = LENGTH_SHAPES[shape]
    prompts = np.clip(np.round(rng.lognormal(math.log(p_median), p_sigma, n)), 4, MAX_CONTEXT - 64).astype(int)
    outputs = np.round(rng.lognormal(math.log(o_median), o_sigma, n)).astype(int)
    outputs = np.clip(outputs, 2, MAX_CONTEXT - prompts)
    return prompts, outputs


def write_csv(trace: Trace, destination: Path | str | TextIO) -> None:
    if isinstance(destination, (str, Path)):
        with open(destination, "w", newline="") as f:
            write_csv(trace, f)
        return
    writer = csv.writer(destination, lineterminator="\n")
    writer.writerow(["arrival_s", "prompt_tokens", "output_tokens"])
    for t, p, o in zip(trace.arrival_s, trace.prompt_tokens, trace.output_tokens):
        writer.writerow([f"{t:.6f}", int(p), int(o)])


def read_csv(path: Path | str) -> Trace:
    """Read a trace CSV; errors name the line and column."""
    arrivals: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = {"arrival_s", "prompt_tokens", "output_tokens"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(sorted(missing))}")
        for row in reader:
            line = reader.line_num
            try:
                t = float(row["arrival_s"])
            except ValueError:
                raise ValueError(f"{path}:{line}: arrival_s: not a number: {row['arrival_s']!r}") from None
            if not math.isfinite(t) or t < 0 or (arrivals and t < arrivals[-1]):
                raise ValueError(f"{path}:{line}: arrival_s: must be >= 0 and non-decreasing, got {t}")
            arrivals.append(t)
            for column, out in (("prompt_tokens", prompts), ("output_tokens", outputs)):
                try:
                    value = int(row[column])
                except ValueError:
                    raise ValueError(f"{path}:{line}: {column}: not an integer: {row[column]!r}") from None
                if value < 1:
                    raise ValueError(f"{path}:{line}: {column}: must be >= 1, got {value}")
                out.append(value)
    if not arrivals:
        raise ValueError(f"{path}: no requests")
    return Trace(np.array(arrivals), np.array(prompts), np.array(outputs))
