"""Which instance configurations the planner may offer: those whose latency model was checked.

A shipped profile carries, per configuration (kind of instance and GPUs per instance), the worst
relative error of the planner's predicted goodput per GPU against a measurement it was not fitted
from (`bench/serving_model.py`: the engine double, its own iteration-level scheduling priced by the
profile's published kernel timings). A configuration whose error exceeds PREDICTION_TOLERANCE either
way is not offered: its plans could not be trusted. Configurations without a measurement (inline
profiles, OPT-66B) are offered, and docs/serving.md says they are unvalidated.
"""

from __future__ import annotations

from typing import Literal

PREDICTION_TOLERANCE = 0.15

Kind = Literal["prefill", "decode", "colocated"]


def offered(errors: dict[tuple[str, int], float], kind: Kind, gpus: int) -> bool:
    """False when the configuration was measured and its prediction error is outside the tolerance."""
    error = errors.get((kind, gpus))
    return error is None or abs(error) <= PREDICTION_TOLERANCE
