"""The operator's in-memory view of what it watches, and of its own writes still in flight.

Objects are kept by namespace/name (name alone for Nodes), trimmed to what planning reads. A pass does
not wait for its writes: an object whose status or annotation patches are on their way is shown with
them applied (`expect`) until they are answered (`settle`), so that the next pass plans with the
placements already decided and the allocator cannot give the same GPUs twice.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Iterable

from flotilla.operator import training, trim
from flotilla.operator.actions import PatchAnnotations, PatchStatus
from flotilla.operator.pods import holds_gpus, worker_job_uid

_TRIM = {"jobs": trim.trainingjob, "pods": trim.pod}
# A pod this operator created is not created again for this long while its watch event is late.
CREATED_TTL_SECONDS = 120.0


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, as the API server applies it: objects merge, null deletes, the rest replaces."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def with_patches(body: dict[str, Any], patches: Iterable[PatchStatus | PatchAnnotations]) -> dict[str, Any]:
    out = body
    for p in patches:
        if isinstance(p, PatchStatus):
            out = {**out, "status": merge_patch(out.get("status"), p.status)}
        else:
            meta = out["metadata"]
            out = {**out, "metadata": {**meta, "annotations": merge_patch(meta.get("annotations"), p.annotations)}}
    return out


def _version(obj: dict[str, Any]) -> int:
    return int(obj["metadata"].get("resourceVersion", 0))


@dataclass
class View:
    """What the watches have seen. A finished job's pods are dropped (`prune`): nothing plans with them."""

    jobs: dict[str, dict] = field(default_factory=dict)
    nodes: dict[str, dict] = field(default_factory=dict)
    pods: dict[str, dict] = field(default_factory=dict)
    servings: dict[str, dict] = field(default_factory=dict)
    deployments: dict[str, dict] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    # (kind, key) -> patches on their way, and the object as last seen without them.
    _pending: dict[tuple[str, str], list] = field(default_factory=dict)
    _seen: dict[tuple[str, str], dict] = field(default_factory=dict)
    _created: dict[str, float] = field(default_factory=dict)  # pod key -> when this operator created it

    def record(self, kind: str, event: dict[str, Any]) -> None:
        if event.get("type") == "DELETED":
            key = key_of(event["object"])
            getattr(self, kind).pop(key, None)
            self._seen.pop((kind, key), None)
            self._created.pop(key, None)
        else:
            self.put(kind, event["object"])
        self.wake.set()

    def put(self, kind: str, obj: dict[str, Any]) -> None:
        store, key = getattr(self, kind), key_of(obj)
        if kind == "pods":
            self._created.pop(key, None)
        pending = self._pending.get((kind, key))
        old = self._seen.get((kind, key)) if pending is not None else store.get(key)
        # Keep the newer copy: the loop may already hold a patch response newer than a late event.
        if old is not None and _version(obj) < _version(old):
            return
        seen = _TRIM.get(kind, trim.other)(obj)
        if pending is None:
            store[key] = seen
        else:
            self._seen[(kind, key)] = seen
            store[key] = with_patches(seen, pending)

    def expect(self, kind: str, key: str, patches: list[PatchStatus | PatchAnnotations]) -> None:
        """Show `patches` on the object until `settle`: they are on their way to the API server."""
        store = getattr(self, kind)
        if not patches or key not in store:
            return
        self._seen.setdefault((kind, key), store[key])
        self._pending.setdefault((kind, key), []).extend(patches)
        store[key] = with_patches(store[key], patches)

    def settle(self, kind: str, key: str, answer: dict[str, Any] | None) -> None:
        """The patches were answered (`answer`: the object as the last one left it) or failed (None):
        from now on the view shows what the API server has."""
        self._pending.pop((kind, key), None)
        seen = self._seen.pop((kind, key), None)
        store = getattr(self, kind)
        if key not in store:  # deleted meanwhile: an answer must not bring it back
            return
        if seen is not None:
            store[key] = seen
        if answer is not None:
            self.put(kind, answer)

    def created(self, pod_key: str, now: float) -> None:
        self._created[pod_key] = now

    def has_pod(self, pod_key: str, now: float) -> bool:
        """The pod is in the view, or this operator created it less than CREATED_TTL_SECONDS ago and its
        watch event has not come (a pass planned on an older copy of the view may want it created again)."""
        if pod_key in self.pods:
            return True
        at = self._created.get(pod_key)
        if at is not None and now - at <= CREATED_TTL_SECONDS:
            return True
        self._created.pop(pod_key, None)
        return False

    def prune(self) -> None:
        """Forget the pods of finished jobs once they hold no GPUs: a pass then plans with live ones only.
        (A job not seen yet keeps its pods: at start-up the pods may be listed before the jobs.)"""
        finished = {body["metadata"].get("uid") for body in self.jobs.values() if training.is_final(body)}
        for key, pod in list(self.pods.items()):
            if (uid := worker_job_uid(pod)) is not None and uid in finished and not holds_gpus(pod):
                del self.pods[key]


def key_of(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]
