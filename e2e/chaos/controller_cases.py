"""Chaos cases on the controller's side: the metrics pipeline failing, clocks skewed, forged input, fuzzing.

Each case gets a world of its own (`Rig`): a namespace, a Redis, `flotilla controller` on a SQLite file (or
a PostgreSQL server of the case's own),
and where it needs them the operator, simulated workers, a running TrainingJob and one simulated agent
per KWOK node. A `Watch` samples the cluster every half second while the case runs: which nodes were
marked unhealthy (taint `flotilla.dev/unhealthy` or condition `FlotillaGPUHealthy=False`), the job's
progress, checkpoints and checkpoint requests, and its live worker pods.

Faults on a healthy fleet (nothing may be tainted, the job gets no checkpoint or restart request):
  redis-down-5s               Redis paused (SIGSTOP) 5 s while the agents stream
  redis-down-60s              Redis killed (its data gone) and restarted on its port after 60 s; the controller
                              reports the pipeline fault (`IngestHealthy` False in /v1/cluster) and recovers
  ingest-stalled              every agent paused (SIGSTOP) 5 s
  controller-restart-backlog  the controller killed (SIGKILL) for 20 s while the agents keep writing to Redis,
                              then restarted: it replays the backlog
  database-down-20s           the controller's PostgreSQL stopped 20 s under load (agents on Redis, a client
                              reading /v1/cluster and posting samples over HTTP): only 2xx or 503 with
                              Retry-After, no dropped connection, DatabaseAvailable True after, no node marked
                              unhealthy for the samples it could not store
  agent-clock-skew            half the agents stamp their samples 30 s ahead, half 30 s behind
The control case, so that the ones above cannot pass by acting on nothing:
  real-fault-control          XID 79 (a GPU fell off the bus) on one GPU of the job's node: that GPU, and
                              only that one, leaves service (the node is not tainted) and the job moves off it
Many nodes found faulty at once (a bad firmware push, a detector gone wrong):
  taint-budget                XID 74 (NVLink, node-wide) on every node at once: the taint budget (10 % of the
                              nodes, at least 1, per window) takes out one node; the others' faults are recorded
                              as `action-suppressed`, not acted on, and the job keeps going
Hostile input (controller with `--ingest-auth tokenreview`):
  forged-sample               a token bound to node A posts samples about node B (HTTP and Redis); other SAs,
                              the wrong audience, no token
  forged-stats                serving statistics from callers without the right to the ServingDeployment
  rest-fuzz                   schemathesis over the live OpenAPI schema, with admin, read and no token

Set FLOTILLA_CHAOS_QUICK=1 (bench/chaos.py --quick) for shorter observation windows and fewer fuzz examples;
the faults themselves keep their length.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import httpx

from e2e.chaos.outcome import Outcome
from e2e.kube import (
    FlotillaProcess,
    OperatorProcess,
    SimulatedWorkersProcess,
    apply,
    get,
    items,
    kubectl,
    wait_for,
    wait_for_gpus_free_outside,
)
from flotilla import API_VERSION, GROUP, VERSION
from flotilla.resources import names
from flotilla.testing.services import PostgresServer, RedisServer, free_port

QUICK = os.environ.get("FLOTILLA_CHAOS_QUICK") == "1"
AGENT_INTERVAL = 1.0       # the agents' sampling interval (and the health monitor's evaluation interval)
SETTLE = 5.0 if QUICK else 8.0  # after ingest caught up: long enough for a wrong decision to show
AUDIENCE = "flotilla-controller"
AGENT_SA = "flotilla-agent"
JOB = "steady"
WORKERS = 2                # the job's worker set: 16 GPUs, 8 per worker, on two nodes
NODE_UNHEALTHY_EVENT = "GPUUnhealthy"


# --- measuring -----------------------------------------------------------------------------------------

class Watch:
    """Samples nodes, the case's TrainingJob and its worker pods every `interval` s in a thread of its own.

    Counts what the outcome needs: nodes seen unhealthy, steps lost past the last acknowledged checkpoint
    (progress that went back below a checkpoint acknowledged before it went back), live worker pods beyond the worker
    set, and the checkpoint requests the controller wrote on the job (its annotation, `requestedBy`)."""

    def __init__(self, namespace: str, job: str | None = None, interval: float = 0.5) -> None:
        self.namespace, self.job, self.interval = namespace, job, interval
        self.unhealthy: dict[str, str] = {}      # node -> how it was first seen unhealthy
        self.controller_requests: dict[int, str] = {}  # generation -> reason, checkpoint requests by the controller
        self.steps_lost = 0
        self.duplicate_pods = 0
        self.phase: str | None = None
        self.errors = 0
        self._acked = 0
        self._last_steps = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-watch", daemon=True)

    def start(self) -> "Watch":
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(timeout=15)

    def _run(self) -> None:
        from kubernetes import client, config

        api = config.new_client_from_config(os.environ.get("KUBECONFIG"))
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        try:
            while True:
                try:
                    self.sample(core, custom)
                except Exception:  # the API server may be the fault; keep sampling
                    self.errors += 1
                if self._stop.wait(self.interval):
                    break
            self.sample(core, custom)   # a last look, after the case's checks
        except Exception:
            self.errors += 1
        finally:
            api.close()

    def sample(self, core: Any, custom: Any) -> None:
        nodes = json.loads(core.list_node(label_selector="type=kwok", _preload_content=False,
                                          _request_timeout=5).data)["items"]
        for node in nodes:
            seen = unhealthy(node)
            if seen:
                self.unhealthy.setdefault(node["metadata"]["name"], seen)
        if self.job is None:
            return
        job = custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, "trainingjobs", self.job,
                                                  _request_timeout=5)
        self.observe_job(job)
        pods = json.loads(core.list_namespaced_pod(self.namespace, _preload_content=False,
                                                   _request_timeout=5).data)["items"]
        uid = job["metadata"]["uid"]
        alive = [p for p in pods if owned_by(p, uid) and not p["metadata"].get("deletionTimestamp")
                 and p.get("status", {}).get("phase") in ("Pending", "Running")]
        self.duplicate_pods = max(self.duplicate_pods, len(alive) - WORKERS)

    def observe_job(self, job: dict[str, Any]) -> None:
        status = job.get("status") or {}
        self.phase = status.get("phase")
        steps = int((status.get("progress") or {}).get("steps") or 0)
        if steps < self._last_steps:   # progress went back: count what fell below the checkpoint acknowledged before
            self.steps_lost = max(self.steps_lost, self._acked - steps)
        self._last_steps = steps
        self._acked = max(self._acked, int((status.get("checkpoint") or {}).get("step") or 0))
        raw = (job["metadata"].get("annotations") or {}).get(names.ANNOTATION_CHECKPOINT_REQUEST)
        if raw:
            try:
                request = json.loads(raw)
            except ValueError:
                return
            if request.get("requestedBy") == "controller":
                self.controller_requests.setdefault(int(request.get("generation", 0)), str(request.get("reason")))


def unhealthy(node: dict[str, Any]) -> str:
    """'' for a node Flotilla has not marked unhealthy, else what marks it."""
    marks = [f"taint {t.get('value')}:{t.get('effect')}" for t in node.get("spec", {}).get("taints") or []
             if t.get("key") == names.TAINT_UNHEALTHY]
    marks += [f"{names.NODE_CONDITION_HEALTHY}=False ({c.get('reason')})"
              for c in node.get("status", {}).get("conditions") or []
              if c.get("type") == names.NODE_CONDITION_HEALTHY and c.get("status") == "False"]
    out = (node.get("metadata", {}).get("annotations") or {}).get(names.ANNOTATION_UNHEALTHY_GPUS)
    marks += [f"GPUs out of service {out}"] if out else []
    return ", ".join(marks)


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(r.get("uid") == uid and r.get("controller") for r in obj["metadata"].get("ownerReferences") or [])


def nodes_with_unhealthy_events(since: float) -> set[str]:
    """Nodes with a GPUUnhealthy Event recorded at or after `since` (a taint the Watch may have missed)."""
    found = set()
    for e in items("events", "default"):
        when = max(filter(None, (e.get("lastTimestamp"), e.get("eventTime"), e.get("firstTimestamp"),
                                 (e.get("series") or {}).get("lastObservedTime"))), default=None)
        if (e["involvedObject"].get("kind") == "Node" and e.get("reason") == NODE_UNHEALTHY_EVENT and when
                and rfc3339(when) >= since - 1):
            found.add(e["involvedObject"]["name"])
    return found


def rfc3339(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def kwok_nodes() -> list[str]:
    return sorted(n["metadata"]["name"] for n in json.loads(kubectl("get", "nodes", "-l", "type=kwok", "-o",
                                                                    "json").stdout)["items"])


# --- the processes under test ---------------------------------------------------------------------------

class ControllerUnderTest:
    """`flotilla controller` on a port and a state folder of its own (SQLite, tokens file), restartable on
    both. Clients per role (admin, read, ingest, or None: no token) count the 5xx answers they get."""

    ROLES = ("admin", "read", "ingest")

    def __init__(self, log_path: Path, state: Path, *args: str, db_url: str | None = None) -> None:
        self.log_path, self.state, self.args = log_path, state, args
        self.db_url = db_url or f"sqlite:///{state}/c.db"
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.tokens = {role: secrets.token_hex(24) for role in self.ROLES}
        state.mkdir(parents=True, exist_ok=True)
        (state / "tokens").write_text("".join(f"{t},{role},chaos-{role}\n" for role, t in self.tokens.items()))
        self.http_5xx = 0
        self.answers_5xx: list[str] = []
        self.process: FlotillaProcess | None = None
        self._clients: dict[str | None, httpx.Client] = {}

    def start(self, timeout: float = 60) -> "ControllerUnderTest":
        self.process = FlotillaProcess(self.log_path, "controller", "--db-url", self.db_url,
                                       "--tokens-file", str(self.state / "tokens"), "--port", str(self.port),
                                       *self.args).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.process.alive():
                raise RuntimeError(f"the controller exited ({self.process.proc.returncode}): {self.log_tail()}")
            try:
                if self.client("read").get("/readyz").status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"the controller was not ready within {timeout}s: {self.log_tail()}")

    def log_tail(self, lines: int = 6) -> str:
        try:
            return " | ".join(self.log_path.read_text().strip().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def client(self, role: str | None = "admin") -> httpx.Client:
        if role not in self._clients:
            headers = {"Authorization": f"Bearer {self.tokens[role]}"} if role else {}
            self._clients[role] = httpx.Client(base_url=self.base_url, headers=headers, timeout=10,
                                               event_hooks={"response": [self._count]})
        return self._clients[role]

    @property
    def api(self) -> httpx.Client:
        return self.client("admin")

    def _count(self, response: httpx.Response) -> None:
        # 503 with Retry-After is the API's "the database is away, try again then": a client can act on it.
        if response.status_code >= 500 and not (response.status_code == 503 and "retry-after" in response.headers):
            self.http_5xx += 1
            self.answers_5xx.append(f"{response.request.method} {response.request.url.path} -> "
                                    f"{response.status_code}")

    def kill(self) -> None:
        assert self.process is not None and self.process.proc is not None
        for c in self._clients.values():  # their pooled connections die with the server
            c.close()
        self._clients.clear()
        self.process.proc.kill()
        self.process.proc.wait()
        self.process.stop()   # closes its log

    def stop(self) -> None:
        for c in self._clients.values():
            c.close()
        self._clients.clear()
        if self.process is not None:
            self.process.stop()

    def ingest_healthy(self) -> str | None:
        """status of the `IngestHealthy` condition in GET /v1/cluster; None when there is none."""
        try:
            r = self.client("read").get("/v1/cluster")
        except httpx.TransportError:
            return None
        conditions = r.json().get("conditions") if r.status_code == 200 else None
        return next((c.get("status") for c in conditions or [] if c.get("type") == "IngestHealthy"), None)


def job_manifest(name: str = JOB) -> str:
    return json.dumps({
        "apiVersion": API_VERSION, "kind": "TrainingJob", "metadata": {"name": name},
        "spec": {
            "deadlineSeconds": 7200, "totalSteps": 40000,
            "elasticity": {"minGPUs": 8 * WORKERS, "maxGPUs": 8 * WORKERS, "gpusPerWorker": 8},
            "throughput": [{"gpus": 8, "stepsPerSecond": 10.0}, {"gpus": 16, "stepsPerSecond": 18.0}],
            "checkpoint": {"intervalSteps": 50, "restoreSeconds": 5},
            "template": {"spec": {"containers": [{"name": "w", "image": "busybox:1.36",
                                                  "command": ["sh", "-c", "sleep 3600"]}]}},
        },
    })


def serving_manifest(name: str) -> str:
    template = {"spec": {"containers": [{"name": "s", "image": "vllm/vllm-openai"}]}}
    return json.dumps({
        "apiVersion": API_VERSION, "kind": "ServingDeployment", "metadata": {"name": name},
        "spec": {"slo": {"ttftMs": 400, "tpotMs": 100, "attainment": 0.9},
                 "workload": {"requestsPerSecond": 6, "inputTokens": 512, "outputTokens": 128},
                 "profile": {"name": "opt-13b-a100"}, "maxGPUs": 8, "planner": {"mode": "auto"},
                 "prefill": {"template": template}, "decode": {"template": template}},
    })


class Rig:
    """One case's world. Start parts with the start_* methods; `close()` stops everything that was started
    (paused processes are resumed first), returns every node marked unhealthy to service and deletes the
    namespace, so that the next case finds the cluster as this one did."""

    def __init__(self, case: str, log_dir: Path) -> None:
        self.case = case
        self.logs = log_dir / case
        self.logs.mkdir(parents=True, exist_ok=True)
        self.namespace = f"chaos-{case[:40]}-{uuid.uuid4().hex[:6]}"
        self.started_at = time.time()
        self.redis: RedisServer | None = None
        self.postgres: PostgresServer | None = None
        self.controller: ControllerUnderTest | None = None
        self.processes: list[FlotillaProcess] = []
        self.agents: dict[str, FlotillaProcess] = {}
        self.watch: Watch | None = None
        self.notes: list[str] = []   # what the case saw, for its details; failures start with FAIL
        self.nodes = kwok_nodes()
        kubectl("create", "namespace", self.namespace)

    # -- parts --

    def start_redis(self) -> RedisServer:
        self.redis = RedisServer().start()
        return self.redis

    def start_postgres(self) -> PostgresServer:
        self.postgres = PostgresServer().start()
        return self.postgres

    def start_controller(self, *args: str) -> ControllerUnderTest:
        extra = ("--redis-url", self.redis.url) if self.redis else ()
        db_url = self.postgres.create_database() if self.postgres else None
        self.controller = ControllerUnderTest(self.logs / "controller.log", self.logs / "controller", *extra,
                                              *args, db_url=db_url).start()
        return self.controller

    def _process(self, proc: FlotillaProcess) -> FlotillaProcess:
        self.processes.append(proc)
        return proc.start()

    def start_job(self) -> dict[str, Any]:
        """The operator, simulated workers and the TrainingJob; -> its status once it runs and progresses."""
        wait_for_gpus_free_outside(self.namespace)
        self._process(OperatorProcess(self.logs / "operator.log"))
        self._process(SimulatedWorkersProcess(self.logs / "simworkers.log", self.namespace))
        r = apply(job_manifest(), self.namespace)
        if r.returncode:
            raise RuntimeError(f"kubectl apply of the TrainingJob failed: {r.stderr.strip()}")
        status = wait_for(f"{JOB} running with progress", lambda: (s := self.job_status()).get("phase") == "Running"
                          and s.get("progress", {}).get("steps", 0) >= 20 and len(s.get("placement") or []) == WORKERS
                          and s, timeout=90)
        if self.controller is not None:  # the controller must know where the job runs before the agents speak
            wait_for("the controller mirrors the job's placement", lambda: (
                r := self.controller.api.get(f"/v1/jobs/{self.namespace}/{JOB}")).status_code == 200
                and r.json().get("placement"), timeout=30)
        return status

    def start_agents(self, extra: Callable[[int, str], list[str]] = lambda i, node: []) -> None:
        """One simulated agent per KWOK node, publishing to Redis every AGENT_INTERVAL s; `extra(i, node)`
        gives the i-th node's agent more arguments."""
        assert self.redis is not None
        for i, node in enumerate(self.nodes):
            self.agents[node] = self._process(FlotillaProcess(
                self.logs / f"agent-{node}.log", "agent", "--node", node, "--source", "sim", "--redis-url",
                self.redis.url, "--interval", str(AGENT_INTERVAL), "--step-port", "0", *extra(i, node)))

    def start_watch(self, job: str | None = JOB) -> Watch:
        self.watch = Watch(self.namespace, job).start()
        return self.watch

    # -- state --

    def job_status(self) -> dict[str, Any]:
        return (get("trainingjob", JOB, self.namespace) or {}).get("status", {})

    def ingest_caught_up(self) -> bool:
        """The controller's consumer group has been handed every entry in the stream."""
        import redis

        assert self.redis is not None
        try:
            groups = redis.Redis.from_url(self.redis.url, socket_timeout=2).xinfo_groups("flotilla:metrics")
        except redis.RedisError:
            return False
        return any(g.get("lag") == 0 and int(g.get("entries-read") or 0) > 0 for g in groups)

    def wait_ingest(self, what: str, timeout: float = 60) -> None:
        wait_for(f"the controller to consume the agents' stream ({what})", self.ingest_caught_up,
                 timeout=timeout, interval=0.5)

    def wait_every_agent_heard(self, timeout: float = 60) -> None:
        """Every agent's samples reached the controller (its node has latest samples), and the stream is read."""
        assert self.controller is not None

        def silent() -> list[str]:
            return [n for n in self.agents
                    if not ((r := self.controller.client("read").get(f"/v1/nodes/{n}")).status_code == 200
                            and r.json().get("evidence", {}).get("latestSamples"))]
        wait_for("every agent heard by the controller", lambda: not silent(), timeout=timeout)
        self.wait_ingest("every agent heard")

    def controller_checkpoint_requests(self) -> list[dict[str, Any]]:
        assert self.controller is not None
        r = self.controller.api.get("/v1/decisions", params={"kind": "checkpoint-request",
                                                             "object": f"{self.namespace}/{JOB}"})
        return r.json()["items"] if r.status_code == 200 else []

    def wait_progress(self, beyond: int, timeout: float = 30) -> bool:
        try:
            wait_for(f"{JOB} progressing past step {beyond}",
                     lambda: self.job_status().get("progress", {}).get("steps", 0) > beyond, timeout=timeout)
            return True
        except AssertionError:
            return False

    # -- the end --

    def fail(self, message: str) -> None:
        self.notes.append(f"FAIL {message}")

    def failed(self) -> bool:
        return any(n.startswith("FAIL ") for n in self.notes)

    def measure(self, outcome: Outcome, healthy_exceptions: set[str] = frozenset()) -> None:
        """Stop the watch and put what it (and the controller) counted into the outcome."""
        outcome.details += "".join(f"; {n.removeprefix('FAIL ')}" for n in self.notes)
        if self.watch is not None:
            self.watch.stop()
            seen = dict(self.watch.unhealthy)
            for node in nodes_with_unhealthy_events(self.started_at) - set(seen):
                seen[node] = "GPUUnhealthy Event"
            false = {n: how for n, how in seen.items() if n not in healthy_exceptions}
            outcome.false_taints = len(false)
            if false:
                outcome.details += f"; healthy nodes marked unhealthy: {false}"
            outcome.steps_lost_past_checkpoint = self.watch.steps_lost
            outcome.duplicate_pods = max(0, self.watch.duplicate_pods)
            if self.watch.errors:
                outcome.details += f"; watch: {self.watch.errors} samples failed"
        if self.controller is not None:
            outcome.http_5xx += self.controller.http_5xx
            if self.controller.answers_5xx:
                outcome.details += f"; 5xx: {self.controller.answers_5xx[:5]}"

    def close(self) -> None:
        for proc in self.processes:
            if proc.alive():
                proc.proc.send_signal(signal.SIGCONT)
        if self.redis is not None:
            self.redis.resume()
        for proc in reversed(self.processes):  # agents first: they say goodbye while the controller listens
            proc.stop()
        bad = [n for n in self.nodes if unhealthy(get("node", n, "default") or {})]
        if self.controller is not None and self.controller.process is not None and self.controller.process.alive():
            for node in bad:
                self.controller.api.post(f"/v1/nodes/{node}/return-to-service",
                                         json={"reason": f"chaos case {self.case}: cleanup"})
        if self.controller is not None:
            self.controller.stop()
        if self.redis is not None:
            self.redis.stop()
        if self.postgres is not None:
            self.postgres.remove()
        for node in bad:  # whatever the controller could not undo
            restore_node(node)
        kubectl("delete", "namespace", self.namespace, "--wait=false", check=False)


