"""The operator's process: kopf runs it; watches of its own keep an in-memory view; one loop reconciles it.

Watch events (flotilla.operator.watch) only update the view and wake the loop. A pass is planned in
a thread on a copy of the view, then hands each object's writes to a task of their own and does not
wait for them: the next pass plans while they are on their way (the view shows their patches) and
leaves alone an object whose writes are.
The view only changes on the event loop (the watches' threads hand their events to it; planning works on
copies). The loop is level-based: it reconciles what it sees on every wake-up and everything at least
every `resync` seconds, so a missed event or a restart converges. The view is reconciled with full lists
before the first pass, whenever a watch cannot resume where it was, and every `relist_seconds`, so that
objects deleted during a watch gap do not stay in it.
Every API call has a timeout (`api_timeout`); with leader election, every write is fenced by the Lease.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import kopf

from flotilla import GROUP, VERSION, kubeapi
from flotilla.allocation import Allocator
from flotilla.operator.actions import Action, ApplyObject, CreatePod, PatchAnnotations, PatchStatus
from flotilla.operator.kube import Kube, RateLimiter, inference_pools_served
from flotilla.operator.metrics import OperatorMetrics
from flotilla.operator.reconcile import Planner
from flotilla.operator import relist, watch
from flotilla.operator.relist import Lister, Relister
from flotilla.operator.view import View, key_of
from flotilla.pool import PoolPolicy
from flotilla.resources import names

log = logging.getLogger("flotilla.operator")
MANAGED = {names.LABEL_MANAGED_BY: names.MANAGED_BY}


@dataclass
class Settings:
    allocator: Allocator
    resync_seconds: float = 10.0
    debounce_seconds: float = 0.2
    # A pass that takes newly arrived jobs starts once arrivals pause for the debounce, or at the latest this
    # long after the first of them: jobs arriving meanwhile are planned in the same pass (one allocator run for
    # them all), at up to this cost in admission latency. A job arriving after a quiet spell (QUIET_BATCHES
    # times this) is planned at once.
    batch_seconds: float = 0.5
    concurrency: int = 16
    qps: float = 200.0
    burst: int = 400
    max_restarts: int = 3
    pool: PoolPolicy | None = None  # the unified pool's policy; None: serving only holds what it has
    api_timeout: float = kubeapi.DEFAULT_TIMEOUT_SECONDS
    relist_seconds: float = 60.0
    namespaces: list[str] = field(default_factory=list)  # empty: all
    identity: str = field(default_factory=kubeapi.default_identity)  # in the User-Agent of every request
    fence: kubeapi.Fence | None = None  # the Lease's, with --leader-elect: every write checks it first
    agent_port: int = names.DEFAULT_AGENT_PORT  # the node agents' step-time port, given to worker pods


@dataclass
class Operator:
    """Everything the operator's process keeps between passes, in one object handed to what uses it."""

    settings: Settings
    view: View = field(default_factory=View)
    inference_pools: bool = False  # the InferencePool CRD is installed (flotilla.operator.endpoint)
    # (view kind, key) -> the task writing that object's actions
    in_flight: dict[tuple[str, str], asyncio.Task] = field(default_factory=dict)
    planner: Planner = field(default_factory=Planner)
    plan_thread: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="plan"))
    # TrainingJob status patches answered, by what they set (`status_patch_kind`): logged now and then for the
    # benchmarks (each costs the API server more than any other request of the operator's).
    status_patches: Counter[str] = field(default_factory=Counter)
    status_patches_logged: tuple[float, int] = (0.0, 0)  # when, and how many there were then
    # What the metrics read at scrape time (flotilla.operator.metrics), set once the loop starts.
    kube: Kube | None = None
    informers: list[watch.Informer] = field(default_factory=list)
    relister: Relister | None = None
    metrics: OperatorMetrics = field(init=False)

    def __post_init__(self) -> None:
        self.planner.full_every = self.settings.resync_seconds
        self.metrics = OperatorMetrics(lambda: self)


# The operator kopf's handlers (login, startup, cleanup) run: set by `configure`.
current: Operator | None = None


def configure(s: Settings) -> Operator:
    global current
    current = Operator(s)
    return current


