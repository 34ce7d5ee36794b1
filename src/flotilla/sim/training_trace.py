"""Training traces: the job record, model-family scaling curves, a seeded generator and a CSV format.

CSV columns (header row required; order free; unknown columns are ignored):

  job_id           required  unique name
  submit_s         required  submit time, seconds from the trace's start
  requested_gpus   required  the size the user asked for (fixed-size baselines run at it)
  total_steps      one of    steps to run, or ...
  duration_s       these     ... seconds the job takes at requested_gpus (steps = duration x rate)
  deadline_s       one of    deadline, seconds after submit, or ...
  deadline_abs_s   these     ... absolute deadline, seconds from the trace's start
  model            one of    a scaling-curve family (see MODEL_FAMILIES), or ...
  curve            these     ... explicit points "gpus:steps_per_second;..." e.g. "1:2.0;2:3.8;4:7.1"
                             (curve wins when both are given)
  min_gpus         optional  default: gpus_per_worker
  max_gpus         optional  default: requested_gpus
  gpus_per_worker  optional  default: 1
  restore_s        optional  seconds a rescale or restart costs; default 30
  best_effort      optional  1/true to run without a deadline guarantee; default 0

An ElasticFlow trace converts row by row: iterations -> total_steps, the
model's measured throughput table -> curve (or a family name), the absolute
deadline -> deadline_abs_s, the requested GPU count -> requested_gpus, and
min_gpus=1, max_gpus=64.
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from flotilla.allocation.curve import ScalingCurve


@dataclass(frozen=True)
class TraceJob:
    job_id: str
    submit: float
    total_steps: int
    requested_gpus: int
    min_gpus: int
    max_gpus: int
    gpus_per_worker: int
    deadline: float  # absolute, seconds from the trace's start
    curve: ScalingCurve
    model: str = ""  # family name when the curve came from one
    restore_seconds: float = 30.0
    best_effort: bool = False


def _family(base: float, linear: float, quadratic: float) -> ScalingCurve:
    """Sub-linear speed-up that peaks: rate = base*g / (1 + linear*(g-1) + quadratic*(g-1)^2)."""
    points = []
    for g in (1, 2, 4, 8, 16, 32, 64):
        points.append((g, round(base * g / (1 + linear * (g - 1) + quadratic * (g - 1) ** 2), 4)))
    return ScalingCurve.of(points)


# Shapes after ElasticFlow's measured tables: near-linear CNNs, communication-bound
# models that peak early, transformers in between.
MODEL_FAMILIES: dict[str, ScalingCurve] = {
    "resnet50": _family(10.0, 0.02, 0.0),
    "inception3": _family(7.0, 0.04, 0.0002),
    "bert": _family(3.0, 0.05, 0.0005),
    "gpt2": _family(1.5, 0.08, 0.001),
    "vgg16": _family(6.0, 0.12, 0.002),
}

_SIZES = (1, 2, 4, 8, 16, 32, 64)
_SIZE_WEIGHTS = (30, 25, 15, 14, 9, 5, 2)


def generate(n_jobs: int, gpus: int, seed: int = 0, load: float = 1.5, arrivals: str = "poisson",
             deadline_factor: tuple[float, float] = (1.2, 3.0)) -> list[TraceJob]:
    """A synthetic trace, reproducible from `seed`.

    Requested sizes are heavy-tailed powers of two (most jobs small), durations
    log-normal (median 30 min, a long tail to days), deadlines at
    U(deadline_factor) x the duration at the requested size. Arrivals are Poisson,
    or bursty (gamma gaps with the same mean, shape 0.25), at a rate that offers
    `load` times the cluster's GPU-seconds.
    """
    if n_jobs <= 0 or gpus <= 0:
        raise ValueError("n_jobs and gpus must be > 0")
    if arrivals not in ("poisson", "bursty"):
        raise ValueError(f"arrivals must be 'poisson' or 'bursty', not {arrivals!r}")
    lo, hi = deadline_factor
    if not 0 < lo <= hi:
        raise ValueError(f"deadline_factor must be 0 < low <= high, not {deadline_factor}")
    rng = random.Random(seed)
    families = sorted(MODEL_FAMILIES)
    drafts = []
    for _ in range(n_jobs):
        requested = min(rng.choices(_SIZES, _SIZE_WEIGHTS)[0], gpus)
        duration = min(max(rng.lognormvariate(math.log(1800), 1.2), 60.0), 7 * 86400.0)
        drafts.append((requested, duration, rng.choice(families)))
    mean_gap = sum(r * d for r, d, _ in drafts) / (n_jobs * load * gpus)
    jobs: list[TraceJob] = []
    t = 0.0
    for i, (requested, duration, model) in enumerate(drafts):
        curve = MODEL_FAMILIES[model]
        gap = rng.expovariate(1 / mean_gap) if arrivals == "poisson" else rng.gammavariate(0.25, mean_gap / 0.25)
        t += gap if i else 0.0
        jobs.append(TraceJob(
            job_id=f"job-{i:05d}",
            submit=round(t, 3),
            total_steps=max(1, round(duration * curve.rate(requested))),
            requested_gpus=requested,
            min_gpus=max(1, requested // 4),
            max_gpus=min(gpus, 64, requested * 4),
            gpus_per_worker=1,
            deadline=round(t + rng.uniform(lo, hi) * duration, 3),
            curve=curve,
            model=model,
            restore_seconds=round(rng.uniform(10, 60), 1),
        ))
    return jobs


COLUMNS = ("job_id", "submit_s", "total_steps", "requested_gpus", "min_gpus", "max_gpus", "gpus_per_worker",
           "deadline_abs_s", "model", "curve", "restore_s", "best_effort")


def write_csv(jobs: Iterable[TraceJob], path: str | Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for j in jobs:
            curve = "" if j.model in MODEL_FAMILIES else _format_curve(j.curve)
            w.writerow([j.job_id, j.submit, j.total_steps, j.requested_gpus, j.min_gpus, j.max_gpus,
                        j.gpus_per_worker, j.deadline, j.model, curve, j.restore_seconds, int(j.best_effort)])


def _format_curve(curve: ScalingCurve) -> str:
    return ";".join(f"{g}:{r:g}" for g, r in curve.points)


def _parse_curve(text: str, where: str) -> ScalingCurve:
    try:
        points = [(int(g), float(r)) for g, r in (p.split(":") for p in text.split(";") if p.strip())]
        return ScalingCurve.of(points)
    except ValueError as e:
        raise ValueError(f"{where}: column 'curve' must be 'gpus:steps_per_second;...' ({e})") from None


def read_csv(path: str | Path) -> list[TraceJob]:
    """Read a trace; a bad row raises ValueError naming the line and the column."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = {"job_id", "submit_s", "requested_gpus"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(sorted(missing))}")
        jobs = [_row(row, f"{path}:{reader.line_num}") for row in reader]
    ids = [j.job_id for j in jobs]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: job_id values must be unique")
    return sorted(jobs, key=lambda j: (j.submit, j.job_id))


