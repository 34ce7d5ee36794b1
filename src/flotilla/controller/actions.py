"""What the controller may do to the cluster, as one small interface.

The controller never creates pods: it patches TrainingJobs and
ServingDeployments (annotations, spec fields), server-side applies the
fields it owns (a ServingDeployment's `spec.plan` and observed-load
annotation), and patches Nodes (cordon, the `flotilla.dev/unhealthy` taint,
the `FlotillaGPUHealthy` condition); the operator reacts. It never writes a
Flotilla object's status: the operator is its one writer. `flotilla.controller.kube.KubeActions` does it through the
API server, `RecordingActions` records the calls (unit tests),
`OfflineActions` refuses them (`--no-kubernetes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol, Sequence


class ClusterActionError(Exception):
    """The API server refused or failed an action."""


class ObjectNotFound(ClusterActionError):
    pass


class ClusterUnavailable(ClusterActionError):
    """The controller runs without a cluster connection."""


@dataclass(frozen=True)
class GpuHolder:
    """A worker pod on a GPU: its TrainingJob (namespace/name), its rank and the GPUs it holds."""

    job: str
    pod: str
    rank: int
    gpus: tuple[int, ...]


class ClusterActions(Protocol):
    def annotate(self, plural: str, namespace: str, name: str, key: str, value: str) -> None:
        """Set one annotation on a Flotilla custom object (plural: trainingjobs | servingdeployments)."""

    def patch_spec(self, plural: str, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """Merge `patch` into a Flotilla custom object's spec."""

    def apply(self, plural: str, namespace: str, name: str, fields: dict[str, Any]) -> None:
        """Server-side apply `fields` ({"metadata": {"annotations": ...}, "spec": ...}) to an existing Flotilla
        custom object as field manager `flotilla-controller`, taking them over from any other manager. The
        controller then owns exactly these fields: one it applied before and leaves out now is removed."""

    def list_objects(self, plural: str) -> list[dict[str, Any]]:
        """Every Flotilla custom object of a kind, in all namespaces, as the API server returns them."""

    def ready_pods(self, namespace: str, selector: dict[str, str]) -> list[tuple[str, str]]:
        """(pod name, pod IP) of each Ready pod matching the label selector (what a Service with that
        selector routes to)."""

    def set_unschedulable(self, node: str, unschedulable: bool) -> None:
        """Cordon (True) or uncordon (False) a node."""

    def set_node_health(self, node: str, healthy: bool, reason: str, message: str,
                        effect: str = "NoSchedule") -> None:
        """Set the FlotillaGPUHealthy condition; add (unhealthy) or remove (healthy) the unhealthy taint."""

    def post_event(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Post an Event about `involved` ({"kind", "name", "namespace", ...}), e.g. the controller's own Pod."""

    def set_gpus_out(self, node: str, gpus_out: dict[int, str], message: str) -> None:
        """Write the node's out-of-service GPUs ({index: why}; {} returns them all): its
        flotilla.dev/unhealthy-gpus annotation, the FlotillaGPUsOutOfService condition and an Event."""

    def workers_on_gpus(self, node: str, gpus: Sequence[int]) -> list[GpuHolder]:
        """The worker pods on `node` that hold any of `gpus` (their flotilla.dev/gpu-indices)."""


@dataclass
class RecordingActions:
    """Records every call as (method, args...) and changes nothing; `fail` makes every call raise it.
    `objects` is what `list_objects` answers, by plural."""

    calls: list[tuple[Any, ...]] = field(default_factory=list)
    fail: ClusterActionError | None = None
    objects: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    pods: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # "ns/role" -> (pod, IP) for ready_pods
    holders: dict[str, list[GpuHolder]] = field(default_factory=dict)  # node -> worker pods, for workers_on_gpus

    def _call(self, *call: Any) -> None:
        if self.fail is not None:
            raise self.fail
        self.calls.append(call)

    def annotate(self, plural: str, namespace: str, name: str, key: str, value: str) -> None:
        self._call("annotate", plural, namespace, name, key, value)

    def patch_spec(self, plural: str, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self._call("patch_spec", plural, namespace, name, patch)

    def apply(self, plural: str, namespace: str, name: str, fields: dict[str, Any]) -> None:
        self._call("apply", plural, namespace, name, fields)

    def list_objects(self, plural: str) -> list[dict[str, Any]]:
        if self.fail is not None:
            raise self.fail
        return list(self.objects.get(plural, []))

    def ready_pods(self, namespace: str, selector: dict[str, str]) -> list[tuple[str, str]]:
        if self.fail is not None:
            raise self.fail
        return list(self.pods.get(f"{namespace}/{selector.get('flotilla.dev/role')}", []))

    def set_unschedulable(self, node: str, unschedulable: bool) -> None:
        self._call("set_unschedulable", node, unschedulable)

    def set_node_health(self, node: str, healthy: bool, reason: str, message: str,
                        effect: str = "NoSchedule") -> None:
        self._call("set_node_health", node, healthy, reason, message, effect)

    def post_event(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self._call("post_event", involved, type_, reason, message)

    def set_gpus_out(self, node: str, gpus_out: dict[int, str], message: str) -> None:
        self._call("set_gpus_out", node, dict(gpus_out), message)

    def workers_on_gpus(self, node: str, gpus: Sequence[int]) -> list[GpuHolder]:
        if self.fail is not None:
            raise self.fail
        return [h for h in self.holders.get(node, []) if set(h.gpus) & set(gpus)]


class OfflineActions:
    """For `--no-kubernetes`: every action fails with a message saying why."""

    def _refuse(self, *_: Any, **__: Any) -> NoReturn:
        raise ClusterUnavailable("the controller runs with --no-kubernetes; cluster actions are unavailable")

    annotate = patch_spec = apply = list_objects = ready_pods = set_unschedulable = set_node_health = post_event = _refuse
    set_gpus_out = workers_on_gpus = _refuse