SELECTOR = ",".join(f"{k}={v}" for k, v in MANAGED.items())


USER_AGENT = "flotilla-operator"


@dataclasses.dataclass(frozen=True, kw_only=True)
class _IdentifiedConnection(kopf.ConnectionInfo):
    """kopf's credentials, plus the User-Agent every request of the operator carries."""

    user_agent: str = USER_AGENT

    def as_http_headers(self) -> dict[str, str]:
        return {**super().as_http_headers(), "User-Agent": self.user_agent}


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    with kubeapi.CONFIG_LOCK:  # not beside the operator's own clients' loads (flotilla.kubeapi)
        info = kopf.login_via_client(**kwargs)
    if info is None or current is None:
        return info
    fields = {f.name: getattr(info, f.name) for f in dataclasses.fields(kopf.ConnectionInfo)}
    return _IdentifiedConnection(**fields, user_agent=f"{USER_AGENT}/{current.settings.identity}")


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    op = _current()
    ours = op.settings
    settings.posting.enabled = False  # kopf's own Events are not fenced; the operator's go through Kube
    # A timeout on every request of kopf's too: a hung connection must not stall a watch for good.
    settings.networking.request_timeout = ours.api_timeout
    settings.networking.connect_timeout = ours.api_timeout
    settings.persistence.finalizer = f"{GROUP}/operator"
    memo.loop_task = asyncio.get_running_loop().create_task(_loop(op))


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    task = getattr(memo, "loop_task", None)
    if task:
        task.cancel()
    if current is not None:
        _log_status_patches(current, every=0.0)


def _current() -> Operator:
    assert current is not None, "flotilla.operator.handlers.configure() was not called"
    return current


def _api_client(s: Settings, connections: int, fence: kubeapi.Fence | None) -> kubeapi.ApiClient:
    # urllib3 keeps `connections` connections per host (the client's default is 5 x CPU count): one per call
    # in flight. No retries inside urllib3: a fenced write is checked once, just before it is sent.
    return kubeapi.connect(USER_AGENT, s.identity, timeout=s.api_timeout, fence=fence, connections=connections,
                           retries=False)


async def _loop(op: Operator) -> None:
    s, view = op.settings, op.view
    # The clients are made off the event loop (each reads the kubeconfig and builds a TLS context, which
    # takes seconds on a busy machine): the Lease is renewed on the loop. One client reads for the watches,
    # a connection each, and the re-lists.
    readers = len(relist.KINDS) * max(1, len(s.namespaces)) + 2
    writer, reader, discovery = await asyncio.gather(*(asyncio.to_thread(_api_client, s, n, fence)
                                                       for n, fence in ((s.concurrency, s.fence), (readers, None),
                                                                        (1, None))))
    kube = Kube(writer, concurrency=s.concurrency, limiter=RateLimiter(s.qps, s.burst), timeout=s.api_timeout)
    # Only the pods and Deployments Flotilla made: filtered by the API server, not after the fact.
    lister = Lister(reader, s.namespaces, SELECTOR)
    watches = watch.informers(view, lister, asyncio.get_running_loop(), s.api_timeout)
    for w in watches:
        w.start()
    relister = Relister(view, lister, s.relist_seconds)
    op.kube, op.informers, op.relister = kube, watches, relister
    # The first decision waits for a full list of every kind: a new leader starts from what is, not a cache.
    await asyncio.gather(*(w.synced.wait() for w in watches))
    relisting = asyncio.get_running_loop().create_task(relister.run())
    discovering = asyncio.get_running_loop().create_task(_discover_inference_pools(op, discovery))
    log.info("reconcile loop started as %s: policy=%s resync=%ss relist=%ss api-timeout=%ss concurrency=%d qps=%s "
             "burst=%d unified pool: %s fenced by the lease: %s", s.identity, s.allocator.name, s.resync_seconds,
             s.relist_seconds, s.api_timeout, s.concurrency, s.qps, s.burst, s.pool or "off", s.fence is not None)
    try:
        await _reconcile_forever(op, kube)
    finally:
        relisting.cancel()
        discovering.cancel()
        for w in watches:
            w.stop()