def _row(row: dict[str, str], where: str) -> TraceJob:
    def get(name: str) -> str:
        return (row.get(name) or "").strip()

    def num(name: str, default: float | None = None) -> float:
        text = get(name)
        if not text:
            if default is None:
                raise ValueError(f"{where}: column '{name}' is required")
            return default
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{where}: column '{name}' must be a number, not {text!r}") from None

    def whole(name: str, default: int | None = None) -> int:
        return int(num(name, default))

    job_id = get("job_id")
    if not job_id:
        raise ValueError(f"{where}: column 'job_id' is required")
    submit = num("submit_s")
    requested = whole("requested_gpus")
    if get("curve"):
        curve, model = _parse_curve(get("curve"), where), get("model")
    elif get("model"):
        model = get("model")
        if model not in MODEL_FAMILIES:
            raise ValueError(f"{where}: column 'model': unknown family {model!r}; "
                             f"known: {', '.join(sorted(MODEL_FAMILIES))} (or give 'curve')")
        curve = MODEL_FAMILIES[model]
    else:
        raise ValueError(f"{where}: give column 'model' or 'curve'")
    if get("total_steps"):
        steps = whole("total_steps")
    elif get("duration_s"):
        steps = round(num("duration_s") * curve.rate(requested))
    else:
        raise ValueError(f"{where}: give column 'total_steps' or 'duration_s'")
    if get("deadline_abs_s"):
        deadline = num("deadline_abs_s")
    elif get("deadline_s"):
        deadline = submit + num("deadline_s")
    else:
        raise ValueError(f"{where}: give column 'deadline_s' or 'deadline_abs_s'")
    unit = whole("gpus_per_worker", 1)
    job = TraceJob(
        job_id=job_id, submit=submit, total_steps=steps, requested_gpus=requested,
        min_gpus=whole("min_gpus", unit), max_gpus=whole("max_gpus", requested), gpus_per_worker=unit,
        deadline=deadline, curve=curve, model=model, restore_seconds=num("restore_s", 30.0),
        best_effort=get("best_effort").lower() in ("1", "true", "yes"),
    )
    for name, value in (("requested_gpus", job.requested_gpus), ("gpus_per_worker", unit),
                        ("min_gpus", job.min_gpus), ("total_steps", job.total_steps)):
        if value <= 0:
            raise ValueError(f"{where}: column '{name}' must be > 0")
    if not job.min_gpus <= job.max_gpus:
        raise ValueError(f"{where}: columns 'min_gpus' <= 'max_gpus' required")
    if job.restore_seconds < 0:
        raise ValueError(f"{where}: column 'restore_s' must be >= 0")
    return job
