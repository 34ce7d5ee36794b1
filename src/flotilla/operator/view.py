"""The operator's in-memory view of what it watches, and of its own writes still in flight.

Objects are kept by namespace/name (name alone for Nodes), trimmed to what planning reads. A pass does
not wait for its writes: an object whose status or annotation patches are on their way is shown with
them applied (`expect`) until they are answered (`settle`), so that the next pass plans with the
placements already decided and the allocator cannot give the same GPUs twice.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from flotilla.operator import training, trim
from flotilla.operator.actions import Done, PatchAnnotations, PatchStatus, object_key
from flotilla.operator.pods import holds_gpus, worker_job_uid

_TRIM = {"jobs": trim.trainingjob, "pods": trim.pod, "nodes": trim.node}
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


@dataclass
class _Written:
    """Patches this operator sent for one object: on their way (`answer_version` None), or answered and
    not yet shown by the watch."""

    patches: list
    answer_version: str | None = None
    answered_at: float | None = None


@dataclass
class View:
    """What the watches have seen. A finished job's pods are dropped (`prune`): nothing plans with them.

    resourceVersions are opaque (API conventions): they are only compared for equality. Events are taken
    in the order they arrive; what keeps a late event (one from before our own patch was answered) from
    showing the object as it was before the patch is that our patches stay shown on top of it until the
    watch has shown them (an event with the answer's resourceVersion, or one that already carries what
    the patches set) or a full list requested after the answer has (`relisted`)."""

    jobs: dict[str, dict] = field(default_factory=dict)
    nodes: dict[str, dict] = field(default_factory=dict)
    pods: dict[str, dict] = field(default_factory=dict)
    servings: dict[str, dict] = field(default_factory=dict)
    deployments: dict[str, dict] = field(default_factory=dict)
    queues: dict[str, dict] = field(default_factory=dict)  # Queue objects (cluster-scoped), by name
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    clock: Callable[[], float] = time.monotonic
    # (kind, key) -> our patches still shown on top, and the object as last seen without them.
    _written: dict[tuple[str, str], list[_Written]] = field(default_factory=dict)
    _seen: dict[tuple[str, str], dict] = field(default_factory=dict)
    # (kind, key) -> the resourceVersions the watch showed while our patches were shown on top: an answer that
    # comes after the watch showed its version (a write chain that went on to create pods) is shown already.
    _versions: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    # (kind, key) -> when the latest news about it arrived (a watch event, a deletion, a patch answer).
    _arrived: dict[tuple[str, str], float] = field(default_factory=dict)
    _created: dict[str, float] = field(default_factory=dict)  # pod key -> when this operator created it
    _applied: dict[str, tuple[str, float]] = field(default_factory=dict)  # endpoint object -> (manifest, when)
    relist_wake: asyncio.Event = field(default_factory=asyncio.Event)  # set: list every kind now
    # The finished jobs' UIDs as of the last `prune`: their pods that hold no GPUs are not taken back into the
    # view (a re-list lists them all again; a late status patch sends them again).
    _pruned: set[str] = field(default_factory=set)
    # When the first TrainingJob new to the view arrived since the loop last took it (`taken`); None: none.
    first_arrival: float | None = None
    # When the latest TrainingJob new to the view arrived, and the latest of those a pass has taken.
    last_arrival: float = -float("inf")
    taken_arrival: float = -float("inf")

    def record(self, kind: str, event: dict[str, Any]) -> bool:
        """A watch event; wakes the reconcile loop when it changed what planning reads (a heartbeat, a
        status field planning does not read, changes nothing). Returns whether it did."""
        key = key_of(event["object"])
        self._arrived[(kind, key)] = self.clock()
        if event.get("type") == "DELETED":
            changed = self._drop(kind, key)
        else:
            changed = self.put(kind, event["object"])
        if changed:
            self.wake.set()
        return changed

    def _drop(self, kind: str, key: str) -> bool:
        gone = getattr(self, kind).pop(key, None) is not None
        self._seen.pop((kind, key), None)
        self._written.pop((kind, key), None)
        self._versions.pop((kind, key), None)
        if kind == "pods":
            self._created.pop(key, None)
        return gone

    def put(self, kind: str, obj: dict[str, Any]) -> bool:
        """The object as the API server has it now (a watch event or a list), taken as it comes. Returns
        whether what planning reads changed. An object that did not change is kept as it was (the same
        dict: the planner tells changed objects by identity, flotilla.operator.reconcile.Planner)."""
        key = key_of(obj)
        store = getattr(self, kind)
        if kind == "pods":
            self._created.pop(key, None)
            if key not in store and worker_job_uid(obj) in self._pruned and not holds_gpus(obj):
                return False
        seen = _TRIM.get(kind, trim.other)(obj)
        written = self._written.get((kind, key))
        if kind == "jobs" and key not in store:
            self.last_arrival = self.clock()
            if self.first_arrival is None:
                self.first_arrival = self.last_arrival
        if not written and (kind, key) not in self._seen and _same(store.get(key), seen):
            return False
        if written:
            version = obj["metadata"].get("resourceVersion")
            if version is not None:
                self._versions.setdefault((kind, key), set()).add(version)
            shown = [i for i, w in enumerate(written)
                     if w.answer_version is not None and (w.answer_version == version or _shows(seen, w.patches))]
            if shown:  # the watch has caught up with that write, and with the ones before it
                del written[:shown[-1] + 1]
        self._seen[(kind, key)] = seen
        before = store.get(key)
        self._show(kind, key)
        return bool(store[key] != before)

    def _show(self, kind: str, key: str) -> None:
        store, k = getattr(self, kind), (kind, key)
        written = self._written.get(k)
        seen = self._seen[k] if written else self._seen.pop(k)
        if not written:
            self._written.pop(k, None)
            self._versions.pop(k, None)
        store[key] = with_patches(seen, [p for w in written or () for p in w.patches])

    def expect(self, kind: str, key: str, patches: list[PatchStatus | PatchAnnotations]) -> None:
        """Show `patches` on the object until `settle`: they are on their way to the API server."""
        store = getattr(self, kind)
        if not patches or key not in store:
            return
        self._seen.setdefault((kind, key), store[key])
        self._written.setdefault((kind, key), []).append(_Written(list(patches)))
        store[key] = with_patches(store[key], patches)

    def settle(self, kind: str, key: str, answer: dict[str, Any] | None) -> None:
        """The patches on their way were answered (`answer`: the object as the last one left it) or failed
        (None). A failed write is no longer shown; an answered one stays shown until the watch shows it."""
        k = (kind, key)
        written = self._written.get(k) or []
        sent = next((w for w in written if w.answer_version is None), None)
        if key not in getattr(self, kind):  # deleted meanwhile: an answer must not bring it back
            self._written.pop(k, None)
            self._seen.pop(k, None)
            self._versions.pop(k, None)
            return
        if sent is not None and answer is None:
            written.remove(sent)
        elif sent is not None and answer is not None:
            self._arrived[k] = self.clock()
            if answer["metadata"].get("resourceVersion") in self._versions.get(k, ()) or _shows(
                    self._seen[k], sent.patches):
                # The watch showed it before the answer came, and the writes before it: else a patch whose
                # fields later writes changed would be shown on top of every later event, for ever.
                del written[:written.index(sent) + 1]
            else:
                sent.answer_version = answer["metadata"].get("resourceVersion")
                sent.answered_at = self.clock()
                self._seen[k] = _TRIM.get(kind, trim.other)(answer)
        if k in self._seen:
            self._show(kind, key)

    def relisted(self, kind: str, objects: Iterable[dict[str, Any]], requested_at: float,
                 namespace: str | None = None) -> list[str]:
        """Reconcile one kind with a full list requested at `requested_at` (this view's clock), of one
        `namespace` (None: of all): objects missing from it are dropped (deleted while the watch was not
        looking), listed ones are taken as listed. Objects with news that arrived after the list was
        requested are left as they are: that news is at least as new. Returns the keys dropped."""
        store = getattr(self, kind)
        listed = {key_of(o): o for o in objects}
        dropped, changed = [], False
        inside = (lambda key: True) if namespace is None else (lambda key: key.startswith(namespace + "/"))
        for key in {k for k in store if inside(k)} | set(listed):
            k = (kind, key)
            if self._arrived.get(k, float("-inf")) >= requested_at:
                continue
            if key not in listed:
                dropped.append(key)
                self._drop(kind, key)
                self._arrived.pop(k, None)
                continue
            written = self._written.get(k)
            if written:  # the list is newer than the answers that came before it was requested
                written[:] = [w for w in written if w.answered_at is None or w.answered_at >= requested_at]
            changed = self.put(kind, listed[key]) or changed
        if kind == "pods":  # created before the list was requested and not in it: gone since
            for key, at in list(self._created.items()):
                if at < requested_at and key not in listed and inside(key):
                    del self._created[key]
        for k, at in list(self._arrived.items()):  # forget deletions the list has confirmed
            if k[0] == kind and at < requested_at and k[1] not in store and inside(k[1]):
                del self._arrived[k]
        if dropped or changed:  # a change the watch missed
            self.wake.set()
        return sorted(dropped)

    def taken(self) -> None:
        """A pass is about to copy the view: what woke the loop so far is in it."""
        self.wake.clear()
        self.first_arrival = None
        self.taken_arrival = self.last_arrival

    def created(self, pod_key: str, now: float) -> None:
        self._created[pod_key] = now

    def has_pod(self, pod_key: str, now: float) -> bool:
        """The pod is in the view, or this operator created it less than CREATED_TTL_SECONDS ago and its
        watch event has not come (`done`)."""
        return pod_key in self.pods or pod_key in self.done(now, 0.0).pods

    def done(self, now: float, ttl: float) -> Done:
        """What a pass planned now must not do again: pods created within CREATED_TTL_SECONDS whose watch events
        have not come, endpoint objects applied as they are within `ttl` (applied again after it, which brings
        back one deleted by hand)."""
        for key in [k for k, at in self._created.items() if k in self.pods or now - at > CREATED_TTL_SECONDS]:
            del self._created[key]
        return Done(frozenset(self._created),
                    {k: manifest for k, (manifest, at) in self._applied.items() if now - at < ttl})

    def applied(self, manifest: dict[str, Any], now: float) -> None:
        """An endpoint object (Service, InferencePool) was server-side applied as `manifest`."""
        self._applied[object_key(manifest)] = (json.dumps(manifest, sort_keys=True), now)

    def applied_recently(self, manifest: dict[str, Any], now: float, ttl: float) -> bool:
        """The same manifest was applied less than `ttl` ago: not sent again (`done`)."""
        return self.done(now, ttl).applied.get(object_key(manifest)) == json.dumps(manifest, sort_keys=True)

    def prune(self) -> None:
        """Forget the pods of finished jobs once they hold no GPUs: a pass then plans with live ones only.
        (A job not seen yet keeps its pods: at start-up the pods may be listed before the jobs.) Until the next
        prune, such pods are not taken back into the view."""
        self._pruned = {uid for body in self.jobs.values()
                        if training.is_final(body) and (uid := body["metadata"].get("uid")) is not None}
        for key, pod in list(self.pods.items()):
            if worker_job_uid(pod) in self._pruned and not holds_gpus(pod):
                del self.pods[key]


def _same(was: dict[str, Any] | None, now: dict[str, Any]) -> bool:
    """The same object but for its resourceVersion."""
    if was is None or was.keys() != now.keys():
        return False
    if any(was[k] != now[k] for k in was if k != "metadata"):
        return False
    a, b = was["metadata"], now["metadata"]
    return a.keys() == b.keys() and all(a[k] == b[k] for k in a if k != "resourceVersion")


def _shows(obj: dict[str, Any], patches: list[PatchStatus | PatchAnnotations]) -> bool:
    """`obj` already carries what `patches` set."""
    return with_patches(obj, patches) == obj


def key_of(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]