def restore_node(node: str) -> None:
    found = get("node", node, "default") or {}
    if any(t.get("key") == names.TAINT_UNHEALTHY for t in found.get("spec", {}).get("taints") or []):
        kubectl("taint", "nodes", node, f"{names.TAINT_UNHEALTHY}-", check=False)
    if (found.get("metadata", {}).get("annotations") or {}).get(names.ANNOTATION_UNHEALTHY_GPUS):
        kubectl("annotate", "node", node, f"{names.ANNOTATION_UNHEALTHY_GPUS}-", check=False)
    if "False" in unhealthy(found):
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        kubectl("patch", "node", node, "--subresource=status", "--type=strategic", "-p", json.dumps({"status": {
            "conditions": [{"type": names.NODE_CONDITION_HEALTHY, "status": "True", "reason": "ChaosCleanup",
                            "message": "returned to service after a chaos case", "lastTransitionTime": now,
                            "lastHeartbeatTime": now}]}}), check=False)


def run_case(case: str, log_dir: Path, body: Callable[[Rig, Outcome], None],
             healthy_exceptions: Callable[[], set[str]] = set) -> Outcome:
    """Run `body` in a fresh Rig; whatever it raises fails the case with its message; counters always filled."""
    outcome = Outcome(case)
    began = time.monotonic()
    rig: Rig | None = None
    try:
        rig = Rig(case, log_dir)
        body(rig, outcome)
    except Exception as e:
        outcome.passed = False
        outcome.details = f"{type(e).__name__}: {e}" + outcome.details
    finally:
        if rig is not None:
            try:
                rig.measure(outcome, healthy_exceptions())
            finally:
                rig.close()
        outcome.details = outcome.details.lstrip("; ")
        outcome.seconds = round(time.monotonic() - began, 1)
    return outcome