async def _discover_inference_pools(op: Operator, api: kubeapi.ApiClient) -> None:
    """Keeps `op.inference_pools` true while the InferencePool CRD is installed (checked every relist period)."""
    s = op.settings
    while True:
        try:
            served = await asyncio.get_running_loop().run_in_executor(None, inference_pools_served, api,
                                                                      s.api_timeout)
            if served != op.inference_pools:
                log.info("InferencePools %s: ServingDeployments %s", "served" if served else "not served",
                         "get one each" if served else "get Services only")
                op.inference_pools = served
                op.view.wake.set()
        except Exception as e:  # the API server away: keep what was known
            log.warning("could not check for the InferencePool API: %s", e)
        await asyncio.sleep(s.relist_seconds)


# A job arriving this many `batch_seconds` after the previous arrival is planned at once. Twice: jobs submitted
# in bursts a second apart (a client's waves, a pipeline's steps) are batched, not planned a pass for the head
# of each burst and another for the rest.
QUIET_BATCHES = 2.0


def _lone_arrival(op: Operator) -> bool:
    """A TrainingJob new to the view came QUIET_BATCHES x `batch_seconds` or more after the previous one."""
    arrival = op.view.first_arrival
    return arrival is not None and arrival - op.view.taken_arrival >= QUIET_BATCHES * op.settings.batch_seconds


async def _reconcile_forever(op: Operator, kube: Kube) -> None:
    settings, view = op.settings, op.view
    plan_seconds = 0.0
    passed = -float("inf")  # when the last pass ended
    while True:
        try:
            await asyncio.wait_for(view.wake.wait(), timeout=settings.resync_seconds)
        except asyncio.TimeoutError:
            pass
        # Every watch event that changes what planning reads wakes the loop: when planning is slow (many jobs,
        # a busy machine), the next pass waits as long as the last took, so that planning takes at most half of
        # the operator's CPU. (By the wall clock: on a machine short of CPU, passes then slow down instead of
        # taking more of it.)
        if _lone_arrival(op):
            # A job arriving after a quiet spell is planned at once: no debounce, no batch to wait for.
            await asyncio.sleep(passed + plan_seconds - view.clock())
        else:
            await asyncio.sleep(max(settings.debounce_seconds, plan_seconds))
            if view.first_arrival is not None and not _lone_arrival(op):
                # Jobs arriving in a stream or a burst: the pass that takes them (one allocator run for them all)
                # starts once arrivals pause for the debounce, or `batch_seconds` after the first, if sooner.
                while (wait := min(view.first_arrival + settings.batch_seconds,
                                   view.last_arrival + settings.debounce_seconds) - view.clock()) > 0:
                    await asyncio.sleep(wait)
        view.taken()
        try:
            plan_seconds = await _reconcile_once(op, kube)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("reconcile pass failed; retrying at the next wake-up")
        passed = view.clock()


