"""A heavy trace shaped like ElasticFlow's public Philly-style one: few GPUs, months of arrivals, tight deadlines.

    generate(seed) -> list[TraceJob]

What it copies from the public trace's shape (microsoft/elasticflow-traces, as ElasticFlow's ASPLOS'23
evaluation replays it on a small cluster), not its rows:
* 876 jobs by default on 32 GPUs (8-GPU nodes), arriving over about 90 days: a daily rhythm (more in
  working hours) and bursts (gamma gaps of shape 0.3: submissions come in batches), so the cluster is
  idle at night and oversubscribed several times over in a burst;
* requested sizes mostly small (Philly: most jobs ask for 1 GPU; a few for 16-64);
* durations at the requested size heavy-tailed (log-normal, median 8 h, sigma 1.4, clipped to 5 min..8 days),
  which offers 0.8-1.1 of the cluster's GPU-seconds on average and several times it in a burst (the median
  was set so that ElasticFlow meets about the share of deadlines it meets on the public trace, 0.876: it
  meets 0.79-0.89 on the tuning seeds; at 7 h 0.84-0.91, at 6 h 0.88-0.93);
* each job's model picked from a measured-style table of iterations/s at 1, 2, 4 ... 64 GPUs that is
  sub-linear and, for all but the CNNs, falls again past a model-specific peak;
* deadline = submit + U(0.5, 1.5) x the duration at the requested size (about half the jobs can only make
  it by scaling out);
* elasticity 1..64 GPUs (ElasticFlow chooses the size; the request only sets the duration and deadline);
* restore cost after ElasticFlow's own overhead model for a rescale (its scheduler/utils.py
  `estimate_overhead` on a small cluster: 2 s plus 2 s x (log2 g + 1) at g GPUs; 27 s more only on its
  periodic restarts), taken at the requested size: 4-16 s.

It imports only the trace record and the curve type, no allocation policy.
"""

from __future__ import annotations

import math
import random

from flotilla.allocation.curve import ScalingCurve
from flotilla.sim.training_trace import TraceJob

GPUS = 32
JOBS = 876
DAYS = 90
MEDIAN_S = 8 * 3600.0  # median duration at the requested size

# Iterations/s at 1..64 GPUs per model, relative to 1 GPU; sub-linear, most falling past a peak (the shape
# of ElasticFlow's measured tables: CNNs scale far, language models peak at 8-32 GPUs on a 100 Gb/s fabric).
_SPEEDUP: dict[str, tuple[float, ...]] = {
    #            1    2     4     8     16     32     64
    "resnet50": (1.0, 1.92, 3.70, 7.10, 13.20, 23.50, 38.00),
    "inception3": (1.0, 1.88, 3.55, 6.60, 11.60, 18.40, 24.00),
    "vgg16": (1.0, 1.70, 2.90, 4.60, 6.10, 6.60, 5.90),
    "bert": (1.0, 1.85, 3.40, 6.00, 9.30, 11.00, 10.20),
    "gpt2": (1.0, 1.75, 2.95, 4.40, 5.20, 4.70, 3.90),
    "deepspeech2": (1.0, 1.80, 3.10, 4.90, 6.40, 6.10, 5.00),
}
_BASE_RATE = {"resnet50": 10.0, "inception3": 7.0, "vgg16": 6.0, "bert": 3.0, "gpt2": 1.5, "deepspeech2": 2.5}
_MODEL_WEIGHTS = {"resnet50": 22, "inception3": 14, "vgg16": 14, "bert": 20, "gpt2": 16, "deepspeech2": 14}
_SIZES = (1, 2, 4, 8, 16, 32, 64)
_SIZE_WEIGHTS = (55, 14, 13, 11, 4, 2, 1)


def curve(model: str) -> ScalingCurve:
    base = _BASE_RATE[model]
    return ScalingCurve.of([(g, round(base * s, 4)) for g, s in zip(_SIZES, _SPEEDUP[model])])


def restore_seconds(gpus: int) -> float:
    """ElasticFlow's overhead for rescaling a job at `gpus` GPUs (its estimate_overhead on a small cluster,
    workers kept, no restart): 2 + 2 x (log2 gpus + 1) seconds."""
    return round(2 + 2 * (math.log2(max(1, gpus)) + 1), 1)


def generate(seed: int, n_jobs: int = JOBS, gpus: int = GPUS, days: float = DAYS,
             deadline_factor: tuple[float, float] = (0.5, 1.5)) -> list[TraceJob]:
    """The trace for `seed` (reproducible)."""
    if n_jobs <= 0 or gpus <= 0 or days <= 0:
        raise ValueError("n_jobs, gpus and days must be > 0")
    rng = random.Random(seed)
    models = sorted(_SPEEDUP)
    weights = [_MODEL_WEIGHTS[m] for m in models]
    # Bursty arrivals with a daily rhythm: gamma gaps (shape 0.3) in "busy time", where a working-hours
    # second counts 3x a night second; then scaled so that the last arrival falls at `days`.
    raw: list[float] = []
    t = 0.0
    for i in range(n_jobs):
        t += rng.gammavariate(0.3, 1 / 0.3) if i else 0.0
        raw.append(t)
    span = days * 86400.0
    busy_total = _busy(span)
    submits = [_unbusy(x / raw[-1] * busy_total) if raw[-1] else 0.0 for x in raw]
    jobs: list[TraceJob] = []
    for i, submit in enumerate(submits):
        requested = min(rng.choices(_SIZES, _SIZE_WEIGHTS)[0], gpus)
        model = rng.choices(models, weights)[0]
        c = curve(model)
        duration = min(max(rng.lognormvariate(math.log(MEDIAN_S), 1.4), 300.0), 8 * 86400.0)
        jobs.append(TraceJob(
            job_id=f"job-{i:05d}",
            submit=round(submit, 3),
            total_steps=max(1, round(duration * c.rate(requested))),
            requested_gpus=requested,
            min_gpus=1,
            max_gpus=min(64, gpus),
            gpus_per_worker=1,
            deadline=round(submit + rng.uniform(*deadline_factor) * duration, 3),
            curve=c,
            model=model,
            restore_seconds=restore_seconds(requested),
        ))
    return jobs


def _busy(t: float) -> float:
    """Busy time from 0 to `t`."""
    days, rest = divmod(t, 86400.0)
    per_day = 9 * 3600 * 1.0 + 9 * 3600 * 3.0 + 6 * 3600 * 1.0
    within = min(rest, 9 * 3600) + 3 * max(0.0, min(rest, 18 * 3600) - 9 * 3600) + max(0.0, rest - 18 * 3600)
    return days * per_day + within


def _unbusy(b: float) -> float:
    """The time at which busy time reaches `b` (inverse of `_busy`)."""
    per_day = 9 * 3600 * 1.0 + 9 * 3600 * 3.0 + 6 * 3600 * 1.0
    days, rest = divmod(b, per_day)
    if rest <= 9 * 3600:
        within = rest
    elif rest <= 9 * 3600 + 27 * 3600:
        within = 9 * 3600 + (rest - 9 * 3600) / 3
    else:
        within = 18 * 3600 + (rest - 36 * 3600)
    return days * 86400.0 + within


def offered_load(jobs: list[TraceJob], gpus: int) -> float:
    """GPU-seconds asked for (at the requested sizes) over the cluster's GPU-seconds from first to last submit."""
    asked = sum(j.requested_gpus * j.total_steps / j.curve.rate(j.requested_gpus) for j in jobs)
    span = (max(j.submit for j in jobs) - min(j.submit for j in jobs)) or 1.0
    return asked / (gpus * span)
