"""The REST admin API (FastAPI), under /v1; OpenAPI at /openapi.json, docs at /docs.

(No `from __future__ import annotations` here: FastAPI must see the route signatures, which use names
local to create_app, as evaluated types.)

Reads come from the database the sync loop keeps; actions go to the cluster
through `ClusterActions` and are recorded as decisions. Every action is
idempotent twice over: an `Idempotency-Key` header replays the stored answer,
and an action whose effect is already in place (an unacknowledged checkpoint
request, a cordoned node) does not act again.
"""


import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Callable, Sequence

import sqlalchemy as sa
from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flotilla.controller import checkpoints, console, queues, views, vllm
from flotilla.controller.actions import ClusterActionError, ClusterActions, ClusterUnavailable, ObjectNotFound
from flotilla.controller.auth import Identity, ReviewUnavailable, TokenAuthenticator
from flotilla.controller.availability import RETRY_AFTER_S, DatabaseAvailability
from flotilla.controller.db import OUTAGES, current_revision, head_revision, is_outage
from flotilla.controller.ingest import Ingestor
from flotilla.controller.ingest_auth import UNAUTHENTICATED_REFUSAL, IngestPolicy, Refusal
from flotilla.controller.metrics import ControllerMetrics
from flotilla.controller.mirror import DecisionRecord, parse_time
from flotilla.resources.names import ANNOTATION_REPLAN_REQUEST as REPLAN_REQUEST
from flotilla.controller.store import OUTLOOKS, Store
from flotilla.health.samples import (
    MAX_GPU_INDEX,
    MAX_JOB_LENGTH,
    MAX_METRIC_LENGTH,
    MAX_NODE_LENGTH,
    MAX_RANK,
    MAX_ROLE_LENGTH,
    Sample,
)
from flotilla.serving.replan import ObservedWindow

log = logging.getLogger(__name__)
TERMINAL = ("Succeeded", "Failed", "Rejected")
HISTORY_IN_DETAIL = 20


@dataclass(frozen=True)
class Policy:
    """What an admin may change on a TrainingJob through the API."""

    priority_min: int = -100
    priority_max: int = 100
    max_deadline_days: float = 365.0


@dataclass
class Controller:
    """Everything the API needs; `flotilla.controller.service` builds it."""

    store: Store
    actions: ClusterActions
    auth: TokenAuthenticator
    metrics: ControllerMetrics
    ingestor: Ingestor
    policy: Policy = field(default_factory=Policy)
    ingest_policy: IngestPolicy = field(default_factory=IngestPolicy)  # who may post samples and statistics
    body_limit: int = 64 * 1024
    ingest_limit: int = 4 * 1024 * 1024
    cors_origins: Sequence[str] = ()
    # Called with a node's name when an admin returns it to service (the health detectors forget it).
    on_return_to_service: Callable[[str], None] | None = None
    # Takes a ServingDeployment's (namespace/name) observed window; None when re-planning is off.
    serving_stats: Callable[[str, ObservedWindow], None] | None = None
    # The controller's own conditions (IngestHealthy from the health responder); None when health is off.
    conditions: Callable[[], list[dict[str, Any]]] | None = None
    # node -> {ServingDeployment (namespace/name): GPUs its pods hold there}, for the GPU map; None without a cluster.
    serving_placement: Callable[[], dict[str, dict[str, int]]] | None = None
    # Whether the database answers: 503 with Retry-After while it does not, and GET /v1/cluster's condition.
    database: DatabaseAvailability = field(default_factory=DatabaseAvailability)


class ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"status": status, "message": message}}, status, headers=headers)


# ---------- request bodies ----------

class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CheckpointBody(Strict):
    reason: StrictStr = Field(default="requested through the API", min_length=1, max_length=1000)
    restart: StrictBool = Field(default=False, description="true when the workers cannot checkpoint and must "
                                                           "restart from the last completed checkpoint")


class JobPatch(Strict):
    priority: StrictInt | None = None
    deadline: AwareDatetime | None = Field(None, description="RFC 3339 time with a time zone")


class ReasonBody(Strict):
    reason: StrictStr = Field(default="requested through the API", min_length=1, max_length=1000)