async def _reconcile_once(op: Operator, kube: Kube) -> float:
    """One pass; returns the seconds it spent planning."""
    settings, view, planner, in_flight = op.settings, op.view, op.planner, op.in_flight
    started = time.perf_counter()
    view.prune()
    # Planned in a thread of its own on copies of the view (the objects are replaced, never changed in place),
    # so that the event loop goes on taking watch events and sending writes while a big pass is planned.
    jobs, nodes, pods, servings, deployments = (
        dict(d) for d in (view.jobs, view.nodes, view.pods, view.servings, view.deployments))
    full_passes = planner.full_passes
    # What the writes of earlier passes did that the view's copies may not show yet: planned around, not re-sent.
    done = view.done(time.monotonic(), settings.relist_seconds)
    plans, plan_cpu = await asyncio.get_running_loop().run_in_executor(
        op.plan_thread, _timed, planner.plan, time.time(), settings.allocator, jobs, nodes, pods, servings,
        deployments, settings.max_restarts, settings.pool, op.inference_pools, settings.agent_port,
        {key for kind, key in in_flight if kind == "jobs"}, done, dict(view.queues))
    planned = time.perf_counter()
    actions = dispatched = deferred = 0
    for kind, key, acts in plans:
        if not acts:
            continue
        actions += len(acts)
        # One write chain per object at a time: what it does next is planned once this one is answered.
        if (kind, key) in in_flight:
            deferred += 1
            continue
        view.expect(kind, key, [a for a in acts if isinstance(a, (PatchStatus, PatchAnnotations))])
        # The job's phase as planned: what its status patch changes it from (admissions, rejections).
        before = (jobs[key].get("status") or {}).get("phase") if kind == "jobs" and key in jobs else None
        in_flight[(kind, key)] = asyncio.get_running_loop().create_task(_write(op, kube, kind, key, acts, before))
        dispatched += 1
    op.metrics.passed(planned - started, len(plans), actions, deferred, plan_cpu,
                      planner.full_reason if planner.full_passes > full_passes else None)
    for r in planner.reclaims_announced:
        op.metrics.reclaimed(r.to_queue, r.from_queue, r.gpus)
    # One line per pass (INFO when it acted): re-plan time and API requests so far (the same figures as the
    # operator's metrics, which bench/scale.py reads).
    log.log(logging.INFO if actions else logging.DEBUG,
            "reconcile pass: jobs=%d plan_ms=%.1f actions=%d objects=%d deferred=%d in_flight=%d api_requests=%d "
            "throttled_s=%.1f plan_cpu_ms=%.1f planned=%d full=%d%s", len(view.jobs), (planned - started) * 1e3,
            actions, dispatched, deferred, len(in_flight), kube.requests, kube.throttled_seconds, plan_cpu * 1e3,
            len(plans),
            planner.full_passes - full_passes, f" ({planner.full_reason})" if planner.full_reason else "")
    _log_status_patches(op)
    return planned - started


def status_patch_kind(patch: dict[str, Any]) -> str:
    """"Admitted+placement", "Succeeded", "no phase+guaranteedShare": the phase a TrainingJob status patch
    sets, and the fields it sets that are written on their own occasions."""
    notable = ("placement", "guaranteedShare", "progress", "checkpoint", "lentTo", "restarts")
    return "+".join([str(patch.get("phase", "no phase")), *(f for f in notable if f in patch)])


def _log_status_patches(op: Operator, every: float = 10.0) -> None:
    now, total = time.monotonic(), sum(op.status_patches.values())
    if total != op.status_patches_logged[1] and now - op.status_patches_logged[0] >= every:
        log.info("TrainingJob status patches so far: %s", json.dumps(dict(op.status_patches.most_common())))
        log.info("CPU seconds by thread so far: %s", json.dumps(thread_cpu_seconds()))
        op.status_patches_logged = (now, total)


def thread_cpu_seconds() -> dict[str, float]:
    """CPU seconds of each live thread of this process, by name (numbered names summed: kube_N)."""
    out: dict[str, float] = {}
    for t in threading.enumerate():
        if t.ident is None:
            continue
        try:
            seconds = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (OSError, AttributeError):  # ended meanwhile, or no per-thread clocks here
            continue
        name = re.sub(r"\d+$", "N", t.name)
        out[name] = round(out.get(name, 0.0) + seconds, 2)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """fn(*args) and the CPU seconds this thread spent on it."""
    started = time.thread_time()
    return fn(*args), time.thread_time() - started


async def _write(op: Operator, kube: Kube, kind: str, key: str, actions: list[Action],
                 before: str | None = None) -> None:
    """`before`: a job's phase when its actions were planned."""
    view, answer = op.view, None
    try:
        for action, result in await kube.apply(actions):
            if isinstance(action, (PatchStatus, PatchAnnotations)) and isinstance(result, dict):
                answer = result
                if isinstance(action, PatchStatus) and kind == "jobs":
                    op.status_patches[status_patch_kind(action.status)] += 1
                    op.metrics.job_status_written(before, action.status)
            elif isinstance(action, CreatePod):
                view.created(key_of(action.manifest), time.monotonic())
            elif isinstance(action, ApplyObject):
                view.applied(action.manifest, time.monotonic())
    finally:
        view.settle(kind, key, answer)
        op.in_flight.pop((kind, key), None)
        view.wake.set()
