"""Glue to the Kubernetes API: the mirror sync loop, `KubeActions`, and TokenReview.

Thin by design (parsing is `flotilla.controller.mirror`, storage is
`flotilla.controller.store`); exercised by the e2e suite against a real API server.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from flotilla import kubeapi
from flotilla.controller.actions import ClusterActionError, ObjectNotFound
from flotilla.controller.auth import Identity
from flotilla.controller.metrics import ControllerMetrics
from flotilla.controller.mirror import (
    GROUP,
    HEALTH_CONDITION,
    UNHEALTHY_TAINT,
    VERSION,
    parse_node,
    parse_serving_deployment,
    parse_training_job,
)
from flotilla.controller.store import Store, SyncResult

log = logging.getLogger(__name__)


WATCH_SECONDS = 300  # the API server ends each watch after this long; the sync re-lists then


def load_config() -> client.ApiClient:
    """In-cluster when running in a pod, else KUBECONFIG / ~/.kube/config. Every call has a timeout
    (flotilla.kubeapi) and the User-Agent flotilla-controller/<host>_<pid>."""
    return kubeapi.connect("flotilla-controller")


def _wrap(e: ApiException, what: str) -> ClusterActionError:
    if e.status == 404:
        return ObjectNotFound(what)
    return ClusterActionError(f"{what}: {e.status} {e.reason}")


class KubeActions:
    def __init__(self, api: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    def _patch_custom(self, plural: str, namespace: str, name: str, body: dict[str, Any]) -> None:
        try:
            self.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, plural, name, body)
        except ApiException as e:
            raise _wrap(e, f"{plural}/{namespace}/{name}") from None

    def annotate(self, plural: str, namespace: str, name: str, key: str, value: str) -> None:
        self._patch_custom(plural, namespace, name, {"metadata": {"annotations": {key: value}}})

    def patch_spec(self, plural: str, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self._patch_custom(plural, namespace, name, {"spec": patch})

    def patch_status(self, plural: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        try:
            self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, plural, name,
                                                              {"status": status})
        except ApiException as e:
            raise _wrap(e, f"{plural}/{namespace}/{name}") from None

    def list_objects(self, plural: str) -> list[dict[str, Any]]:
        try:
            return self.custom.list_cluster_custom_object(GROUP, VERSION, plural)["items"]
        except ApiException as e:
            raise _wrap(e, plural) from None

    def set_unschedulable(self, node: str, unschedulable: bool) -> None:
        try:
            self.core.patch_node(node, {"spec": {"unschedulable": unschedulable}})
        except ApiException as e:
            raise _wrap(e, f"node/{node}") from None

    def set_node_health(self, node: str, healthy: bool, reason: str, message: str,
                        effect: str = "NoSchedule") -> None:
        now = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
        try:
            current = self.core.read_node(node)
            taints = [self.core.api_client.sanitize_for_serialization(t) for t in current.spec.taints or []
                      if t.key != UNHEALTHY_TAINT]
            if not healthy:
                value = re.sub(r"[^A-Za-z0-9_.-]", "-", reason)[:63].strip("-_.") or "unhealthy"
                taints.append({"key": UNHEALTHY_TAINT, "value": value, "effect": effect})
            # Taints have no merge key: send the whole list, guarded by the resourceVersion we read.
            self.core.patch_node(node, {"metadata": {"resourceVersion": current.metadata.resource_version},
                                        "spec": {"taints": taints}})
            self.core.patch_node_status(node, {"status": {"conditions": [{
                "type": HEALTH_CONDITION, "status": "True" if healthy else "False", "reason": reason,
                "message": message, "lastTransitionTime": now, "lastHeartbeatTime": now}]}})
            self.core.create_namespaced_event("default", {
                "metadata": {"generateName": f"{node}.flotilla-", "namespace": "default"},
                "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": current.metadata.uid},
                "reason": "GPUHealthy" if healthy else "GPUUnhealthy",
                "message": f"{reason}: {message}"[:1024], "type": "Normal" if healthy else "Warning",
                "source": {"component": "flotilla-controller"}, "reportingComponent": "flotilla-controller",
                "firstTimestamp": now, "lastTimestamp": now, "count": 1})
        except ApiException as e:
            raise _wrap(e, f"node/{node}") from None


@dataclass(frozen=True)
class MirroredKind:
    kind: str
    parse: Callable[[Mapping[str, Any]], Any]
    upsert: Callable[[Store, Any], SyncResult]
    key: Callable[[Any], str]


KINDS = (
    MirroredKind("TrainingJob", parse_training_job, Store.upsert_job, lambda r: r.key),
    MirroredKind("ServingDeployment", parse_serving_deployment, Store.upsert_serving, lambda r: r.key),
    MirroredKind("Node", parse_node, Store.upsert_node, lambda r: r.name),
)


class Sync:
    """Mirrors TrainingJobs, ServingDeployments and Nodes into the store: list, then watch; re-list on any error."""

    def __init__(self, api: client.ApiClient, store: Store, metrics: ControllerMetrics) -> None:
        self.api, self.store, self.metrics = api, store, metrics
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self._stop = threading.Event()

    def _lister(self, kind: str) -> Callable[..., Any]:
        if kind == "Node":
            return self.core.list_node
        plural = {"TrainingJob": "trainingjobs", "ServingDeployment": "servingdeployments"}[kind]
        return lambda **kw: self.custom.list_cluster_custom_object(GROUP, VERSION, plural, **kw)

    def _as_dict(self, obj: Any) -> Mapping[str, Any]:
        return obj if isinstance(obj, Mapping) else self.api.sanitize_for_serialization(obj)

    def apply(self, mk: MirroredKind, event_type: str, obj: Mapping[str, Any]) -> str | None:
        """Store one watch event; -> the object's key, None when it is malformed (logged, skipped)."""
        try:
            record = mk.parse(obj)
        except ValueError as e:
            name = (obj.get("metadata") or {}).get("name")
            log.warning("ignoring malformed %s %s: %s", mk.kind, name, e)
            return None
        if event_type == "DELETED":
            self.store.delete_object(mk.kind, mk.key(record))
        else:
            result = mk.upsert(self.store, record)
            self.metrics.decided(result.decisions, result.reshard_seconds)
        return mk.key(record)

    def run_kind(self, mk: MirroredKind) -> None:
        lister = self._lister(mk.kind)
        while not self._stop.is_set():
            try:
                listed = self._as_dict(lister())
                keys = {key for obj in listed.get("items") or [] if (key := self.apply(mk, "ADDED", obj))}
                self.store.keep_only(mk.kind, keys)
                version = (listed.get("metadata") or {}).get("resourceVersion")
                # A read timeout a little past the server's: a watch on a connection that went silent ends too.
                timeout = getattr(self.api, "timeout", kubeapi.DEFAULT_TIMEOUT_SECONDS)
                for event in watch.Watch().stream(lister, resource_version=version, timeout_seconds=WATCH_SECONDS,
                                                  _request_timeout=(timeout, WATCH_SECONDS + timeout)):
                    if self._stop.is_set():
                        return
                    self.apply(mk, event["type"], self._as_dict(event["object"]))
            except Exception as e:  # the loop must survive API server restarts and expired resourceVersions
                log.warning("sync of %s: %s; re-listing in 2 s", mk.kind, e)
                self._stop.wait(2.0)

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self.run_kind, args=(mk,), name=f"sync-{mk.kind}", daemon=True)
                   for mk in KINDS]
        for t in threads:
            t.start()
        return threads

    def stop(self) -> None:
        self._stop.set()


def token_reviewer(api: client.ApiClient, admins: set[str], ttl_s: float = 60.0) -> Callable[[str], Identity | None]:
    """Accept ServiceAccount (and other) tokens the API server vouches for: role admin for usernames in
    `admins`, read otherwise. Answers are cached by the token's hash for ttl_s."""
    auth = client.AuthenticationV1Api(api)
    cache: dict[bytes, tuple[float, Identity | None]] = {}

    def review(token: str) -> Identity | None:
        digest = hashlib.sha256(token.encode()).digest()
        hit = cache.get(digest)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        try:
            status = auth.create_token_review(
                client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token))).status
        except ApiException as e:
            log.warning("TokenReview failed: %s %s", e.status, e.reason)
            return None
        who = None
        if status.authenticated and status.user is not None:
            name = status.user.username
            who = Identity(name, "admin" if name in admins else "read")
        if len(cache) > 10_000:
            cache.clear()
        cache[digest] = (time.monotonic() + ttl_s, who)
        return who

    return review
