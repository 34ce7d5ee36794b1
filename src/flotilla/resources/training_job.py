"""A TrainingJob, as the operator and the controller read it: one typed parse of the object the API
server returns. Pure. A malformed object raises ValueError naming the field."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from flotilla.resources.parse import (
    boolean,
    conditions,
    integer,
    keyed_gpus,
    mapping,
    metadata,
    number,
    optional_integer,
    parse_time,
    queue_name,
)

DEFAULT_RESTORE_SECONDS = 30.0  # spec.checkpoint.restoreSeconds's default


@dataclass(frozen=True, slots=True)
class TrainingJob:
    namespace: str
    name: str
    uid: str
    created: float | None
    # spec
    deadline: float | None  # absolute: spec.deadline, else creation + spec.deadlineSeconds
    total_steps: int
    min_gpus: int
    max_gpus: int
    gpus_per_worker: int
    throughput: tuple[tuple[int, float], ...]  # (GPUs, steps/s) as declared
    best_effort: bool
    priority: int
    checkpoint_interval_steps: int
    declared_restore_seconds: float
    pipeline_stages: int | None
    # status
    phase: str | None
    placement: Mapping[str, int]  # node -> GPUs, as recorded (entries of 0 GPUs included)
    gpus: int  # status.gpus, else the placement's sum
    steps: int  # status.progress
    steps_per_second: float
    estimated_completion: float | None
    deadline_met: bool | None
    reshards: int
    restarts: int
    checkpoint_generation: int
    checkpoint_step: int
    measured_restore_seconds: float | None  # status.checkpoint.restoreSeconds
    conditions: tuple[Mapping[str, Any], ...]
    lent_to: Mapping[str, int] = field(default_factory=dict)  # ServingDeployment key -> GPUs lent
    guaranteed_share: int = 0  # status.guaranteedShare: the share its guarantee was last planned at
    queue: str | None = None  # spec.queue: the Queue it names, if any

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def restore_seconds(self) -> float:
        """What a stop/reshard/restart costs: as the workers measured it last, else as declared."""
        return self.measured_restore_seconds if self.measured_restore_seconds is not None \
            else self.declared_restore_seconds

    def condition(self, type_: str, field_: str = "status") -> Any:
        """A field of the condition of that type; None when there is none."""
        return next((c.get(field_) for c in self.conditions if c.get("type") == type_), None)


def _throughput(spec: Mapping[str, Any]) -> tuple[tuple[int, float], ...]:
    raw = spec.get("throughput") or []
    if not isinstance(raw, list):
        raise ValueError("spec.throughput must be a list")
    points: list[tuple[int, float]] = []
    for i, p in enumerate(raw):
        gpus, sps = (p.get("gpus"), p.get("stepsPerSecond")) if isinstance(p, dict) else (None, None)
        if type(gpus) is int and isinstance(sps, (float, int)) and type(sps) is not bool:
            points.append((gpus, float(sps)))
            continue
        if not isinstance(p, Mapping):  # the slow path names the field
            raise ValueError(f"spec.throughput[{i}] must be an object")
        points.append((integer(p, "gpus", f"spec.throughput[{i}]"),
                       number(p, "stepsPerSecond", f"spec.throughput[{i}]") or 0.0))
    return tuple(points)


def parse(obj: Mapping[str, Any]) -> TrainingJob:
    namespace, name, meta = metadata(obj, namespaced=True)
    spec, status = mapping(obj, "spec", ""), mapping(obj, "status", "")
    created = parse_time(meta.get("creationTimestamp"), "metadata.creationTimestamp")
    deadline = parse_time(spec.get("deadline"), "spec.deadline")
    if deadline is None and spec.get("deadlineSeconds") is not None:
        if created is None:
            raise ValueError("spec.deadlineSeconds needs metadata.creationTimestamp")
        deadline = created + integer(spec, "deadlineSeconds", "spec")
    elasticity = mapping(spec, "elasticity", "spec")
    declared = mapping(spec, "checkpoint", "spec")
    progress = mapping(status, "progress", "status")
    checkpoint = mapping(status, "checkpoint", "status")
    placement = keyed_gpus(status, "placement", "node")
    phase = status.get("phase")
    if phase is not None and not isinstance(phase, str):
        raise ValueError("status.phase must be a string")
    restore = number(declared, "restoreSeconds", "spec.checkpoint")
    return TrainingJob(
        namespace=namespace, name=name, uid=str(meta.get("uid") or ""), created=created,
        deadline=deadline,
        total_steps=integer(spec, "totalSteps", "spec"),
        min_gpus=integer(elasticity, "minGPUs", "spec.elasticity"),
        max_gpus=integer(elasticity, "maxGPUs", "spec.elasticity"),
        gpus_per_worker=integer(elasticity, "gpusPerWorker", "spec.elasticity", default=1),
        throughput=_throughput(spec),
        best_effort=bool(boolean(spec, "bestEffort", "spec")),
        priority=integer(spec, "priority", "spec"),
        checkpoint_interval_steps=integer(declared, "intervalSteps", "spec.checkpoint"),
        declared_restore_seconds=restore if restore is not None else DEFAULT_RESTORE_SECONDS,
        pipeline_stages=optional_integer(mapping(spec, "parallelism", "spec"), "pipelineStages", "spec.parallelism")
        or None,
        phase=phase or None,
        placement=placement,
        gpus=integer(status, "gpus", "status", default=sum(placement.values())),
        steps=integer(progress, "steps", "status.progress"),
        steps_per_second=number(progress, "stepsPerSecond", "status.progress") or 0.0,
        estimated_completion=parse_time(status.get("estimatedCompletion"), "status.estimatedCompletion"),
        deadline_met=boolean(status, "deadlineMet", "status", default=None),
        reshards=integer(status, "reshards", "status"),
        restarts=integer(status, "restarts", "status"),
        checkpoint_generation=integer(checkpoint, "generation", "status.checkpoint"),
        checkpoint_step=integer(checkpoint, "step", "status.checkpoint"),
        measured_restore_seconds=number(checkpoint, "restoreSeconds", "status.checkpoint"),
        conditions=conditions(status),
        lent_to=keyed_gpus(status, "lentTo", "serving"),
        guaranteed_share=integer(status, "guaranteedShare", "status"),
        queue=queue_name(spec),
    )