# --- faults on a healthy fleet ----------------------------------------------------------------------------

def quiet_fault(case: str, fault: Callable[[Rig], None],
                agent_args: Callable[[int, str], list[str]] = lambda i, node: [],
                postgres: bool = False) -> Callable[[Path], Outcome]:
    """A case in which the fleet stays healthy through `fault`: no node may be marked unhealthy, the job
    gets no checkpoint or restart request from the controller and keeps going. `fault(rig)` injects the
    fault, ends it, and notes what it saw (rig.notes, rig.fail). `postgres`: the controller's database is a
    PostgreSQL server of the case's own (`rig.postgres`), else SQLite."""

    def body(rig: Rig, outcome: Outcome) -> None:
        rig.start_redis()
        if postgres:
            rig.start_postgres()
        rig.start_controller()
        first = rig.start_job()
        watch = rig.start_watch()
        rig.start_agents(agent_args)
        rig.wait_every_agent_heard()
        fault(rig)
        rig.wait_ingest("after the fault")
        time.sleep(SETTLE)   # nothing to wait on: a wrong decision would show within this window
        status = rig.job_status()
        requests = rig.controller_checkpoint_requests()
        moving = rig.wait_progress(status.get("progress", {}).get("steps", 0))
        if status.get("phase") not in ("Running", "Resharding") or not moving:
            outcome.jobs_lost = 1
            rig.fail(f"the job stopped: phase {status.get('phase')}, progressing {moving}")
        if requests or watch.controller_requests:
            reasons = [d.get("reason") for d in requests] or list(watch.controller_requests.values())
            rig.fail(f"the controller asked the healthy job for {max(len(requests), len(watch.controller_requests))} "
                     f"checkpoint/restart request(s): {reasons[:3]}")
        reshards = status.get("reshards", 0) - first.get("reshards", 0)
        if reshards:
            rig.fail(f"the job was resharded {reshards} time(s)")
        rig.notes.append(f"job at step {status.get('progress', {}).get('steps')}, checkpoint "
                         f"{status.get('checkpoint', {}).get('step')}")
        outcome.passed = not rig.failed()

    return lambda log_dir: run_case(case, log_dir, body)


