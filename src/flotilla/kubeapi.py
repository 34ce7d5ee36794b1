"""The Kubernetes API client every Flotilla process uses: each call has a timeout, says who sent it, and
(for a leader) is fenced by its Lease.

A call without a timeout waits forever on a connection that hangs (a partition, a stopped API server);
so `ApiClient` gives every request the default timeout unless the call names its own. Watches name their
own: a (connect, read) pair whose read part outlasts the watch's `timeoutSeconds`.

Fencing (client-go's leader election is the model): a leader may send a write only while its Lease is
certainly still its own. `Fence` (flotilla.operator.leader) says so before each write is sent and bounds
the write's timeout so that it ends before the Lease could be taken by another replica.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from types import SimpleNamespace
from typing import Any, Callable, Protocol
from urllib.parse import urlencode

from kubernetes import client, config
from kubernetes.client import rest

DEFAULT_TIMEOUT_SECONDS = 10.0
READS = frozenset({"GET", "HEAD", "OPTIONS"})


class NotLeader(Exception):
    """A write was refused before it was sent: this replica's Lease may already belong to another."""


class ApiTimeout(TimeoutError):
    """An API call got no answer within its timeout (whether it took effect is not known)."""


class Fence(Protocol):
    def bound(self, timeout: float) -> float:
        """The timeout a write sent now may have; raises NotLeader when no write may be sent."""
        ...


class ApiClient(client.ApiClient):
    """kubernetes.client.ApiClient with a timeout on every request and, given a fence, fenced writes."""

    def __init__(self, configuration: client.Configuration | None = None,
                 timeout: float = DEFAULT_TIMEOUT_SECONDS, fence: Fence | None = None,
                 user_agent: str | None = None) -> None:
        if timeout <= 0:
            raise ValueError(f"API timeout must be positive, got {timeout}")
        super().__init__(configuration)
        self.timeout, self.fence = timeout, fence
        if user_agent:
            self.user_agent = user_agent

    def call_api(self, method: str, url: str, header_params: Any = None, body: Any = None,
                 post_params: Any = None, _request_timeout: Any = None) -> Any:
        timeout = self.timeout_of(method, _request_timeout)
        try:
            return super().call_api(method, url, header_params, body, post_params, _request_timeout=timeout)
        except rest.urllib3.exceptions.TimeoutError as e:  # the urllib3 the client sends with
            raise ApiTimeout(f"{method} {url.split('?')[0]}: no answer within {_total(timeout):.1f} s") from e

    def timeout_of(self, method: str, timeout: Any) -> Any:
        """The timeout a request sent now gets (the default unless it names one, a write's bounded by the
        fence); raises NotLeader when it is a write that may not be sent."""
        timeout = self.timeout if timeout is None else timeout
        if self.fence is not None and method.upper() not in READS:
            timeout = _bounded(timeout, self.fence.bound(_total(timeout)))
        return timeout


def _total(timeout: Any) -> float:
    return sum(timeout) if isinstance(timeout, tuple) else float(timeout)


def _bounded(timeout: Any, most: float) -> Any:
    if isinstance(timeout, tuple):
        return tuple(min(part, most) for part in timeout)
    return min(float(timeout), most)


# The client writes a kubeconfig's certificates to temporary files, and remembers each file by its content
# before it has written it: a second load of the same kubeconfig at that moment gets an empty file ("no
# certificate or crl found" when its TLS context is made). Loads in one process take turns under this lock
# (the operator makes its clients in threads while kopf logs in).
CONFIG_LOCK = threading.Lock()


# How often a request may have the client refresh its credentials. The client's hook (a kubeconfig's token, or
# in a pod the ServiceAccount token file) runs before every request and sets every connection setting again,
# the host among them, whose setter scans the environment for proxies: most of the CPU of a request that it
# does not send. A token is re-read within this long of the client's own refresh time.
CREDENTIALS_REFRESH_SECONDS = 1.0


def load_configuration() -> client.Configuration:
    """In-cluster when running in a pod, else KUBECONFIG / ~/.kube/config."""
    with CONFIG_LOCK:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        configuration = client.Configuration.get_default_copy()
    if configuration.refresh_api_key_hook is not None:
        configuration.refresh_api_key_hook = _at_most_every(CREDENTIALS_REFRESH_SECONDS,
                                                            configuration.refresh_api_key_hook)
    return configuration


def _at_most_every(seconds: float, hook: Callable[[client.Configuration], None],
                   clock: Callable[[], float] = time.monotonic) -> Callable[[client.Configuration], None]:
    last = -float("inf")

    def refresh(configuration: client.Configuration) -> None:
        nonlocal last
        now = clock()
        if now - last >= seconds:
            last = now
            hook(configuration)
            # The client's hook sets itself again each time (setattr: its untyped model declares the field None).
            setattr(configuration, "refresh_api_key_hook", refresh)
    return refresh


def connect(component: str, identity: str | None = None, timeout: float = DEFAULT_TIMEOUT_SECONDS,
            fence: Fence | None = None, connections: int | None = None, retries: Any = None) -> ApiClient:
    """An ApiClient for `component` ("flotilla-operator"), sending User-Agent `<component>/<identity>`.

    `connections`: how many connections urllib3 keeps (one per call in flight); `retries`: urllib3's
    retries, None for its default (False for none: a fenced write must not be sent again after its check)."""
    configuration = load_configuration()
    if connections is not None:
        configuration.connection_pool_maxsize = connections
    if retries is not None:
        configuration.retries = retries
    return ApiClient(configuration, timeout=timeout, fence=fence,
                     user_agent=f"{component}/{identity or default_identity()}")


