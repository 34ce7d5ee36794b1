"""The controller's one applier: its deciders (the health responder, the serving re-planner) return actions,
and `Applier.apply` writes them, in order — to the cluster (through `ClusterActions`), the database and the
metrics. A decider reads what it needs and keeps its own memory, but writes nothing itself, so what it decided
can be read (and tested) as a list. A failed cluster write raises `ClusterActionError` and stops the list there,
as the deciders' callers expect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence, Union

from flotilla.controller import checkpoints
from flotilla.controller.actions import ClusterActions
from flotilla.controller.metrics import ControllerMetrics
from flotilla.controller.mirror import DecisionRecord
from flotilla.controller.store import Store

TERMINAL = ("Succeeded", "Failed", "Rejected")


@dataclass(frozen=True)
class Record:
    """A decision for the history (and flotilla_decisions_total)."""

    decision: DecisionRecord


@dataclass(frozen=True)
class ApplyFields:
    """Server-side apply of the controller's fields on a Flotilla custom object."""

    plural: str
    namespace: str
    name: str
    fields: dict[str, Any]


@dataclass(frozen=True)
class SetNodeHealth:
    """The node's FlotillaGPUHealthy condition and unhealthy taint (`effect`), in the cluster and the mirror."""

    node: str
    healthy: bool
    reason: str
    message: str
    effect: str = "NoSchedule"


@dataclass(frozen=True)
class CheckpointJobsOn:
    """A checkpoint request to every unfinished job on `node` (`restart`: it cannot write one)."""

    node: str
    reason: str
    restart: bool


@dataclass(frozen=True)
class SetGpusOut:
    """The node's GPUs out of service on their own ({index: why}; {} returns them), in the cluster and the mirror."""

    node: str
    gpus_out: dict[int, str]
    message: str


@dataclass(frozen=True)
class CheckpointJobsOnGpus:
    """A checkpoint request to every unfinished job with a worker pod on one of `gpus` of `node`, and to no other.
    `restart`: the fault leaves the GPU unable to write one; a job whose rank 0 is elsewhere still writes it (its
    ranks on healthy GPUs hold the state), one whose rank 0 sat on the GPU restarts from its last checkpoint."""

    node: str
    gpus: tuple[int, ...]
    reason: str
    restart: bool


@dataclass(frozen=True)
class Remember:
    """What decider `kind` must remember about `key` across a restart (None: forget it)."""

    kind: str
    key: str
    value: dict[str, Any] | None = None


@dataclass(frozen=True)
class CountDetection:
    kind: str
    latency_s: float


@dataclass(frozen=True)
class CountSuppressed:
    reason: str


Action = Union[Record, ApplyFields, SetNodeHealth, CheckpointJobsOn, SetGpusOut, CheckpointJobsOnGpus, Remember,
               CountDetection, CountSuppressed]


class Applier:
    def __init__(self, store: Store, actions: ClusterActions, metrics: ControllerMetrics) -> None:
        self.store, self.actions, self.metrics = store, actions, metrics

    def apply(self, actions: Sequence[Action]) -> None:
        for a in actions:
            self._one(a)

    def _one(self, a: Action) -> None:
        if isinstance(a, Record):
            self.store.record([a.decision])
            self.metrics.decided([a.decision])
        elif isinstance(a, ApplyFields):
            self.actions.apply(a.plural, a.namespace, a.name, a.fields)
        elif isinstance(a, SetNodeHealth):
            self.actions.set_node_health(a.node, a.healthy, a.reason, a.message, effect=a.effect)
            if a.healthy:
                self.store.set_node_fields(a.node, healthy=True, taint=None, health_reason=None, health_message=None)
            else:
                self.store.set_node_fields(a.node, healthy=False, taint={"value": a.reason, "effect": a.effect},
                                           health_reason=a.reason, health_message=a.message)
        elif isinstance(a, CheckpointJobsOn):
            for job in self.store.jobs_on_node(a.node):
                if job.phase not in TERMINAL:
                    checkpoints.request(self.store, self.actions, self.metrics, job.key, a.reason, a.restart,
                                        actor="controller", requested_by="controller")
        elif isinstance(a, SetGpusOut):
            self.actions.set_gpus_out(a.node, a.gpus_out, a.message)
            self.store.set_node_fields(a.node, gpus_out={str(g): why for g, why in sorted(a.gpus_out.items())} or None)
        elif isinstance(a, CheckpointJobsOnGpus):
            holders = self.actions.workers_on_gpus(a.node, a.gpus)
            for key in sorted({h.job for h in holders}):
                found = self.store.job(key)
                if found is None or found[0].phase in TERMINAL:
                    continue
                rank0_lost = any(h.rank == 0 for h in holders if h.job == key)
                checkpoints.request(self.store, self.actions, self.metrics, key, a.reason, a.restart and rank0_lost,
                                    actor="controller", requested_by="controller")
        elif isinstance(a, Remember):
            self.store.remember(a.kind, a.key, a.value)
        elif isinstance(a, CountDetection):
            self.metrics.detected(a.kind, a.latency_s)
        elif isinstance(a, CountSuppressed):
            self.metrics.health_actions_suppressed.labels(a.reason).inc()