def pause_redis(seconds: float) -> Callable[[Rig], None]:
    def fault(rig: Rig) -> None:
        assert rig.redis is not None
        rig.redis.pause()
        time.sleep(seconds)
        rig.redis.resume()
        rig.notes.append(f"Redis paused {seconds:g} s; IngestHealthy after: {rig.controller.ingest_healthy()}")
    return fault


def kill_redis(seconds: float) -> Callable[[Rig], None]:
    """Redis killed (its stream and consumer group gone) and restarted on its port after `seconds`.
    The controller must say so while it lasts (IngestHealthy False) and recover after."""

    def fault(rig: Rig) -> None:
        assert rig.redis is not None and rig.controller is not None
        rig.redis.kill()
        began = time.monotonic()
        seen: set[str | None] = set()
        while time.monotonic() - began < seconds:
            seen.add(rig.controller.ingest_healthy())
            time.sleep(1.0)
        rig.redis.start()
        if "False" not in seen:
            rig.fail(f"IngestHealthy never False during the {seconds:g} s outage (seen: {sorted(map(str, seen))})")
        try:
            wait_for("IngestHealthy True again", lambda: rig.controller.ingest_healthy() == "True", timeout=30)
            rig.notes.append(f"Redis down {seconds:g} s: IngestHealthy {'False during, ' if 'False' in seen else ''}"
                             "True after")
        except AssertionError:
            rig.fail("IngestHealthy not True within 30 s after Redis came back "
                     f"(now {rig.controller.ingest_healthy()})")
    return fault


