"""Which of a node's GPUs each worker pod holds, by index. Pure.

The operator places GPU counts on nodes; a fault local to one GPU (`flotilla.health.scope`) needs to know which
pods sit on that GPU, so that only their jobs move. Each worker pod it creates gets the node's GPU indices it
holds (names.ANNOTATION_GPU_INDICES, and env names.ENV_GPU_INDICES for the workers): the lowest indices that no
other pod on the node holds and that are not out of service (names.ANNOTATION_UNHEALTHY_GPUS).

This is Flotilla's bookkeeping. Where a device plugin picks the devices (the NVIDIA device plugin does, by its
own order), the index is what Flotilla assumes; the agent's samples are per index too. See docs/health.md.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from flotilla.operator.actions import Action, CreatePod, pod_key
from flotilla.operator.pods import gpu_indices, holds_gpus, pod_gpus, worker_job_uid
from flotilla.reshard.view import worker_set_of
from flotilla.resources import names
from flotilla.resources import node as k8s_node

Body = Mapping[str, Any]
CLAIM_TTL_SECONDS = 120.0  # a pod created and not yet seen by the watch keeps its indices this long


@dataclass
class Claims:
    """Indices given to pods this operator created whose watch events have not come yet: a later pass must not
    give them again."""

    given: dict[str, tuple[str, tuple[int, ...], float]] = field(default_factory=dict)  # pod key -> node, idx, when

    def forget_seen(self, pods: Mapping[str, Body], now: float) -> None:
        self.given = {k: v for k, v in self.given.items() if k not in pods and now - v[2] < CLAIM_TTL_SECONDS}


def node_of(manifest: Body) -> str | None:
    spec = manifest.get("spec") or {}
    return spec.get("nodeName") or (spec.get("nodeSelector") or {}).get("kubernetes.io/hostname")


def _generation(pod: Body) -> str:
    return str((pod["metadata"].get("labels") or {}).get(names.LABEL_GENERATION, ""))


def by_node(pods: Mapping[str, Body]) -> dict[str, dict[str, Body]]:
    out: dict[str, dict[str, Body]] = {}
    for key, pod in pods.items():
        if (node := node_of(pod)) is not None and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            out.setdefault(node, {})[key] = pod
    return out


def taken_on(node: str, on_node: Mapping[str, Body], claims: Claims, new: Body) -> set[int]:
    """Indices held on `node` by other pods (`on_node`: the pods there, not finished): any of them but the
    terminating pods of an older worker set of the new pod's own job (they are being replaced by it)."""
    uid, generation = worker_job_uid(new), _generation(new)
    taken: set[int] = set()
    for key, pod in on_node.items():
        if (uid is not None and worker_job_uid(pod) == uid and _generation(pod) != generation
                and pod["metadata"].get("deletionTimestamp")):
            continue
        taken.update(gpu_indices(pod))
    for key, (at_node, given, _) in claims.given.items():
        if at_node == node and key not in on_node:
            taken.update(given)
    return taken


def choose(count: int, size: int, out: set[int], taken: set[int]) -> tuple[int, ...]:
    """The `count` lowest indices of a `size`-GPU node that are in service and free; where too few are free (an
    old pod still holds them), the lowest in-service ones after those. () when the node has no size known."""
    if size <= 0 or count <= 0:
        return ()
    in_service = [i for i in range(size) if i not in out]
    free = [i for i in in_service if i not in taken]
    chosen = free[:count]
    chosen += [i for i in in_service if i not in chosen][:count - len(chosen)]
    return tuple(sorted(chosen))


def with_gpu_indices(manifest: Body, indices: tuple[int, ...]) -> dict[str, Any]:
    out = copy.deepcopy(dict(manifest))
    value = ",".join(map(str, indices))
    out["metadata"].setdefault("annotations", {})[names.ANNOTATION_GPU_INDICES] = value
    for c in out["spec"].get("containers") or []:
        c.setdefault("env", []).append({"name": names.ENV_GPU_INDICES, "value": value})
    return out


def assign(plans: list[tuple[str, str, list[Action]]], pods: Mapping[str, Body], nodes: Mapping[str, Body],
           claims: Claims, now: float) -> list[tuple[str, str, list[Action]]]:
    """`plans` with each worker pod to create given its GPU indices (see the module); `claims` remembers them."""
    claims.forget_seen(pods, now)
    if not any(isinstance(a, CreatePod) for _, _, actions in plans for a in actions):
        return plans
    placed = by_node(pods)
    parsed_nodes: dict[str, k8s_node.Node] = {}
    out = []
    for kind, key, actions in plans:
        if not any(isinstance(a, CreatePod) for a in actions):
            out.append((kind, key, actions))
            continue
        mine: list[Action] = []
        for a in actions:
            node = node_of(a.manifest) if isinstance(a, CreatePod) else None
            gpus = pod_gpus(a.manifest) if isinstance(a, CreatePod) else 0
            if not isinstance(a, CreatePod) or node is None or not gpus or node not in nodes:
                mine.append(a)
                continue
            pk = pod_key(a.manifest)
            if pk in claims.given:
                indices = claims.given[pk][1]
            else:
                parsed = parsed_nodes.get(node) or parsed_nodes.setdefault(node, k8s_node.parse(nodes[node]))
                size = parsed.allocatable_gpus or parsed.capacity_gpus
                taken = taken_on(node, placed.get(node, {}), claims, a.manifest)
                indices = choose(gpus, size, set(parsed.gpus_out), taken)
                claims.given[pk] = (node, indices, now)
            mine.append(CreatePod(with_gpu_indices(a.manifest, indices)) if indices else a)
        out.append((kind, key, mine))
    return out


def on_gpus_out(jobs: Iterable[Body], nodes: Iterable[Body], pods: Iterable[Body]) -> set[str]:
    """Jobs whose current worker set holds a GPU that is out of service on its own (the node's
    names.ANNOTATION_UNHEALTHY_GPUS names its index, and the pod's names.ANNOTATION_GPU_INDICES holds it): shown
    holding nothing, so that the allocator places them afresh (on the node's other GPUs or elsewhere) and only
    they move; the other jobs on the node keep their GPUs."""
    out_by_node = {}
    for n in nodes:
        try:
            out = k8s_node.gpus_out(n["metadata"].get("annotations") or {})
        except ValueError:
            continue  # the node is not schedulable (`Node.schedulable`): every job on it moves anyway
        if out:
            out_by_node[n["metadata"]["name"]] = set(out)
    if not out_by_node:
        return set()
    current = {meta.get("uid"): (f"{meta['namespace']}/{meta['name']}", worker_set_of(body.get("status") or {}))
               for body in jobs for meta in (body["metadata"],)}
    hit = set()
    for pod in pods:
        uid = worker_job_uid(pod)
        if uid not in current or not holds_gpus(pod):
            continue
        key, worker_set = current[uid]
        generation = (pod["metadata"].get("labels") or {}).get(names.LABEL_GENERATION)
        if str(generation) == str(worker_set) and set(gpu_indices(pod)) & out_by_node.get(pod["spec"]["nodeName"],
                                                                                          set()):
            hit.add(key)
    return hit
