"""Glue to the Kubernetes API: the mirror sync loop, `KubeActions`, TokenReview and SubjectAccessReview.

Thin by design (parsing is `flotilla.controller.mirror`, storage is
`flotilla.controller.store`); exercised by the e2e suite against a real API server.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Mapping, Sequence, cast

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from flotilla import GROUP, VERSION, kubeapi
from flotilla.controller.actions import ClusterActionError, GpuHolder, ObjectNotFound
from flotilla.controller.auth import NO_ROLE, Identity, ReviewUnavailable
from flotilla.controller.db import is_outage
from flotilla.controller.ingest_auth import NODE_NAME_EXTRA, StatsAccess
from flotilla.controller.metrics import ControllerMetrics
from flotilla.controller.mirror import parse_node, parse_serving_deployment, parse_training_job
from flotilla.controller.queues import parse_queue
from flotilla.controller.store import Store, SyncResult
from flotilla.operator.pods import gpu_indices_in
from flotilla.operator.recorder import EventRecorder
from flotilla.resources.names import (
    ANNOTATION_UNHEALTHY_GPUS,
    GPU_RESOURCE,
    LABEL_JOB,
    LABEL_RANK,
    LABEL_ROLE,
    LABEL_SERVING,
    NODE_CONDITION_GPUS_OUT,
    NODE_CONDITION_HEALTHY,
    ROLE_WORKER,
    TAINT_UNHEALTHY,
    Reason,
)

log = logging.getLogger(__name__)
FIELD_MANAGER = "flotilla-controller"


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
        self.events = EventRecorder(self.core, FIELD_MANAGER)

    def _patch_custom(self, plural: str, namespace: str, name: str, body: dict[str, Any]) -> None:
        try:
            self.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, plural, name, body)
        except ApiException as e:
            raise _wrap(e, f"{plural}/{namespace}/{name}") from None

    def annotate(self, plural: str, namespace: str, name: str, key: str, value: str) -> None:
        self._patch_custom(plural, namespace, name, {"metadata": {"annotations": {key: value}}})

    def patch_spec(self, plural: str, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self._patch_custom(plural, namespace, name, {"spec": patch})

    def apply(self, plural: str, namespace: str, name: str, fields: dict[str, Any]) -> None:
        kind = {"trainingjobs": "TrainingJob", "servingdeployments": "ServingDeployment"}[plural]
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, **fields,
                "metadata": {**fields.get("metadata", {}), "name": name, "namespace": namespace}}
        try:
            # An apply to an object deleted meanwhile would create it: refused (the chart gives the controller
            # no create verb, and the spec's required fields are missing), so no ghost comes back.
            self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, name, body, field_manager=FIELD_MANAGER, force=True,
                _content_type="application/apply-patch+yaml")
        except ApiException as e:
            raise _wrap(e, f"{plural}/{namespace}/{name}") from None

    def list_objects(self, plural: str) -> list[dict[str, Any]]:
        try:
            listed: Any = self.custom.list_cluster_custom_object(GROUP, VERSION, plural)
            return list(listed["items"])
        except ApiException as e:
            raise _wrap(e, plural) from None

    def ready_pods(self, namespace: str, selector: dict[str, str]) -> list[tuple[str, str]]:
        try:
            pods = self.core.list_namespaced_pod(
                namespace, label_selector=",".join(f"{k}={v}" for k, v in sorted(selector.items()))).items
        except ApiException as e:
            raise _wrap(e, f"pods in {namespace}") from None
        ready = []
        for p in pods:
            meta, status = p.metadata, p.status
            if (meta is not None and status is not None and status.pod_ip and meta.deletion_timestamp is None
                    and any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])):
                ready.append((str(meta.name), str(status.pod_ip)))
        return sorted(ready)

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
            meta = current.metadata
            assert meta is not None  # the API server always answers an object with its metadata
            taints = [self.core.api_client.sanitize_for_serialization(t)
                      for t in (current.spec.taints if current.spec else None) or [] if t.key != TAINT_UNHEALTHY]
            if not healthy:
                value = re.sub(r"[^A-Za-z0-9_.-]", "-", reason)[:63].strip("-_.") or "unhealthy"
                taints.append({"key": TAINT_UNHEALTHY, "value": value, "effect": effect})
            # Taints have no merge key: send the whole list, guarded by the resourceVersion we read.
            self.core.patch_node(node, {"metadata": {"resourceVersion": meta.resource_version},
                                        "spec": {"taints": taints}})
            self.core.patch_node_status(node, {"status": {"conditions": [{
                "type": NODE_CONDITION_HEALTHY, "status": "True" if healthy else "False", "reason": reason,
                "message": message, "lastTransitionTime": now, "lastHeartbeatTime": now}]}})
            self.events.record({"apiVersion": "v1", "kind": "Node", "name": node, "uid": meta.uid},
                               "Normal" if healthy else "Warning",
                               Reason.GPU_HEALTHY if healthy else Reason.GPU_UNHEALTHY, f"{reason}: {message}")
        except ApiException as e:
            raise _wrap(e, f"node/{node}") from None

    def set_gpus_out(self, node: str, gpus_out: dict[int, str], message: str) -> None:
        now = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
        value = json.dumps({str(g): why for g, why in sorted(gpus_out.items())}) if gpus_out else None
        out = ", ".join(f"GPU {g} ({why})" for g, why in sorted(gpus_out.items()))
        try:
            current = self.core.read_node(node)
            meta = current.metadata
            assert meta is not None
            self.core.patch_node(node, {"metadata": {"annotations": {ANNOTATION_UNHEALTHY_GPUS: value}}})
            self.core.patch_node_status(node, {"status": {"conditions": [{
                "type": NODE_CONDITION_GPUS_OUT, "status": "True" if gpus_out else "False",
                "reason": "GPUOutOfService" if gpus_out else "AllGPUsInService",
                "message": f"out of service: {out}; {message}" if gpus_out else message,
                "lastTransitionTime": now, "lastHeartbeatTime": now}]}})
            self.events.record({"apiVersion": "v1", "kind": "Node", "name": node, "uid": meta.uid},
                               "Warning" if gpus_out else "Normal",
                               Reason.GPU_OUT_OF_SERVICE if gpus_out else Reason.GPU_IN_SERVICE,
                               f"{out}: {message}" if gpus_out else f"all GPUs in service: {message}")
        except ApiException as e:
            raise _wrap(e, f"node/{node}") from None

    def workers_on_gpus(self, node: str, gpus: Sequence[int]) -> list[GpuHolder]:
        try:
            pods = self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node}", label_selector=f"{LABEL_ROLE}={ROLE_WORKER}").items
        except ApiException as e:
            raise _wrap(e, f"pods on node/{node}") from None
        out = []
        for p in pods:
            meta = p.metadata
            if meta is None or meta.deletion_timestamp is not None or (p.status and p.status.phase in
                                                                       ("Succeeded", "Failed")):
                continue
            held = gpu_indices_in(meta.annotations or {})
            job = (meta.labels or {}).get(LABEL_JOB)
            if job and set(held) & set(gpus):
                rank = (meta.labels or {}).get(LABEL_RANK, "")
                out.append(GpuHolder(f"{meta.namespace}/{job}", str(meta.name), int(rank) if rank.isdigit() else -1,
                                     held))
        return sorted(out, key=lambda h: (h.job, h.rank))

    def post_event(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> None:
        try:
            self.events.record(involved, type_, reason, message)
        except ApiException as e:
            raise _wrap(e, f"event on {involved.get('kind')}/{involved['name']}") from None


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
    MirroredKind("Queue", parse_queue, Store.upsert_queue, lambda r: r.name),
)
PLURALS = {"TrainingJob": "trainingjobs", "ServingDeployment": "servingdeployments", "Queue": "queues"}


class Sync:
    """Mirrors TrainingJobs, ServingDeployments, Nodes and Queues into the store: list, then watch; re-list on any
    error (after 30 s when the kind is not installed: a cluster without the Queue CRD)."""

    def __init__(self, api: client.ApiClient, store: Store, metrics: ControllerMetrics) -> None:
        self.api, self.store, self.metrics = api, store, metrics
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self._stop = threading.Event()

    def _lister(self, kind: str) -> Callable[..., Any]:
        if kind == "Node":
            return self.core.list_node
        plural = PLURALS[kind]
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
                missing = isinstance(e, ApiException) and e.status == 404
                why = f"the database is unreachable ({type(e).__name__})" if is_outage(e) else e  # one line, no SQL
                log.warning("sync of %s: %s; re-listing in %d s", mk.kind, why, 30 if missing else 2)
                self._stop.wait(30.0 if missing else 2.0)

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self.run_kind, args=(mk,), name=f"sync-{mk.kind}", daemon=True)
                   for mk in KINDS]
        for t in threads:
            t.start()
        return threads

    def stop(self) -> None:
        self._stop.set()


class ServingPlacement:
    """node -> {ServingDeployment: GPUs} from the serving pods (label flotilla.dev/serving), listed when the
    console's GPU map asks and kept for `ttl_s`, so that many open consoles cost one list per interval. A failed
    list keeps the last answer (logged)."""

    def __init__(self, api: client.ApiClient, ttl_s: float = 2.0, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.core, self.ttl_s, self.clock = client.CoreV1Api(api), ttl_s, clock
        self._lock = threading.Lock()
        self._at: float | None = None
        self._answer: dict[str, dict[str, int]] = {}

    def __call__(self) -> dict[str, dict[str, int]]:
        with self._lock:
            if self._at is not None and self.clock() - self._at < self.ttl_s:
                return self._answer
            try:
                pods = self.core.list_pod_for_all_namespaces(
                    label_selector=LABEL_SERVING, field_selector="status.phase!=Succeeded,status.phase!=Failed")
                self._answer = serving_gpus_by_node(self.core.api_client.sanitize_for_serialization(pods)["items"])
            except Exception as e:  # the map still draws training and health
                log.warning("listing serving pods for the GPU map: %s", e)
            self._at = self.clock()
            return self._answer


def serving_gpus_by_node(pods: list[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        node, serving = spec.get("nodeName"), (meta.get("labels") or {}).get(LABEL_SERVING)
        if not node or not serving:
            continue
        gpus = sum(int(((c.get("resources") or {}).get("limits") or {}).get(GPU_RESOURCE) or 0)
                   for c in spec.get("containers") or [])
        if gpus:
            key = f"{meta.get('namespace')}/{serving}"
            out.setdefault(node, {})[key] = out.get(node, {}).get(key, 0) + gpus
    return out


REVIEW_TIMEOUT_S = 5.0


class _TtlCache:
    """Answers by key for a short time; bounded (cleared when full: a flood of new tokens cannot grow it)."""

    def __init__(self, ttl_s: float, negative_ttl_s: float, size: int = 10_000) -> None:
        self.ttl_s, self.negative_ttl_s, self.size = ttl_s, negative_ttl_s, size
        self._lock = threading.Lock()
        self._answers: dict[Any, tuple[float, Any]] = {}

    def get(self, key: Any) -> tuple[bool, Any]:
        with self._lock:
            hit = self._answers.get(key)
        if hit is None or hit[0] <= time.monotonic():
            return False, None
        return True, hit[1]

    def put(self, key: Any, answer: Any) -> None:
        ttl = self.ttl_s if answer else self.negative_ttl_s
        with self._lock:
            if len(self._answers) >= self.size:
                self._answers.clear()
            self._answers[key] = (time.monotonic() + ttl, answer)


def _review_failed(what: str, e: Exception) -> ReviewUnavailable:
    if isinstance(e, ApiException):
        detail = f"{e.status} {e.reason}"
        if e.status in (401, 403):
            detail += " (the controller's ServiceAccount needs create on tokenreviews and subjectaccessreviews)"
    else:
        detail = f"{type(e).__name__}: {e}"
    log.warning("%s failed: %s", what, detail)
    return ReviewUnavailable(f"{what} failed: {detail}")


def token_reviewer(api: client.ApiClient, admins: set[str], *, audience: str, readers: bool,
                   ttl_s: float = 30.0, negative_ttl_s: float = 5.0) -> Callable[[str], Identity | None]:
    """Accept tokens the API server vouches for (TokenReview) that were made for `audience`.

    The identity carries the username, groups, extra and, for a token bound to a pod on a node, the node
    (`NODE_NAME_EXTRA`). Role: admin for usernames in `admins`; read for the others when `readers`, else none
    (what such an identity may ingest is `flotilla.controller.ingest_auth`'s decision). Answers are cached by
    the token's hash (ttl_s; refusals negative_ttl_s); the token is never logged or stored. Raises
    ReviewUnavailable when the API server does not answer (the caller asks again later)."""
    auth = client.AuthenticationV1Api(api)
    cache = _TtlCache(ttl_s, negative_ttl_s)
    no_role = "read" if readers else NO_ROLE

    def review(token: str) -> Identity | None:
        digest = hashlib.sha256(token.encode()).digest()
        found, cached = cache.get(digest)
        if found:
            return cast(Identity | None, cached)
        try:
            status = auth.create_token_review(
                client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=[audience])),
                _request_timeout=REVIEW_TIMEOUT_S).status
        except Exception as e:  # ApiException, connection errors, timeouts: all mean "ask again later"
            raise _review_failed("TokenReview", e) from None
        who = None
        # The API server checks the audience; a reviewer must still check the answer names it.
        if (status is not None and status.authenticated and status.user is not None
                and audience in (status.audiences or [])):
            user = status.user
            extra = {k: tuple(v or ()) for k, v in (user.extra or {}).items()}
            node = extra.get(NODE_NAME_EXTRA, ())
            who = Identity(user.username or "", "admin" if user.username in admins else no_role, kubernetes=True,
                           node=node[0] if len(node) == 1 else None, groups=tuple(user.groups or ()),
                           uid=user.uid or "", extra=tuple(sorted(extra.items())))
        cache.put(digest, who)
        return who

    return review


def access_reviewer(api: client.ApiClient, ttl_s: float = 10.0, negative_ttl_s: float = 5.0
                    ) -> Callable[[Identity, StatsAccess], bool]:
    """May this Kubernetes identity do `access` (a SubjectAccessReview)? Cached briefly per identity and object;
    raises ReviewUnavailable when the API server does not answer."""
    authz = client.AuthorizationV1Api(api)
    cache = _TtlCache(ttl_s, negative_ttl_s)

    def allowed(who: Identity, access: StatsAccess) -> bool:
        key = (who, access)
        found, answer = cache.get(key)
        if found:
            return bool(answer)
        spec = client.V1SubjectAccessReviewSpec(
            user=who.name, groups=list(who.groups), uid=who.uid or None,
            extra={k: list(v) for k, v in who.extra} or None,
            resource_attributes=client.V1ResourceAttributes(
                group=access.group, resource=access.resource, subresource=access.subresource, verb=access.verb,
                namespace=access.namespace, name=access.name))
        try:
            status = authz.create_subject_access_review(client.V1SubjectAccessReview(spec=spec),
                                                        _request_timeout=REVIEW_TIMEOUT_S).status
        except Exception as e:
            raise _review_failed("SubjectAccessReview", e) from None
        answer = status is not None and bool(status.allowed) and not status.denied
        cache.put(key, answer)
        return answer

    return allowed