class SampleIn(Strict):
    """The schema of a sample (for OpenAPI and an early 422); its bounds are `flotilla.health.samples`', and
    `Sample.from_dict`, which the Redis consumer applies too, has the last word."""

    ts: StrictFloat | StrictInt
    node: StrictStr = Field(min_length=1, max_length=MAX_NODE_LENGTH)
    metric: StrictStr = Field(min_length=1, max_length=MAX_METRIC_LENGTH)
    value: StrictFloat | StrictInt
    job: StrictStr | None = Field(None, max_length=MAX_JOB_LENGTH)
    gpu: StrictInt | None = Field(None, ge=0, le=MAX_GPU_INDEX)
    role: StrictStr | None = Field(None, min_length=1, max_length=MAX_ROLE_LENGTH)
    rank: StrictInt | None = Field(None, ge=0, le=MAX_RANK)


class IngestBody(Strict):
    node: StrictStr = Field(min_length=1, max_length=MAX_NODE_LENGTH)
    samples: list[SampleIn]


Number = StrictInt | StrictFloat


class ServingStatsBody(Strict):
    """One window of a ServingDeployment's serving statistics (from its pods or a router)."""

    windowSeconds: Number = Field(gt=0, le=3600, description="length of the window the figures cover")
    requestsPerSecond: Number = Field(ge=0)
    meanPromptTokens: Number = Field(gt=0)
    meanOutputTokens: Number = Field(gt=0)
    p90PromptTokens: Number | None = Field(None, gt=0)
    p90OutputTokens: Number | None = Field(None, gt=0)
    ttftP90Ms: Number | None = Field(None, ge=0)
    tpotP90Ms: Number | None = Field(None, ge=0)
    attainment: Number | None = Field(None, ge=0, le=1, description="fraction within both TTFT and TPOT")
    requests: StrictInt = Field(0, ge=0, description="requests the latency figures come from")


# ---------- middleware ----------

class BodyLimit:
    """Refuses request bodies over the limit with 413 before the app reads them (ingest has its own limit)."""

    def __init__(self, app: ASGIApp, default: int, per_path: dict[str, int]) -> None:
        self.app, self.default, self.per_path = app, default, per_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        limit = self.per_path.get(scope["path"], self.default)
        too_large = lambda: error(413, f"request body over the limit of {limit} bytes")  # noqa: E731
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return await too_large()(scope, receive, send)
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > limit:
                return await too_large()(scope, receive, send)
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