def stall_agents(seconds: float) -> Callable[[Rig], None]:
    def fault(rig: Rig) -> None:
        for agent in rig.agents.values():
            agent.proc.send_signal(signal.SIGSTOP)
        time.sleep(seconds)
        for agent in rig.agents.values():
            agent.proc.send_signal(signal.SIGCONT)
        rig.notes.append(f"{len(rig.agents)} agents paused {seconds:g} s")
    return fault


def restart_controller(seconds: float) -> Callable[[Rig], None]:
    def fault(rig: Rig) -> None:
        assert rig.controller is not None and rig.redis is not None
        rig.controller.kill()
        time.sleep(seconds)
        import redis

        backlog = redis.Redis.from_url(rig.redis.url).xinfo_groups("flotilla:metrics")[0].get("lag")
        rig.controller.start()
        rig.notes.append(f"controller killed for {seconds:g} s, restarted with a backlog of {backlog} stream entries")
    return fault


def stop_database(seconds: float) -> Callable[[Rig], None]:
    """The controller's PostgreSQL stopped for `seconds` and started again, while a client reads the cluster and an
    agent-like caller posts samples over HTTP: every answer a 2xx or a 503 with Retry-After (any other 5xx is
    counted by the controller's clients), no connection dropped, and GET /v1/cluster's DatabaseAvailable False
    while it lasts and True after."""

    def fault(rig: Rig) -> None:
        assert rig.postgres is not None and rig.controller is not None
        ctl, node = rig.controller, rig.nodes[0]
        answers: dict[int, int] = {}
        dropped: list[str] = []
        seen: set[str | None] = set()

        def ask() -> None:
            sample = {"ts": time.time(), "node": node, "metric": "gpu_util", "value": 50.0, "gpu": 0}
            for what, call in (("GET /v1/cluster", lambda: ctl.client("read").get("/v1/cluster")),
                               ("POST /v1/ingest", lambda: ctl.client("ingest").post(
                                   "/v1/ingest", json={"node": node, "samples": [sample]}))):
                try:
                    r = call()
                except httpx.TransportError as e:
                    dropped.append(f"{what}: {type(e).__name__}")
                    continue
                answers[r.status_code] = answers.get(r.status_code, 0) + 1
                if what.startswith("GET") and r.status_code == 200:
                    seen.add(next((c.get("status") for c in r.json().get("conditions") or []
                                   if c.get("type") == "DatabaseAvailable"), None))

        rig.postgres.stop()
        began = time.monotonic()
        while time.monotonic() - began < seconds:
            ask()
            time.sleep(0.5)
        rig.postgres.start()
        wait_for("the API answers again", lambda: ctl.client("read").get("/v1/cluster").status_code == 200, timeout=60)
        for _ in range(4):
            ask()
        if dropped:
            rig.fail(f"{len(dropped)} requests lost their connection: {dropped[:3]}")
        if not answers.get(503):
            rig.fail(f"no 503 while the database was away (answers {answers})")
        if "True" not in seen:
            rig.fail(f"GET /v1/cluster never said DatabaseAvailable True after the outage (seen {sorted(map(str, seen))})")
        rig.notes.append(f"PostgreSQL stopped {seconds:g} s: answers {dict(sorted(answers.items()))}, "
                         f"DatabaseAvailable seen {sorted(map(str, seen))}")
    return fault


