"""What the planner plans for: the SLO and the offered load (rate and a sample of request lengths)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from statistics import NormalDist

# When only mean lengths are known (spec.workload, an observed window), lengths are taken as
# lognormal around the mean with this sigma: chat-like spread, and it keeps the long prompts that
# dominate the quadratic prefill term in the sample.
ASSUMED_LENGTH_SIGMA = 0.6
_SAMPLE_POINTS = 64


@dataclass(frozen=True)
class SLO:
    ttft_ms: float
    tpot_ms: float
    attainment: float  # fraction of requests that must meet both TTFT and TPOT

    def __post_init__(self) -> None:
        if self.ttft_ms <= 0:
            raise ValueError(f"slo.ttftMs: must be > 0, got {self.ttft_ms}")
        if self.tpot_ms <= 0:
            raise ValueError(f"slo.tpotMs: must be > 0, got {self.tpot_ms}")
        if not 0 < self.attainment < 1:
            raise ValueError(f"slo.attainment: must be in (0, 1), got {self.attainment}")


@dataclass(frozen=True)
class Workload:
    """Offered load: requests per second and a joint sample of (prompt, output) lengths in tokens.
    Output tokens count the first token too (made by prefill); decode makes the other output-1."""

    requests_per_second: float
    prompt_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.requests_per_second < 0:
            raise ValueError(f"workload.requestsPerSecond: must be >= 0, got {self.requests_per_second}")
        if not self.prompt_tokens or len(self.prompt_tokens) != len(self.output_tokens):
            raise ValueError("workload: prompt and output length samples must be non-empty and of equal size")
        if min(self.prompt_tokens) < 1 or min(self.output_tokens) < 1:
            raise ValueError("workload: every prompt and output length must be >= 1 token")

    @classmethod
    def from_means(cls, requests_per_second: float, mean_prompt_tokens: float, mean_output_tokens: float,
                   p90_prompt_tokens: float | None = None, p90_output_tokens: float | None = None) -> Workload:
        """A workload whose lengths are lognormal with the given means; the spread comes from the
        90th percentiles when known (vLLM's length histograms give them), else ASSUMED_LENGTH_SIGMA."""
        if mean_prompt_tokens < 1:
            raise ValueError(f"workload.inputTokens: must be >= 1, got {mean_prompt_tokens}")
        if mean_output_tokens < 1:
            raise ValueError(f"workload.outputTokens: must be >= 1, got {mean_output_tokens}")
        outputs = list(_lognormal_quantiles(mean_output_tokens, _sigma(mean_output_tokens, p90_output_tokens)))
        random.Random(0).shuffle(outputs)  # a fixed pairing that keeps the two lengths independent
        return cls(requests_per_second,
                   _lognormal_quantiles(mean_prompt_tokens, _sigma(mean_prompt_tokens, p90_prompt_tokens)),
                   tuple(outputs))

    def at_rate(self, requests_per_second: float) -> Workload:
        return Workload(requests_per_second, self.prompt_tokens, self.output_tokens)


def _sigma(mean: float, p90: float | None) -> float:
    """The lognormal sigma with this mean and 90th percentile: ln(p90/mean) = z*s - s^2/2, z = z_0.9."""
    if p90 is None:
        return ASSUMED_LENGTH_SIGMA
    z = NormalDist().inv_cdf(0.9)
    gap = math.log(max(p90, 1.0) / mean)
    discriminant = z * z - 2 * gap
    return max(z - math.sqrt(discriminant), 0.05) if discriminant > 0 else z


def _lognormal_quantiles(mean: float, sigma: float) -> tuple[int, ...]:
    """Midpoint quantiles of a lognormal with the given mean and sigma."""
    mu = math.log(mean) - sigma * sigma / 2
    normal = NormalDist()
    values = [max(1, round(math.exp(mu + sigma * normal.inv_cdf((i + 0.5) / _SAMPLE_POINTS))))
              for i in range(_SAMPLE_POINTS)]
    return tuple(values)