class RequestTimer:
    """API request latency by route template (not by raw path, which would explode the label set)."""

    def __init__(self, app: ASGIApp, metrics: ControllerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = [500]

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.api_latency.labels(scope["method"], route, str(status[0])).observe(
                time.perf_counter() - start)


# ---------- the app ----------

def create_app(ctl: Controller) -> FastAPI:
    app = FastAPI(title="Flotilla controller", version="v1",
                  description="Admin API of the Flotilla GPU-cluster control plane: cluster capacity and deadline "
                              "outlook, training jobs, serving deployments, node health, the decision audit trail, "
                              "and metric ingest from node agents. Authenticate with `Authorization: Bearer <token>`.")
    store, actions, policy = ctl.store, ctl.actions, ctl.policy
    bearer = HTTPBearer(auto_error=False, description="a token from the controller's tokens file, or a "
                                                      "Kubernetes ServiceAccount token made for the controller's "
                                                      "audience (TokenReview)")

    def authenticate(creds: HTTPAuthorizationCredentials | None) -> Identity | None:
        if creds is None or creds.scheme.lower() != "bearer" or not creds.credentials:
            raise ApiError(401, "missing bearer token (Authorization: Bearer <token>)")
        try:
            return ctl.auth.identify(creds.credentials)
        except ReviewUnavailable:
            raise ApiError(503, "cannot check the token now: the Kubernetes API did not answer its review; "
                                "retry later", {"Retry-After": "5"}) from None

    def identity(needed: str) -> Callable[..., Identity]:
        def check(creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Identity:
            who = authenticate(creds)
            if who is None:
                raise ApiError(401, UNAUTHENTICATED_REFUSAL.message)
            if not who.may(needed):
                raise ApiError(403, f"this route needs the {needed!r} role; token {who.name!r} has {who.role!r}")
            return who
        return check

    def ingest_caller(transport: str) -> Callable[..., Identity]:
        """Any holder of a valid token; what it may post is `ctl.ingest_policy`'s decision (see refuse)."""
        def check(creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Identity:
            try:
                who = authenticate(creds)
            except ApiError as e:
                if e.status == 401:  # no bearer token at all
                    ctl.ingestor.rejected(transport, UNAUTHENTICATED_REFUSAL.reason)
                raise
            if who is None:
                refuse(transport, "an unknown caller", UNAUTHENTICATED_REFUSAL)
            assert who is not None
            return who
        return check

    def refuse(transport: str, who: str, why: Refusal | None) -> None:
        """Count, log and answer a refused post; nothing when `why` is None."""
        if why is None:
            return
        ctl.ingestor.rejected(transport, why.reason)
        log.warning("refused %s post from %s (%s): %s", transport, who, why.reason, why.message)
        raise ApiError(why.status, why.message)

    Reader = Annotated[Identity, Depends(identity("read"))]
    Admin = Annotated[Identity, Depends(identity("admin"))]
    Agent = Annotated[Identity, Depends(ingest_caller("http"))]
    StatsPoster = Annotated[Identity, Depends(ingest_caller("stats"))]
    Limit = Annotated[int, Query(ge=1, le=1000, description="page size")]
    Cursor = Annotated[str | None, Query(max_length=512, description="nextCursor of the previous page")]
    IdemKey = Annotated[str | None, Header(alias="Idempotency-Key", min_length=1, max_length=255,
                                           description="replays the first answer for a repeated key")]

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, e: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else e.headers
        return error(e.status, e.message, headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        return error(e.status_code, str(e.detail), getattr(e, "headers", None))

    async def _database_unreachable(_: Request, e: Exception) -> JSONResponse:
        if not is_outage(e):
            raise e  # a database error that is no outage is a bug: 500, with its traceback in the log
        ctl.database.outage(e)
        ctl.metrics.database_unavailable.inc()
        body = {"error": {"status": 503, "message": "the controller's database is unreachable; retry later"},
                "conditions": [ctl.database.condition(), *(ctl.conditions() if ctl.conditions is not None else [])]}
        return JSONResponse(body, 503, headers={"Retry-After": str(RETRY_AFTER_S)})

    for outage in (*OUTAGES, sa.exc.DBAPIError):  # DBAPIError: one whose connection was invalidated
        app.add_exception_handler(outage, _database_unreachable)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, e: RequestValidationError) -> JSONResponse:
        problems = []
        for err in e.errors():
            where = ".".join(str(p) for p in err.get("loc", ()))
            problems.append(f"{where}: {err.get('msg')}")
        return JSONResponse({"error": {"status": 422, "message": "; ".join(problems), "fields": problems}}, 422)

    def act(kind: str, key: str | None, request: Request, body: BaseModel | None,
            do: Callable[[], tuple[int, dict[str, Any]]]) -> JSONResponse:
        fingerprint = hashlib.sha256(json.dumps(
            [kind, request.url.path, body.model_dump(mode="json") if body else None]).encode()).hexdigest()
        if key is not None:
            found = store.idempotent_answer(key)
            if found is not None:
                if found.request != fingerprint:
                    raise ApiError(409, "Idempotency-Key was already used for a different request")
                return JSONResponse(found.response, found.status, headers={"Idempotent-Replayed": "true"})
        try:
            status, answer = do()
        except ObjectNotFound as e:
            raise ApiError(404, f"not found in the cluster: {e}") from None
        except ClusterUnavailable as e:
            raise ApiError(503, str(e)) from None
        except ClusterActionError as e:
            raise ApiError(502, f"the Kubernetes API refused the action: {e}") from None
        if key is not None:
            store.remember_answer(key, fingerprint, status, answer)
        return JSONResponse(answer, status)

    def record(*decisions: DecisionRecord) -> None:
        store.record(decisions)
        ctl.metrics.decided(decisions)

    def now_iso() -> str:
        return views.iso(store.clock()) or ""

    def request_checkpoint(key: str, reason: str, restart: bool, who: str) -> tuple[bool, dict[str, Any]]:
        """-> (created, request); an unacknowledged request is returned instead of making another."""
        try:
            return checkpoints.request(store, actions, ctl.metrics, key, reason, restart, who, "admin")
        except KeyError:
            raise ApiError(404, f"TrainingJob {key!r} not found") from None

    # ----- probes and metrics -----

    @app.get("/healthz", tags=["probes"], summary="Liveness: the process serves requests")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["probes"], summary="Readiness: the database answers and its schema is current")
    def readyz() -> JSONResponse:
        try:
            store.ping()
            revision = current_revision(store.engine)
        except Exception as e:  # any database failure means not ready
            if is_outage(e):
                ctl.database.outage(e)
            return error(503, f"database unavailable: {type(e).__name__}", {"Retry-After": str(RETRY_AFTER_S)})
        ctl.database.answered()
        if revision != head_revision():
            return error(503, f"database schema at {revision}, expected {head_revision()}")
        return JSONResponse({"status": "ready", "schema": revision})

    @app.get("/metrics", tags=["probes"], summary="Prometheus metrics (read role)",
             response_class=Response)
    def metrics(_: Reader) -> Response:
        return Response(generate_latest(ctl.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/whoami", tags=["probes"], summary="The token's holder and role (the console shows admin actions "
                                                   "only to an admin token)")
    def whoami(who: Reader) -> dict[str, str]:
        return {"name": who.name, "role": who.role}

    # ----- cluster -----

    @app.get("/v1/gpumap", tags=["cluster"],
             summary="Every node's GPUs and who holds them (training jobs, serving deployments), for the console")
    def gpumap(_: Reader) -> JSONResponse:
        nodes, allocations = store.gpu_map()
        serving = ctl.serving_placement() if ctl.serving_placement is not None else {}
        # Plain JSON types already: a JSONResponse skips FastAPI's re-encoding, a third of the time at 1,000 nodes.
        return JSONResponse(views.gpu_map(nodes, allocations, serving))

    @app.get("/v1/timeline", tags=["training"],
             summary="Admitted jobs' guaranteed shares until their deadlines, the serving plans' GPUs and the "
                     "schedulable GPUs (the console's training timeline)")
    def timeline(_: Reader) -> JSONResponse:
        capacity = store.capacity()
        return JSONResponse({"schedulableGpus": capacity["schedulableGpus"],
                             "servingGpus": capacity["servingGpus"],
                             "jobs": [views.reservation(r) for r in store.reservations()]})

    @app.get("/v1/cluster", tags=["cluster"], summary="GPU capacity, allocation and free; deadline outlook; node health")
    def cluster(_: Reader) -> dict[str, Any]:
        answer = {"capacity": store.capacity(), "outlook": store.outlook_counts(), "nodes": store.node_health_counts()}
        ctl.database.answered()
        conditions = [ctl.database.condition(), *(ctl.conditions() if ctl.conditions is not None else [])]
        return {**answer, "conditions": conditions, "time": now_iso()}

    @app.get("/v1/cluster/domains", tags=["cluster"], summary="GPU capacity, allocation and free by topology domain")
    def domains(_: Reader, limit: Limit = 100, cursor: Cursor = None) -> dict[str, Any]:
        return views.page(store.domains(limit=limit, cursor=cursor), views.domain)

    # ----- teams' queues -----

    @app.get("/v1/queues", tags=["queues"],
             summary="Teams' Queues: spec and status as each Queue says (nominal, used, borrowed, lent GPUs; "
                     "admitted and pending jobs), with their jobs' deadline outlook")
    def queue_list(_: Reader) -> dict[str, Any]:
        outlooks = store.queue_outlooks()
        return {"items": [views.queue(q, outlooks.get(q.name)) for q in store.all_queues()], "nextCursor": None}

    def queue_or_404(name: str) -> Any:
        row = store.queue(name)
        if row is None:
            raise ApiError(404, f"Queue {name!r} not found")
        return row

    @app.get("/v1/queues/{name}", tags=["queues"],
             summary="One Queue: spec, status, its TrainingJobs and ServingDeployments, its loans (which queues "
                     "borrow from it and how much, and from which it borrows), its latest decisions")
    def queue_detail(_: Reader, name: str) -> dict[str, Any]:
        row = queue_or_404(name)
        jobs, servings = store.queue_members(name)
        history = store.decisions(limit=HISTORY_IN_DETAIL, object_kind="Queue", obj=name)
        reclaims = store.decisions(limit=HISTORY_IN_DETAIL, kind="reclaim", queue=name)
        return {**views.queue(row, store.queue_outlooks().get(name)),
                "children": [q.name for q in store.all_queues() if q.parent == name],
                "jobs": [views.job(j) for j in jobs], "serving": [views.serving(sd) for sd in servings],
                "loans": views.queue_loans(name, queues.loans(store.queue_records())),
                "reclaims": [views.decision(d) for d in reclaims.items],
                "history": [views.decision(d) for d in history.items]}

    @app.get("/v1/queues/{name}/usage", tags=["queues"],
             summary="A Queue's usage over time: its status numbers each time they changed, oldest first")
    def queue_usage(_: Reader, name: str, limit: Limit = 1000, cursor: Cursor = None,
                    since: Annotated[datetime | None, Query(description="RFC 3339; inclusive")] = None,
                    until: Annotated[datetime | None, Query(description="RFC 3339; exclusive")] = None,
                    ) -> dict[str, Any]:
        queue_or_404(name)
        return views.page(store.queue_usage(name, limit=limit, cursor=decision_cursor(cursor),
                                            since=aware(since, "since"), until=aware(until, "until")),
                          views.queue_usage)

    # ----- training jobs -----

    @app.get("/v1/jobs", tags=["training"], summary="TrainingJobs, filtered")
    def jobs(_: Reader, limit: Limit = 100, cursor: Cursor = None,
             namespace: Annotated[str | None, Query(max_length=253)] = None,
             phase: Annotated[str | None, Query(max_length=32)] = None,
             outlook: Annotated[str | None, Query(pattern="^(" + "|".join(OUTLOOKS) + ")$")] = None,
             node: Annotated[str | None, Query(max_length=253, description="jobs holding GPUs on this node")] = None,
             ) -> dict[str, Any]:
        return views.page(store.jobs(limit=limit, cursor=cursor, namespace=namespace, phase=phase, outlook=outlook,
                                     node=node), views.job)

    def job_or_404(namespace: str, name: str) -> tuple[Any, str]:
        found = store.job(f"{namespace}/{name}")
        if found is None:
            raise ApiError(404, f"TrainingJob {namespace}/{name} not found")
        return found

    @app.get("/v1/jobs/{namespace}/{name}", tags=["training"],
             summary="One TrainingJob: allocation, progress, outlook and its latest decisions")
    def job(_: Reader, namespace: str, name: str) -> dict[str, Any]:
        found = job_or_404(namespace, name)
        history = store.decisions(limit=HISTORY_IN_DETAIL, object_kind="TrainingJob", obj=found[0].key)
        return {**views.job(found), "history": [views.decision(d) for d in history.items]}

    @app.get("/v1/jobs/{namespace}/{name}/history", tags=["training"],
             summary="Allocation changes, reshards, phase changes and requests of one TrainingJob")
    def job_history(_: Reader, namespace: str, name: str, limit: Limit = 100, cursor: Cursor = None
                    ) -> dict[str, Any]:
        key = job_or_404(namespace, name)[0].key
        return views.page(store.decisions(limit=limit, cursor=decision_cursor(cursor), object_kind="TrainingJob",
                                          obj=key), views.decision)

    @app.post("/v1/jobs/{namespace}/{name}/checkpoint", tags=["training"], status_code=202,
              summary="Ask the job's workers for a checkpoint (returns the pending request if one is unacknowledged)")
    def checkpoint(who: Admin, request: Request, namespace: str, name: str, body: CheckpointBody | None = None,
                   idempotency_key: IdemKey = None) -> JSONResponse:
        body = body or CheckpointBody()

        def do() -> tuple[int, dict[str, Any]]:
            row, _ = job_or_404(namespace, name)
            if row.phase in TERMINAL:
                raise ApiError(409, f"TrainingJob {row.key} is {row.phase}; nothing to checkpoint")
            created, req = request_checkpoint(row.key, body.reason, body.restart, who.name)
            return (202 if created else 200), {"created": created, "request": req}
        return act("checkpoint", idempotency_key, request, body, do)

    @app.patch("/v1/jobs/{namespace}/{name}", tags=["training"],
               summary="Change a TrainingJob's priority or deadline, within the controller's policy")
    def patch_job(who: Admin, request: Request, namespace: str, name: str, body: JobPatch,
                  idempotency_key: IdemKey = None) -> JSONResponse:
        def do() -> tuple[int, dict[str, Any]]:
            row, _ = job_or_404(namespace, name)
            if row.phase in TERMINAL:
                raise ApiError(409, f"TrainingJob {row.key} is {row.phase}; it can no longer change")
            spec: dict[str, Any] = {}
            changes: dict[str, Any] = {}
            if body.priority is not None and body.priority != row.priority:
                if not policy.priority_min <= body.priority <= policy.priority_max:
                    raise ApiError(422, f"priority must be within [{policy.priority_min}, {policy.priority_max}]")
                spec["priority"] = changes["priority"] = body.priority
            if body.deadline is not None and body.deadline.timestamp() != row.deadline:
                deadline = body.deadline.timestamp()
                now = store.clock()
                if deadline <= now:
                    raise ApiError(422, "deadline must be in the future")
                if deadline > now + policy.max_deadline_days * 86400:
                    raise ApiError(422, f"deadline must be within {policy.max_deadline_days:g} days from now")
                spec["deadline"] = views.iso(deadline)
                spec["deadlineSeconds"] = None  # a merge patch with null removes a relative deadline
                changes["deadline"] = deadline
            if not spec:
                return 200, {"changed": False, "job": views.job(job_or_404(namespace, name))}
            actions.patch_spec("trainingjobs", namespace, name, spec)
            store.set_job_fields(row.key, **changes)
            for field_name, value in changes.items():
                old = row.priority if field_name == "priority" else views.iso(row.deadline)
                new = value if field_name == "priority" else views.iso(value)
                record(DecisionRecord(field_name, "TrainingJob", row.key, f"{field_name} changed by {who.name}",
                                      {"from": old, "to": new}, actor=who.name))
            return 200, {"changed": True, "job": views.job(job_or_404(namespace, name))}
        return act("patch-job", idempotency_key, request, body, do)

    # ----- serving -----

    @app.get("/v1/serving", tags=["serving"], summary="ServingDeployments with their current plan and observed SLO")
    def servings(_: Reader, limit: Limit = 100, cursor: Cursor = None,
                 namespace: Annotated[str | None, Query(max_length=253)] = None) -> dict[str, Any]:
        return views.page(store.servings(limit=limit, cursor=cursor, namespace=namespace), views.serving)

    def serving_or_404(namespace: str, name: str) -> Any:
        row = store.serving(f"{namespace}/{name}")
        if row is None:
            raise ApiError(404, f"ServingDeployment {namespace}/{name} not found")
        return row

    @app.get("/v1/serving/{namespace}/{name}", tags=["serving"],
             summary="One ServingDeployment: plan, observed attainment, latest plan changes")
    def serving(_: Reader, namespace: str, name: str) -> dict[str, Any]:
        row = serving_or_404(namespace, name)
        history = store.decisions(limit=HISTORY_IN_DETAIL, object_kind="ServingDeployment", obj=row.key)
        return {**views.serving(row), "history": [views.decision(d) for d in history.items]}

    @app.get("/v1/serving/{namespace}/{name}/history", tags=["serving"], summary="Plan history of one deployment")
    def serving_history(_: Reader, namespace: str, name: str, limit: Limit = 100, cursor: Cursor = None
                        ) -> dict[str, Any]:
        row = serving_or_404(namespace, name)
        return views.page(store.decisions(limit=limit, cursor=decision_cursor(cursor),
                                          object_kind="ServingDeployment", obj=row.key), views.decision)

    @app.post("/v1/serving/{namespace}/{name}/replan", tags=["serving"], status_code=202,
              summary="Ask the planner to re-plan now (returns the pending request if none has been served yet)")
    def replan(who: Admin, request: Request, namespace: str, name: str, body: ReasonBody | None = None,
               idempotency_key: IdemKey = None) -> JSONResponse:
        body = body or ReasonBody()

        def do() -> tuple[int, dict[str, Any]]:
            row = serving_or_404(namespace, name)
            pending = row.replan_request
            if pending and (row.last_plan_time is None or requested_at(pending) > row.last_plan_time):
                return 200, {"created": False, "request": pending}
            req = {"generation": int((pending or {}).get("generation", 0)) + 1, "reason": body.reason,
                   "requestedBy": "admin", "time": now_iso()}
            actions.annotate("servingdeployments", namespace, name, REPLAN_REQUEST, json.dumps(req))
            store.set_serving_fields(row.key, replan_request=req)
            record(DecisionRecord("replan-request", "ServingDeployment", row.key, body.reason,
                                  {"generation": req["generation"], "observed": row.observed}, actor=who.name))
            return 202, {"created": True, "request": req}
        return act("replan", idempotency_key, request, body, do)

    # ----- nodes -----

    @app.get("/v1/nodes", tags=["nodes"], summary="Nodes with GPU allocation and health")
    def nodes(_: Reader, limit: Limit = 100, cursor: Cursor = None,
              domain: Annotated[str | None, Query(max_length=253)] = None,
              healthy: bool | None = None, schedulable: bool | None = None) -> dict[str, Any]:
        return views.page(store.nodes(limit=limit, cursor=cursor, domain=domain, healthy=healthy,
                                      schedulable=schedulable), views.node)

    def node_or_404(name: str) -> tuple[Any, int]:
        found = store.node(name)
        if found is None:
            raise ApiError(404, f"Node {name!r} not found")
        return found

    @app.get("/v1/nodes/{name}", tags=["nodes"],
             summary="One node: health with evidence (condition, taint, latest samples), its jobs, latest decisions")
    def node(_: Reader, name: str) -> dict[str, Any]:
        found = node_or_404(name)
        history = store.decisions(limit=HISTORY_IN_DETAIL, object_kind="Node", obj=name)
        return {**views.node(found),
                "evidence": {"latestSamples": [views.sample(s) for s in store.latest_samples(name)]},
                "jobs": [j.key for j in store.jobs_on_node(name)],
                "history": [views.decision(d) for d in history.items]}

    @app.get("/v1/nodes/{name}/history", tags=["nodes"], summary="Health changes, cordons, drains of one node")
    def node_history(_: Reader, name: str, limit: Limit = 100, cursor: Cursor = None) -> dict[str, Any]:
        node_or_404(name)
        return views.page(store.decisions(limit=limit, cursor=decision_cursor(cursor), object_kind="Node",
                                          obj=name), views.decision)

    @app.post("/v1/nodes/{name}/drain", tags=["nodes"], status_code=202,
              summary="Cordon the node and ask every job on it for a checkpoint, so the operator moves them off")
    def drain(who: Admin, request: Request, name: str, body: ReasonBody | None = None,
              idempotency_key: IdemKey = None) -> JSONResponse:
        body = body or ReasonBody()

        def do() -> tuple[int, dict[str, Any]]:
            row, _ = node_or_404(name)
            acted = False
            if not row.unschedulable:
                actions.set_unschedulable(name, True)
                store.set_node_fields(name, unschedulable=True)
                acted = True
            requests = {}
            for job in store.jobs_on_node(name):
                if job.phase in TERMINAL:
                    continue
                created, req = request_checkpoint(job.key, f"drain node {name}: {body.reason}", False, who.name)
                requests[job.key] = req["generation"]
                acted = acted or created
            if acted:
                record(DecisionRecord("drain", "Node", name, body.reason, {"checkpointRequests": requests},
                                      actor=who.name))
            return (202 if acted else 200), {"node": name, "cordoned": True, "changed": acted,
                                             "checkpointRequests": requests}
        return act("drain", idempotency_key, request, body, do)

    @app.post("/v1/nodes/{name}/return-to-service", tags=["nodes"],
              summary="Uncordon the node, clear the unhealthy taint and mark its GPUs healthy (those out of service "
                      "on their own too)")
    def return_to_service(who: Admin, request: Request, name: str, body: ReasonBody | None = None,
                          idempotency_key: IdemKey = None) -> JSONResponse:
        body = body or ReasonBody()

        def do() -> tuple[int, dict[str, Any]]:
            row, _ = node_or_404(name)
            if not row.unschedulable and row.healthy and row.taint is None and not row.gpus_out:
                return 200, {"node": name, "changed": False}
            actions.set_node_health(name, True, "ReturnedToService", body.reason)
            actions.set_unschedulable(name, False)
            if row.gpus_out:
                actions.set_gpus_out(name, {}, body.reason)
            store.set_node_fields(name, unschedulable=False, healthy=True, taint=None, health_reason=None,
                                  health_message=None, gpus_out=None)
            if ctl.on_return_to_service is not None:
                ctl.on_return_to_service(name)
            record(DecisionRecord("return-to-service", "Node", name, body.reason,
                                  {"wasUnschedulable": row.unschedulable, "wasHealthy": row.healthy,
                                   "taint": row.taint, "gpusOut": row.gpus_out}, actor=who.name))
            return 200, {"node": name, "changed": True}
        return act("return-to-service", idempotency_key, request, body, do)

    # ----- decisions -----

    def decision_cursor(cursor: str | None) -> str | None:
        if cursor is not None and not cursor.isdigit():
            raise ApiError(422, "cursor: must be the nextCursor of a previous page of decisions")
        return cursor

    @app.get("/v1/decisions", tags=["decisions"],
             summary="The audit trail: allocation changes, reshards, cordons, plan changes, requests; newest first")
    def decisions(_: Reader, limit: Limit = 100, cursor: Cursor = None,
                  since: Annotated[datetime | None, Query(description="RFC 3339; inclusive")] = None,
                  until: Annotated[datetime | None, Query(description="RFC 3339; exclusive")] = None,
                  kind: Annotated[str | None, Query(max_length=64)] = None,
                  object_kind: Annotated[str | None, Query(alias="objectKind", max_length=64)] = None,
                  object: Annotated[str | None, Query(max_length=512, description="namespace/name, or a node")] = None,
                  ) -> dict[str, Any]:
        return views.page(store.decisions(limit=limit, cursor=decision_cursor(cursor),
                                          since=aware(since, "since"), until=aware(until, "until"),
                                          kind=kind, object_kind=object_kind, obj=object), views.decision)

    # ----- ingest -----

    @app.post("/v1/ingest", tags=["agents"], status_code=202,
              summary="Metric samples from a node agent (the fallback when Redis is not used)")
    def ingest(who: Agent, body: IngestBody) -> dict[str, Any]:
        refuse("http", who.name, ctl.ingest_policy.samples(who, {body.node, *(s.node for s in body.samples)}))
        samples = []
        for i, s in enumerate(body.samples):
            try:
                samples.append(Sample.from_dict(s.model_dump()))
            except ValueError as e:
                ctl.ingestor.rejected("http", "malformed")
                raise ApiError(422, f"samples[{i}]: {e}") from None
        # 503 while the database is unreachable (the agent keeps the batch and sends it again)
        accepted = ctl.ingestor.ingest("http", samples)
        return {"accepted": accepted, "deadLettered": len(samples) - accepted}

    def may_post_stats(who: Identity, namespace: str, name: str) -> None:
        try:
            refuse("stats", who.name, ctl.ingest_policy.stats(who, namespace, name))
        except ReviewUnavailable:
            raise ApiError(503, "cannot check the caller's access now: the Kubernetes API did not answer its "
                                "review; retry later", {"Retry-After": "5"}) from None

    @app.post("/v1/serving/{namespace}/{name}/stats", tags=["serving"], status_code=202,
              summary="Serving statistics of one window (request rate, lengths, TTFT/TPOT), for the re-planner")
    def serving_stats(who: StatsPoster, namespace: str, name: str, body: ServingStatsBody) -> dict[str, Any]:
        may_post_stats(who, namespace, name)
        serving_or_404(namespace, name)
        if ctl.serving_stats is None:
            raise ApiError(409, "re-planning is off in this controller (--no-replan or --no-kubernetes)")
        ctl.serving_stats(f"{namespace}/{name}", ObservedWindow(
            time=store.clock(), requests_per_second=float(body.requestsPerSecond),
            mean_prompt_tokens=float(body.meanPromptTokens), mean_output_tokens=float(body.meanOutputTokens),
            p90_prompt_tokens=body.p90PromptTokens, p90_output_tokens=body.p90OutputTokens,
            ttft_p90_ms=body.ttftP90Ms, tpot_p90_ms=body.tpotP90Ms, attainment=body.attainment,
            requests=body.requests, seconds=float(body.windowSeconds)))
        return {"accepted": True}

    scrapes: dict[str, vllm.Scrape] = {}
    scrapes_lock = threading.Lock()

    @app.post("/v1/serving/{namespace}/{name}/stats/prometheus", tags=["serving"], status_code=202,
              summary="vLLM's Prometheus metrics (text exposition format), scraped by a router or sidecar; "
                      "two scrapes make one statistics window")
    async def serving_stats_prometheus(who: StatsPoster, namespace: str, name: str, request: Request
                                       ) -> dict[str, Any]:
        await run_in_threadpool(may_post_stats, who, namespace, name)  # a SubjectAccessReview may take a while
        serving_or_404(namespace, name)
        if ctl.serving_stats is None:
            raise ApiError(409, "re-planning is off in this controller (--no-replan or --no-kubernetes)")
        try:
            scrape = vllm.parse((await request.body()).decode("utf-8"), store.clock())
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(422, f"body: not Prometheus text exposition format: {e}") from None
        key = f"{namespace}/{name}"
        with scrapes_lock:
            previous, scrapes[key] = scrapes.get(key), scrape
        found = vllm.window(previous, scrape) if previous is not None else None
        if found is not None:
            ctl.serving_stats(key, found)
        return {"accepted": True, "window": found is not None}

    console.mount(app)
    app.add_middleware(RequestTimer, metrics=ctl.metrics)
    app.add_middleware(BodyLimit, default=ctl.body_limit, per_path={"/v1/ingest": ctl.ingest_limit})
    if ctl.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(ctl.cors_origins), allow_methods=["*"],
                           allow_headers=["Authorization", "Content-Type", "Idempotency-Key"])
    return app


def aware(value: datetime | None, name: str) -> float | None:
    if value is None:
        return None
    if value.tzinfo is None:
        raise ApiError(422, f"{name}: must carry a time zone (e.g. 2026-01-01T00:00:00Z)")
    return value.timestamp()


def requested_at(request: dict[str, Any]) -> float:
    """When a request annotation was made; 0 when its time is missing or unreadable (then it counts as served)."""
    try:
        return parse_time(request.get("time"), "time") or 0.0
    except ValueError:
        return 0.0