def observe(seconds: float) -> Callable[[Rig], None]:
    def fault(rig: Rig) -> None:
        time.sleep(seconds)
        rig.notes.append(f"observed {seconds:g} s")
    return fault


def skewed(i: int, node: str) -> list[str]:
    """Every other node's agent runs 30 s ahead, the others 30 s behind."""
    return ["--clock-offset", "30" if i % 2 else "-30"]


# --- the control case: a real fault is still acted on ---------------------------------------------------

def real_fault_control(log_dir: Path) -> Outcome:
    faulty: list[str] = []

    def body(rig: Rig, outcome: Outcome) -> None:
        rig.start_redis()
        rig.start_controller()
        first = rig.start_job()
        faulty.append(first["placement"][0]["node"])
        node = faulty[0]
        rig.start_watch()
        strike = 8.0   # seconds after the agents start: ingest is steady by then
        rig.start_agents(lambda i, n: ["--inject", f"fell_off_bus@{strike:g}#3"] if n == node else [])
        rig.wait_every_agent_heard()
        # XID 79 is local to its GPU: GPU 3 leaves service, not the node; the job's 8-GPU worker held it and
        # no longer fits on the node's 7, so the job moves.
        found = wait_for(f"GPU 3 of {node} out of service", lambda: (n := get("node", node, "default") or {})
                         and '"3"' in ((n.get("metadata", {}).get("annotations") or {})
                                       .get(names.ANNOTATION_UNHEALTHY_GPUS) or "") and n, timeout=strike + 40)
        if any(t.get("key") == names.TAINT_UNHEALTHY for t in found.get("spec", {}).get("taints") or []):
            raise AssertionError(f"{node} was tainted for a fault of one GPU")
        moved = wait_for("the job moved off the faulty node", lambda: (s := rig.job_status()).get("phase") == "Running"
                         and node not in {p["node"] for p in s.get("placement") or []} and s, timeout=90)
        if not rig.wait_progress(moved.get("progress", {}).get("steps", 0)):
            outcome.jobs_lost = 1
            raise AssertionError("the job did not progress after it moved")
        outcome.passed = True
        outcome.details = (f"XID 79 on {node}: {unhealthy(found)}; job moved to "
                           f"{sorted(p['node'] for p in moved['placement'])}, resumed at checkpoint step "
                           f"{moved.get('checkpoint', {}).get('step')}")

    return run_case("real-fault-control", log_dir, body, healthy_exceptions=lambda: set(faulty))


def taint_budget(log_dir: Path) -> Outcome:
    struck: list[str] = []

    def body(rig: Rig, outcome: Outcome) -> None:
        rig.start_redis()
        rig.start_controller()
        rig.start_job()
        rig.start_watch()
        rig.start_agents()
        rig.wait_every_agent_heard()
        budget = max(1, int(0.10 * len(rig.nodes)))  # the controller's defaults: --taint-budget-fraction 0.10
        ingest = rig.controller.client("ingest")
        for node in rig.nodes:
            r = ingest.post("/v1/ingest", json={"node": node, "samples": [xid_sample(node, 74.0)]})
            if r.status_code != 202:
                raise AssertionError(f"XID 74 on {node}: {r.status_code} {r.text[:200]}")
            struck.append(node)
        held = wait_for(f"{len(struck) - budget} faults held back by the taint budget", lambda: (
            d := rig.controller.client("read").get("/v1/decisions", params={"kind": "action-suppressed"}).json()["items"])
            and len({x.get("object") for x in d}) >= len(struck) - budget and d, timeout=30)
        time.sleep(SETTLE)   # a taint beyond the budget would show within this window
        tainted = [n for n in rig.nodes if any(t.get("key") == names.TAINT_UNHEALTHY for t in
                                               (get("node", n, "default") or {}).get("spec", {}).get("taints") or [])]
        if len(tainted) > budget:
            rig.fail(f"{len(tainted)} nodes tainted ({tainted}), over the budget of {budget}")
        if not all(x.get("reason", "").startswith("taint budget") for x in held):
            rig.fail(f"the suppressed decisions do not name the taint budget: {json.dumps(held)[:300]}")
        if not rig.wait_progress(rig.job_status().get("progress", {}).get("steps", 0)):
            outcome.jobs_lost = 1
            rig.fail("the job stopped")
        rig.notes.append(f"XID 74 on {len(struck)} nodes: {len(tainted)} tainted ({', '.join(tainted)}), "
                         f"{len({x.get('object') for x in held})} held back by the taint budget")
        outcome.passed = not rig.failed()

    return run_case("taint-budget", log_dir, body, healthy_exceptions=lambda: set(struck))


# --- hostile input ------------------------------------------------------------------------------------------

def create_token(sa: str, namespace: str, pod: str | None = None, audience: str = AUDIENCE) -> str:
    args = ["create", "token", sa, "-n", namespace, "--audience", audience, "--duration", "10m"]
    if pod:
        args += ["--bound-object-kind", "Pod", "--bound-object-name", pod]
    return kubectl(*args).stdout.strip()


