"""What the pool arbiter reads and returns: serving deployments, the cluster policy, the decision."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from flotilla.allocation.snapshot import JobDecision, JobState, NodeState


@dataclass(frozen=True)
class ServingState:
    """One ServingDeployment as the arbiter sees it."""

    key: str  # "namespace/name"
    demand_gpus: int  # what its PD planner says the SLO needs now (Plan.gpus)
    min_gpus: int
    max_gpus: int
    gpus_per_instance: int = 1  # serving grows and shrinks in whole instances of this many GPUs
    placement: Mapping[str, int] = field(default_factory=dict)  # node -> GPUs it holds now
    # The planner's demand over the forecast horizon: (from time, GPUs) steps, same clock as `now`.
    forecast: tuple[tuple[float, int], ...] = ()
    # Since when its demand has been below what it holds (from the previous ServingDecision).
    below_since: float | None = None
    # Its team's queue (flotilla.tenancy; "" = the implicit queue) and its priority within the queue.
    queue: str = ""
    priority: int = 0

    def __post_init__(self) -> None:
        for name in ("demand_gpus", "min_gpus"):
            if getattr(self, name) < 0:
                raise ValueError(f"{self.key}: {name} must be >= 0, got {getattr(self, name)}")
        if self.gpus_per_instance < 1:
            raise ValueError(f"{self.key}: gpus_per_instance must be >= 1, got {self.gpus_per_instance}")
        if self.max_gpus < max(self.min_gpus, self.gpus_per_instance):
            raise ValueError(f"{self.key}: max_gpus ({self.max_gpus}) must be >= min_gpus ({self.min_gpus}) "
                             f"and >= gpus_per_instance ({self.gpus_per_instance})")
        if any(g < 0 for _, g in self.forecast):
            raise ValueError(f"{self.key}: forecast GPUs must be >= 0")

    @property
    def gpus(self) -> int:
        return sum(self.placement.values())


@dataclass(frozen=True)
class PoolPolicy:
    """The cluster policy (Helm values `pool.*`, or the ConfigMap the operator reads).

    forecast_headroom: serving's forecast is inflated by this fraction before admission counts it
        (0.1 = plan for 10% more than the forecast).
    hold_down_seconds: serving keeps GPUs it no longer needs this long before they go back to
        training, so that noise in the demand does not resize training jobs back and forth.
    borrow_guaranteed: whether serving may take GPUs from a training job's guaranteed share (its
        minimum satisfactory share) once every surplus is used; the job's deadline is then no longer
        guaranteed and its reason says so. Off by default: an accepted deadline is a promise.
    forecast_window_seconds: the operator's forecast of a deployment's demand is the highest demand
        it had in this many seconds (so a peak seen within the window is planned for again); 0: the
        demand now. The arbiter itself takes whatever forecast it is given.
    """

    forecast_headroom: float = 0.1
    hold_down_seconds: float = 300.0
    borrow_guaranteed: bool = False
    forecast_window_seconds: float = 3600.0

    def __post_init__(self) -> None:
        if self.forecast_headroom < 0:
            raise ValueError(f"forecastHeadroom must be >= 0, got {self.forecast_headroom}")
        if self.hold_down_seconds < 0:
            raise ValueError(f"holdDownSeconds must be >= 0, got {self.hold_down_seconds}")
        if self.forecast_window_seconds < 0:
            raise ValueError(f"forecastWindowSeconds must be >= 0, got {self.forecast_window_seconds}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, object]) -> "PoolPolicy":
        """From the ConfigMap / Helm values keys (camelCase); unknown keys are an error."""
        known = {"forecastHeadroom": "forecast_headroom", "holdDownSeconds": "hold_down_seconds",
                 "borrowGuaranteed": "borrow_guaranteed", "forecastWindowSeconds": "forecast_window_seconds"}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"pool policy: unknown key(s) {', '.join(unknown)}; known: {', '.join(known)}")
        kwargs: dict[str, object] = {}
        for key, attr in known.items():
            if key not in values:
                continue
            value = values[key]
            if attr == "borrow_guaranteed":
                if not isinstance(value, bool):
                    raise ValueError(f"pool policy: {key} must be true or false, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"pool policy: {key} must be a number, got {value!r}")
            kwargs[attr] = value
        return cls(**kwargs)  # type: ignore[arg-type]


@dataclass(frozen=True)
class PoolSnapshot:
    now: float
    nodes: tuple[NodeState, ...]
    jobs: tuple[JobState, ...]
    serving: tuple[ServingState, ...]
    # node -> GPUs held by a shrinking job's old workers on their way out (counted in the nodes' foreign GPUs):
    # free in a moment, so serving may be placed on them instead of borrowing again; not given to training.
    releasing: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ServingDecision:
    key: str
    placement: Mapping[str, int]
    demanded: int  # the demand after clamping to minGPUs..maxGPUs and rounding to whole instances
    reason: str
    below_since: float | None  # feed back as ServingState.below_since next time

    @property
    def gpus(self) -> int:
        return sum(self.placement.values())


@dataclass(frozen=True)
class Loan:
    """GPUs a training job gives to a serving deployment in this decision."""

    job: str
    serving: str
    gpus: int
    from_guarantee: bool  # taken from the job's guaranteed share (policy borrow_guaranteed)


@dataclass(frozen=True)
class Transition:
    """How to carry a decision out without ever holding a GPU twice.

    1. Shrink: every holder in `shrink` goes down to its `interim` placement (training jobs
       through the resharding protocol: checkpoint, then the smaller worker set). Wait until done.
    2. Grow: every holder in `grow` goes from `interim` to its final placement.
    The interim placements are, node by node, the smaller of before and after, so they fit the
    nodes whenever the final ones do. Holders are named "tj/<key>" and "sd/<key>".
    """

    shrink: tuple[str, ...]
    grow: tuple[str, ...]
    interim: Mapping[str, Mapping[str, int]]


@dataclass(frozen=True)
class PoolDecision:
    # A job's guaranteed_gpus: what serving may not borrow (the larger of two shares, flotilla.pool.arbiter's
    # _Protected) when a ServingDeployment was short of GPUs in this decision, else the allocator's.
    jobs: Mapping[str, JobDecision]
    serving: Mapping[str, ServingDecision]
    loans: tuple[Loan, ...]
    transition: Transition
