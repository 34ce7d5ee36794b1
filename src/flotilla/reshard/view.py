"""What the resharding protocol reads of a TrainingJob and its worker pods: typed, parsed once from the
object the API server returns. Pure.

Three counters, three names:
* `spec_generation` — Kubernetes' metadata.generation (the spec's version), echoed as status.observedGeneration;
* `worker_set` — the number of the worker set that runs now (status.workerGeneration; the pods' label
  flotilla.dev/generation, their names' `g<N>`, FLOTILLA_GENERATION, the progress annotation's "generation").
  A new worker set is made at every reshard and at every restart after a crash;
* `CheckpointStatus.requested` / `.written` — the number of the last checkpoint asked for and the last one
  rank 0 wrote (status.checkpoint.requestedGeneration / .generation; the request and ack annotations'
  "generation").
`reshards` and `restarts` count worker-set replacements by cause: a reshard (a new size or placement, or a
checkpoint asked for to replace the set) or a restart after a worker failed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from flotilla.reshard import encoding
from flotilla.resources import parse

Body = Mapping[str, Any]


@dataclass(frozen=True)
class CheckpointStatus:
    """status.checkpoint."""

    requested: int = 0  # requestedGeneration
    written: int = 0  # generation: acknowledged by rank 0, or consumed by a switch that did not wait for it
    step: int | None = None
    time: str | None = None
    requested_at: str | None = None
    reason: str = ""
    restore_seconds: float | None = None

    @property
    def pending(self) -> bool:
        """A checkpoint was asked for and neither written nor consumed."""
        return self.requested > self.written

    @staticmethod
    def of(raw: Mapping[str, Any]) -> "CheckpointStatus":
        step = raw.get("step")
        restore = raw.get("restoreSeconds")
        return CheckpointStatus(
            requested=int(raw.get("requestedGeneration", 0)), written=int(raw.get("generation", 0)),
            step=int(step) if step is not None else None, time=raw.get("time"), requested_at=raw.get("requestedAt"),
            reason=str(raw.get("reason") or ""),
            restore_seconds=float(restore) if isinstance(restore, (int, float)) else None)


@dataclass(frozen=True)
class Request:
    """The checkpoint-request annotation."""

    generation: int
    reason: str
    requested_by: str
    restart: bool
    time: str | None

    @staticmethod
    def of(raw: Mapping[str, Any] | None) -> "Request | None":
        if raw is None:
            return None
        return Request(int(raw["generation"]), str(raw.get("reason", "")), str(raw.get("requestedBy", "someone")),
                       bool(raw.get("restart")), raw.get("time"))


@dataclass(frozen=True)
class Ack:
    """The checkpoint-ack annotation."""

    generation: int
    step: int
    time: str | None


@dataclass(frozen=True)
class WorkerPod:
    """One worker pod of the job, as the protocol reads it."""

    name: str
    uid: str | None
    worker_set: int  # label flotilla.dev/generation
    rank: int
    node: str | None
    phase: str  # Pending, Running, Succeeded, Failed
    started: float | None  # status.startTime
    terminating: bool  # metadata.deletionTimestamp set
    holds_gpus: bool  # bound, not finished: its GPUs are not free


@dataclass(frozen=True)
class JobView:
    """A TrainingJob as the protocol reads it (`of` parses the object)."""

    namespace: str
    name: str
    uid: str
    created: float
    spec_generation: Any
    gpus_per_worker: int
    phase: str | None
    message: str | None
    worker_set: int
    reshards: int
    restarts: int
    placement: Mapping[str, int]  # node -> GPUs, nodes with none left out
    checkpoint: CheckpointStatus
    progress: Mapping[str, Any] | None  # rank 0's latest report on this worker set, else status.progress
    status: Mapping[str, Any] = field(repr=False)  # the rest, read as written (conditions, outlook, policy)
    request: Request | None = None
    ack: Ack | None = None
    lent_to: Mapping[str, int] = field(default_factory=dict)

    @property
    def recorded_progress(self) -> Mapping[str, Any]:
        return self.status.get("progress") or {}

    @staticmethod
    def of(body: Body) -> "JobView":
        meta, status = body["metadata"], body.get("status") or {}
        notes = meta.get("annotations")
        ack = encoding.parse_ack(notes)
        worker_set = worker_set_of(status)
        return JobView(
            namespace=meta["namespace"], name=meta["name"], uid=str(meta.get("uid") or ""),
            created=parse.parse_time(meta.get("creationTimestamp"), "metadata.creationTimestamp") or 0.0,
            spec_generation=meta.get("generation"),
            gpus_per_worker=int(((body.get("spec") or {}).get("elasticity") or {}).get("gpusPerWorker", 1)),
            phase=status.get("phase") or None, message=status.get("message"),
            worker_set=worker_set, reshards=int(status.get("reshards", 0)), restarts=int(status.get("restarts", 0)),
            placement={n: g for n, g in parse.keyed_gpus(status, "placement", "node").items() if g},
            checkpoint=CheckpointStatus.of(status.get("checkpoint") or {}),
            progress=progress_of(notes, status, worker_set),
            status=status,
            request=Request.of(encoding.parse_request(notes)),
            ack=Ack(int(ack["generation"]), int(ack["step"]), ack.get("time")) if ack else None,
            lent_to={sd: g for sd, g in parse.keyed_gpus(status, "lentTo", "serving").items() if g},
        )


def worker_set_of(status: Mapping[str, Any]) -> int:
    """status.workerGeneration; status.reshards for an object written before that field (it was both)."""
    value = status.get("workerGeneration")
    return int(value) if value is not None else int(status.get("reshards", 0))


def progress_of(notes: Mapping[str, str] | None, status: Mapping[str, Any], worker_set: int) -> dict[str, Any] | None:
    """Rank 0's latest report (annotation) from the current worker set, else what status holds."""
    p = encoding.parse_progress(notes)
    if p and int(p.get("generation", 0)) >= worker_set:
        out = {"steps": int(p["steps"]), "stepsPerSecond": float(p.get("stepsPerSecond", 0.0)),
               "updatedAt": p.get("time") or encoding.rfc3339(0)}
        if p.get("checkpointStep") is not None:
            out["checkpointStep"] = int(p["checkpointStep"])
        if isinstance(p.get("restoreSeconds"), (int, float)) and p["restoreSeconds"] >= 0:
            out["restoreSeconds"] = round(float(p["restoreSeconds"]), 2)
        return out
    recorded = status.get("progress")
    return dict(recorded) if recorded else None