def bound_pod(name: str, sa: str, node: str) -> dict[str, Any]:
    """A pod using `sa`, bound to `node` (as the agent's DaemonSet pod would be): its tokens name the node."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "serviceAccountName": sa, "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "agent", "image": "flotilla/agent:chaos"}]}}


def apply_all(namespace: str, *objects: dict[str, Any]) -> None:
    r = apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}), namespace)
    if r.returncode:
        raise RuntimeError(f"kubectl apply failed: {r.stderr.strip()}")


def service_account(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}


def post(client: httpx.Client, path: str, body: Any, token: str | None, **kw: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return client.post(path, json=body, headers=headers, **kw)


def xid_sample(node: str, xid: float = 79.0) -> dict[str, Any]:
    return {"ts": time.time(), "node": node, "metric": "xid", "value": xid, "gpu": 0}


def attempt(outcome: Outcome, what: str, response: httpx.Response, refused: tuple[int, ...] = (403,)) -> bool:
    """A forged write: counted when accepted; -> whether it was refused as it should be."""
    if response.status_code < 300:
        outcome.forged_writes_accepted += 1
    ok = response.status_code in refused
    expected = "" if ok else f" (expected {'/'.join(map(str, refused))})"
    outcome.details += f"; {what}: {response.status_code}{expected}"
    return ok


def tokenreview_controller(rig: Rig) -> ControllerUnderTest:
    return rig.start_controller("--ingest-auth", "tokenreview", "--token-audience", AUDIENCE,
                                "--agent-service-accounts", f"{rig.namespace}/{AGENT_SA}")


def metric_sum(ctl: ControllerUnderTest, name: str, *labels: str) -> float:
    """Sum of a Prometheus series from /metrics over the samples carrying every one of `labels` (k="v")."""
    text = ctl.client("read").get("/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") and all(label in line for label in labels))


def forged_sample(log_dir: Path) -> Outcome:
    from flotilla.health import samples as wire

    def body(rig: Rig, outcome: Outcome) -> None:
        a, b = rig.nodes[0], rig.nodes[1]
        apply_all(rig.namespace, service_account(AGENT_SA), service_account("stranger"),
                  bound_pod("agent-a", AGENT_SA, a), bound_pod("stranger-b", "stranger", b))
        rig.start_redis()
        ctl = tokenreview_controller(rig)
        rig.start_watch(job=None)
        token_a = create_token(AGENT_SA, rig.namespace, "agent-a")
        stranger_b = create_token("stranger", rig.namespace, "stranger-b")
        wrong_audience = create_token(AGENT_SA, rig.namespace, "agent-a", audience="https://kubernetes.default.svc")
        c = ctl.client(None)
        results = [
            attempt(outcome, f"token bound to {a} claims XID 79 on {b}",
                    post(c, "/v1/ingest", {"node": b, "samples": [xid_sample(b)]}, token_a)),
            attempt(outcome, f"token bound to {a} sends a sample about {b} in {a}'s batch",
                    post(c, "/v1/ingest", {"node": a, "samples": [xid_sample(b)]}, token_a), (403, 422)),
            attempt(outcome, f"a non-agent ServiceAccount bound to {b} claims XID 79 on {b}",
                    post(c, "/v1/ingest", {"node": b, "samples": [xid_sample(b)]}, stranger_b)),
            attempt(outcome, f"{a}'s agent token for another audience",
                    post(c, "/v1/ingest", {"node": a, "samples": [xid_sample(a, 0.0)]}, wrong_audience), (401, 403)),
            attempt(outcome, "no token", post(c, "/v1/ingest", {"node": b, "samples": [xid_sample(b)]}, None),
                    (401,)),
        ]
        # The control: the agent's own node, a metric that starts no heartbeat watch, then a goodbye.
        own = post(c, "/v1/ingest", {"node": a, "samples": [
            {"ts": time.time(), "node": a, "metric": "temperature", "value": 60.0, "gpu": 0},
            {"ts": time.time(), "node": a, "metric": "heartbeat", "value": 0.0}]}, token_a)
        outcome.details += f"; {a}'s agent about {a} (control): {own.status_code}"

        # The same through Redis: entries carry the agent's token (agents started with --token-file).
        import redis

        stream = redis.Redis.from_url(rig.redis.url)
        token_field = getattr(wire, "TOKEN_FIELD", "token")
        refused_before = metric_sum(ctl, "flotilla_ingest_rejected_total", 'transport="redis"')
        stream.xadd(wire.STREAM, {wire.FIELD: wire.encode_batch([wire.Sample.from_dict(xid_sample(b))]),
                                  token_field: token_a})
        stream.xadd(wire.STREAM, {wire.FIELD: wire.encode_batch([wire.Sample.from_dict(xid_sample(b))])})
        rig.wait_ingest("the forged entries")
        refused = metric_sum(ctl, "flotilla_ingest_rejected_total", 'transport="redis"') - refused_before
        outcome.forged_writes_accepted += max(0, 2 - int(refused))
        results.append(refused >= 2)
        outcome.details += (f"; Redis entries about {b} with {a}'s token and with none: {int(refused)} of 2 "
                            "refused (flotilla_ingest_rejected_total)")
        time.sleep(3.0)   # a forged XID that got through is acted on within a health tick
        outcome.passed = all(results) and own.status_code == 202

    return run_case("forged-sample", log_dir, body)


def forged_stats(log_dir: Path) -> Outcome:
    def body(rig: Rig, outcome: Outcome) -> None:
        a = rig.nodes[0]
        role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "chat-stats"},
                "rules": [{"apiGroups": [GROUP], "resources": ["servingdeployments", "servingdeployments/stats",
                                                               "servingdeployments/status"],
                           "resourceNames": ["chat"], "verbs": ["*"]}]}
        binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                   "metadata": {"name": "chat-stats"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "chat-stats"},
                   "subjects": [{"kind": "ServiceAccount", "name": "chat-router", "namespace": rig.namespace}]}
        apply_all(rig.namespace, service_account(AGENT_SA), service_account("chat-router"),
                  service_account("stranger"), bound_pod("agent-a", AGENT_SA, a), role, binding)
        for sd in ("chat", "other"):
            r = apply(serving_manifest(sd), rig.namespace)
            if r.returncode:
                raise RuntimeError(f"kubectl apply of ServingDeployment {sd} failed: {r.stderr.strip()}")
        ctl = tokenreview_controller(rig)
        rig.start_watch(job=None)
        for sd in ("chat", "other"):
            wait_for(f"the controller mirrors {sd}",
                     lambda: ctl.api.get(f"/v1/serving/{rig.namespace}/{sd}").status_code == 200, timeout=30)
        router = create_token("chat-router", rig.namespace)
        stranger = create_token("stranger", rig.namespace)
        agent = create_token(AGENT_SA, rig.namespace, "agent-a")
        stats = {"windowSeconds": 10, "requestsPerSecond": 500, "meanPromptTokens": 512, "meanOutputTokens": 128,
                 "ttftP90Ms": 5000, "tpotP90Ms": 400, "attainment": 0.1, "requests": 5000}
        prometheus = ('vllm:num_requests_running{model_name="m"} 900\n'
                      'vllm:request_success_total{finished_reason="stop",model_name="m"} 100000\n')
        c = ctl.client(None)
        path = f"/v1/serving/{rig.namespace}"
        results = [
            attempt(outcome, "a ServiceAccount with no right to chat", post(c, f"{path}/chat/stats", stats, stranger)),
            attempt(outcome, "a node agent's token", post(c, f"{path}/chat/stats", stats, agent)),
            attempt(outcome, "chat's router for another deployment", post(c, f"{path}/other/stats", stats, router)),
            attempt(outcome, "a ServiceAccount with no right to chat (Prometheus text)",
                    c.post(f"{path}/chat/stats/prometheus", content=prometheus,
                           headers={"Authorization": f"Bearer {stranger}", "Content-Type": "text/plain"})),
            attempt(outcome, "no token", post(c, f"{path}/chat/stats", stats, None), (401,)),
        ]
        own = post(c, f"{path}/chat/stats", {**stats, "requestsPerSecond": 6, "attainment": 0.99}, router)
        outcome.details += f"; chat's router for chat (control): {own.status_code}"
        outcome.passed = all(results) and own.status_code == 202

    return run_case("forged-stats", log_dir, body)


def rest_fuzz(log_dir: Path) -> Outcome:
    examples = {"admin": 8, "read": 4, None: 2} if QUICK else {"admin": 20, "read": 8, None: 3}

    def body(rig: Rig, outcome: Outcome) -> None:
        import schemathesis
        from hypothesis import HealthCheck, Phase, given, settings

        for manifest in (job_manifest("fuzzed"), serving_manifest("fuzzed")):
            apply(manifest, rig.namespace)   # objects in the mirror, so listing them serializes something
        ctl = rig.start_controller()
        hidden = [*ctl.tokens.values(), *kube_tokens()]
        schema = schemathesis.openapi.from_url(f"{ctl.base_url}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        problems: list[str] = []
        calls = {"n": 0, "transport_errors": 0}

        for role, n in examples.items():
            headers = {"Authorization": f"Bearer {ctl.tokens[role]}"} if role else {}
            for operation in operations:
                @given(case=operation.as_strategy())
                @settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                          phases=[Phase.explicit, Phase.generate], database=None)
                def fuzz(case: Any) -> None:
                    calls["n"] += 1
                    try:
                        response = case.call(base_url=ctl.base_url, headers=headers, timeout=15)
                    except Exception as e:  # the server hung up or timed out: as bad as a 5xx
                        calls["transport_errors"] += 1
                        problems.append(f"{case.method} {case.formatted_path}: {type(e).__name__}")
                        return
                    text = response.text
                    where = f"{case.method} {case.formatted_path} as {role or 'anonymous'}"
                    if response.status_code >= 500:
                        outcome.http_5xx += 1
                        problems.append(f"{where}: {response.status_code}")
                    if "Traceback" in text or 'File "/' in text:
                        problems.append(f"{where}: a stack trace in the answer")
                    if any(secret in text for secret in hidden):
                        problems.append(f"{where}: a token in the answer")

                fuzz()
        alive = ctl.process is not None and ctl.process.alive() and ctl.api.get("/readyz").status_code == 200
        outcome.passed = not problems and alive
        outcome.details = (f"{calls['n']} requests over {len(operations)} operations (admin, read, no token); "
                           f"controller {'still ready' if alive else 'NOT ready'} after"
                           + (f"; problems: {problems[:8]}" if problems else ""))

    return run_case("rest-fuzz", log_dir, body)


def kube_tokens() -> list[str]:
    """The bearer tokens in KUBECONFIG: none may show up in an answer."""
    path = os.environ.get("KUBECONFIG")
    if not path:
        return []
    return [line.split("token:", 1)[1].strip() for line in Path(path).read_text().splitlines()
            if line.strip().startswith("token:")]


CASES: dict[str, Callable[[Path], Outcome]] = {
    "redis-down-5s": quiet_fault("redis-down-5s", pause_redis(5.0)),
    "redis-down-60s": quiet_fault("redis-down-60s", kill_redis(60.0)),
    "ingest-stalled": quiet_fault("ingest-stalled", stall_agents(5.0)),
    "controller-restart-backlog": quiet_fault("controller-restart-backlog", restart_controller(20.0)),
    "database-down-20s": quiet_fault("database-down-20s", stop_database(20.0), postgres=True),
    "agent-clock-skew": quiet_fault("agent-clock-skew", observe(10.0 if QUICK else 15.0), agent_args=skewed),
    "real-fault-control": real_fault_control,
    "taint-budget": taint_budget,
    "forged-sample": forged_sample,
    "forged-stats": forged_stats,
    "rest-fuzz": rest_fuzz,
}