def default_identity() -> str:
    """hostname_pid: which process sent a request, in the API server's audit log."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{os.getpid()}"


def as_body(manifest: dict[str, Any]) -> Any:
    """A manifest as the client's `body`: the client serialises a plain dict as it is, though its annotations
    name only its model classes (V1Pod, CoreV1Event ...)."""
    return manifest


JSON = "application/json"


def send(api: client.ApiClient, method: str, path: str, body: Any = None, *,
         query: list[tuple[str, Any]] | None = None, content_type: str = JSON, timeout: Any = None) -> Any:
    """One request through `api`'s connections (its urllib3 pool: TLS, credentials, connection count, retries)
    with its User-Agent and, with `ApiClient`, its timeout and fence, but none of the client's per-request
    machinery: the typed API classes validate every argument and build a typed model of every reply (and cost
    a second of CPU to import), and even its untyped path walks the body to serialise it and wraps the reply.
    Returns the reply as urllib3 gives it, unread (read it or iterate its lines, then `release_conn()`). A
    reply other than 2xx raises ApiException (status, reason, body), as the typed calls do. `body`: plain JSON
    values."""
    configuration = api.configuration
    headers = {**api.default_headers, "Content-Type": content_type, "Accept": JSON}
    for auth in configuration.auth_settings().values():  # a bearer token, refreshed where the config says so
        if auth["in"] == "header" and auth["value"]:
            headers[auth["key"]] = auth["value"]
    if isinstance(api, ApiClient):
        timeout = api.timeout_of(method, timeout)
    url = configuration.host + path + ("?" + urlencode(query) if query else "")
    try:
        response = api.rest_client.pool_manager.request(
            method, url, body=None if body is None else json.dumps(body), headers=headers,
            timeout=_urllib3_timeout(timeout), preload_content=False)
    except rest.urllib3.exceptions.TimeoutError as e:
        raise ApiTimeout(f"{method} {path}: no answer within {_total(timeout):.1f} s") from e
    except rest.urllib3.exceptions.SSLError as e:  # as the client reports it
        raise rest.ApiException(status=0, reason=f"{type(e).__name__}\n{e}") from e
    if not 200 <= response.status <= 299:
        try:
            reply = rest.RESTResponse(response)
            reply.read()
        finally:
            response.release_conn()
        raise client.ApiException(http_resp=reply)
    return response


def _urllib3_timeout(timeout: Any) -> Any:
    if timeout is None:
        return None
    if isinstance(timeout, tuple):
        return rest.urllib3.Timeout(connect=timeout[0], read=timeout[1])
    return rest.urllib3.Timeout(total=timeout)


MERGE_PATCH = "application/merge-patch+json"  # RFC 7386, as `flotilla.operator.view.merge_patch` shows it
APPLY_PATCH = "application/apply-patch+yaml"  # server-side apply (a JSON body is YAML)


class Wire:
    """Writes as plain requests (`send`), for the operator: a created pod's typed reply model cost more of its
    CPU than sending it, and nothing reads it. `field_manager`: who owns what `apply` sets."""

    def __init__(self, api: client.ApiClient, field_manager: str):
        self.api, self.field_manager = api, field_manager

    def send(self, method: str, path: str, body: Any = None, *, query: list[tuple[str, str]] | None = None,
             content_type: str = JSON, answer: bool = False, timeout: float | None = None) -> Any:
        """One request; `answer`: returns the reply's JSON, else True. Raises ApiException for a reply
        other than 2xx."""
        response = send(self.api, method, path, body, query=query, content_type=content_type, timeout=timeout)
        try:
            data = response.data
            return json.loads(data) if answer else True
        finally:
            response.release_conn()

    def apply(self, path: str, manifest: dict[str, Any]) -> Any:
        """Server-side apply, forced: the field manager owns the fields it sets."""
        return self.send("PATCH", path, manifest, query=[("fieldManager", self.field_manager), ("force", "true")],
                         content_type=APPLY_PATCH)


class EventsApi:
    """The Event calls `flotilla.operator.recorder.EventRecorder` makes (CoreV1Api's names), as requests
    through a `Wire`."""

    def __init__(self, wire: Wire):
        self.wire = wire

    def create_namespaced_event(self, namespace: str, body: dict[str, Any], _request_timeout: float | None = None,
                                **_: Any) -> Any:
        return self.wire.send("POST", f"/api/v1/namespaces/{namespace}/events", body, timeout=_request_timeout)

    def read_namespaced_event(self, name: str, namespace: str, _request_timeout: float | None = None) -> Any:
        event = self.wire.send("GET", f"/api/v1/namespaces/{namespace}/events/{name}", answer=True,
                               timeout=_request_timeout)
        return SimpleNamespace(count=event.get("count"))

    def patch_namespaced_event(self, name: str, namespace: str, patch: dict[str, Any],
                               _request_timeout: float | None = None, **_: Any) -> Any:
        return self.wire.send("PATCH", f"/api/v1/namespaces/{namespace}/events/{name}", patch,
                              content_type=MERGE_PATCH, timeout=_request_timeout)
