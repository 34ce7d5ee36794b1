"""Which of Flotilla's source files the three flows a newcomer follows pass through, measured.

  PYTHONPATH=src python scripts/flow_files.py [--json]

Each flow is run in one process with the real code of every component it crosses (the operator's watch, view,
loop and writes; the controller's HTTP API, ingest, health responder or re-planner and its writes; a worker's
client), and a profiler (sys.setprofile, every thread) records each call into a file under src/flotilla/:

* training   — a TrainingJob from `kubectl apply` to Running pods, then a rescale when a node is added
               (checkpoint request, the worker's acknowledgement through `flotilla.worker`, the new worker set);
* fault      — an agent's XID sample posted to the controller's /v1/ingest, to the node's taint and the job's
               checkpoint request, then the operator moving the job onto a healthy node;
* serving    — a load change posted to /v1/serving/{ns}/{name}/stats, the controller's re-plan to spec.plan,
               then the operator's new replica counts on the Deployments (with the unified pool).

Only the API server is replaced, below every Flotilla function: `FakeApiServer` answers the HTTP requests the
Kubernetes client would send (objects by path, merge patches, server-side apply as a merge, creates and deletes;
a created pod is bound and Running, the scheduler's and kubelet's part) and hands each change back to the
operator as a watch event through `flotilla.operator.watch`.

What is counted, per flow:
* `files`: the distinct files, in the order the flow first called into them (set-up before the flow is not
  traced; a module's import is not a call into it);
* `twice`: the files the flow enters a second time on one call chain: it went from the file into others and
  one of those called back into it (a callback, or a helper of the caller's) before the first call returned,
  so that following the flow means reading that file twice, e.g. reconcile.py -> training.py -> reconcile.py.
  Each is shown with its chain.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
SRC = str(ROOT / "src" / "flotilla") + os.sep
_RESUMABLE = 0x20 | 0x80 | 0x200  # CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR


# ---------------------------------------------------------------- the profiler

class Trace:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.on = False
        self.first: list[str] = []  # files in the order the flow first called into them
        self.twice: dict[str, list[str]] = defaultdict(list)  # file -> the chains that entered it again

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if not self.on or event != "call":
            return
        name = frame.f_code.co_filename
        if not name.startswith(SRC):
            return
        if frame.f_code.co_flags & _RESUMABLE and frame.f_lasti > 0:
            return  # a coroutine or generator resumed, not called
        if frame.f_code.co_name == "<module>":
            return  # a module imported on first use: not a step of the flow
        file = _rel(name)
        with self.lock:
            if file not in self.first:
                self.first.append(file)
        back = frame.f_back
        while back is not None and not back.f_code.co_filename.startswith(SRC):
            back = back.f_back
        if back is None or back.f_code.co_filename == name:
            return  # entered from outside Flotilla, or a call within the file
        chain = _chain(back)
        if file not in chain:
            return
        shown = " -> ".join([*chain[chain.index(file):], file])
        with self.lock:
            if shown not in self.twice[file]:
                self.twice[file].append(shown)

    def report(self) -> dict[str, Any]:
        return {"files": list(self.first), "count": len(self.first), "twice": dict(self.twice)}


def _rel(name: str) -> str:
    return "src/flotilla/" + name[len(SRC):]


def _chain(frame: Any) -> list[str]:
    """The Flotilla files on the stack, outermost first, a file's consecutive frames as one."""
    files: list[str] = []
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(SRC) and (not files or files[-1] != _rel(name)):
            files.append(_rel(name))
        frame = frame.f_back
    return files[::-1]


def _install(trace: Trace) -> None:
    sys.setprofile(trace)
    threading.setprofile(trace)


# ---------------------------------------------------------------- the API server, below the Kubernetes client

WATCHED = {"trainingjobs": "jobs", "pods": "pods", "nodes": "nodes", "servingdeployments": "servings",
           "deployments": "deployments"}


class Reply:
    def __init__(self, status: int, body: Any) -> None:
        self.status, self.reason = status, "OK" if status < 300 else "Not Found"
        self.data = json.dumps(body).encode()
        self.headers = {"Content-Type": "application/json"}

    def getheaders(self) -> dict[str, str]:
        return self.headers

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name, default)

    def release_conn(self) -> None:
        pass

    drain_conn = release_conn


def merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge(out.get(k), v)
    return out


class FakeApiServer:
    """Objects by path; what changed is kept for the operator's watches (`changes`)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.version = 100
        self.changes: list[tuple[str, str, dict[str, Any]]] = []  # (watched kind, event type, object)

    # urllib3's PoolManager.request, as the Kubernetes client and flotilla.kubeapi.send call it
    def request(self, method: str, url: str, body: Any = None, headers: Any = None, **_: Any) -> Reply:
        path = urlparse(url).path
        data = json.loads(body) if isinstance(body, (str, bytes)) and body else body
        if method == "GET":
            if path in self.objects:
                return Reply(200, self.objects[path])
            plural = path.rstrip("/").rsplit("/", 1)[-1]
            return Reply(200, {"items": [o for p, o in self.objects.items() if f"/{plural}/" in p]})
        obj_path = path.removesuffix("/status")
        if method == "POST":
            obj_path = f"{path}/{data['metadata']['name']}"
            return Reply(201, self.put(obj_path, copy.deepcopy(data), "ADDED"))
        if method == "DELETE":
            gone = self.objects.pop(obj_path, None)
            if gone is not None:
                self._changed(obj_path, "DELETED", gone)
            return Reply(200, gone or {})
        if method == "PATCH":
            if obj_path not in self.objects and "apply-patch" not in str((headers or {}).get("Content-Type")):
                return Reply(404, {"kind": "Status", "code": 404})
            was = self.objects.get(obj_path, {})
            return Reply(200, self.put(obj_path, merge(was, data), "MODIFIED" if was else "ADDED"))
        raise AssertionError(f"{method} {path}")

    def put(self, path: str, obj: dict[str, Any], kind: str = "ADDED") -> dict[str, Any]:
        self.version += 1
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(self.version)
        meta.setdefault("uid", f"uid-{meta.get('name')}")
        if "/pods/" in path and kind == "ADDED":  # the scheduler binds it, the kubelet runs it
            spec = obj.setdefault("spec", {})
            spec.setdefault("nodeName", (spec.get("nodeSelector") or {}).get("kubernetes.io/hostname"))
            obj["status"] = {"phase": "Running"}
        self.objects[path] = obj
        self._changed(path, kind, obj)
        return obj

    def _changed(self, path: str, kind: str, obj: dict[str, Any]) -> None:
        parts = path.strip("/").split("/")
        plural = parts[-2]
        if plural in WATCHED:
            self.changes.append((WATCHED[plural], kind, copy.deepcopy(obj)))

    def client(self) -> Any:
        from kubernetes import client

        api = client.ApiClient(client.Configuration(host="http://api-server.invalid"))
        api.rest_client.pool_manager = self
        return api


class Lines:
    """A watch response: one event per line."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.lines = [json.dumps(e).encode() for e in events]

    def __iter__(self) -> Any:
        return iter(self.lines)

    def release_conn(self) -> None:
        pass


# ---------------------------------------------------------------- the operator, as its process runs it

class OperatorHarness:
    def __init__(self, server: FakeApiServer, pool: bool = False) -> None:
        from flotilla.allocation import policies
        from flotilla.operator import handlers
        from flotilla.operator.kube import Kube
        from flotilla.pool import PoolPolicy

        self.server = server
        self.handlers = handlers
        self.op = handlers.Operator(handlers.Settings(allocator=policies.get("elastic-deadline"),
                                                      pool=PoolPolicy() if pool else None))
        self.kube = Kube(server.client())

    async def deliver(self) -> None:
        """The API server's changes, as watch events through the operator's informers."""
        from flotilla.operator.watch import Informer

        changes, self.server.changes = self.server.changes, []
        by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for kind, type_, obj in changes:
            by_kind[kind].append({"type": type_, "object": obj})
        loop = asyncio.get_running_loop()
        for kind, events in by_kind.items():
            informer = Informer(self.op.view, kind, None, lambda **_: Lines(events), loop, 5.0)
            for event in informer._watch("1"):
                informer._on_loop(self.op.view.record, kind, event)
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    async def until(self, done: Any, passes: int = 12) -> int:
        """Passes (each: the operator's pass, its writes answered, the changes watched) until `done()`."""
        for i in range(passes):
            await self.deliver()
            if done():
                return i
            await self.handlers._reconcile_once(self.op, self.kube)
            if self.op.in_flight:
                await asyncio.gather(*list(self.op.in_flight.values()))
            await self.deliver()
            if done():
                return i + 1
            await asyncio.sleep(0.01)
        raise AssertionError("the flow did not finish")


def node(name: str, gpus: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "flotilla.dev/rack": "r0"}},
            "spec": {"taints": []},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}, "capacity": {"nvidia.com/gpu": str(gpus)},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def trainingjob(name: str, min_gpus: int, max_gpus: int) -> dict[str, Any]:
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {"apiVersion": "flotilla.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": 1,
                         "creationTimestamp": created, "annotations": {}},
            "spec": {"deadlineSeconds": 36000, "totalSteps": 10000,
                     "elasticity": {"minGPUs": min_gpus, "maxGPUs": max_gpus, "gpusPerWorker": 1},
                     "throughput": [{"gpus": 1, "stepsPerSecond": 1.0}, {"gpus": 4, "stepsPerSecond": 3.6}],
                     "checkpoint": {"intervalSteps": 100, "restoreSeconds": 30},
                     "template": {"spec": {"containers": [{"name": "w", "image": "img"}]}}},
            "status": {}}


JOBS = "/apis/flotilla.dev/v1alpha1/namespaces/ns/trainingjobs"
SERVINGS = "/apis/flotilla.dev/v1alpha1/namespaces/ns/servingdeployments"


def job(server: FakeApiServer, name: str = "j") -> dict[str, Any]:
    return server.objects[f"{JOBS}/{name}"]


def job_pods(server: FakeApiServer) -> dict[str, str]:
    return {o["metadata"]["name"]: o["spec"].get("nodeName") for p, o in server.objects.items() if "/pods/" in p}


def ack(server: FakeApiServer) -> None:
    """Rank 0 of the running worker set, through flotilla.worker: the checkpoint written, acknowledged."""
    from kubernetes import client as k8s

    from flotilla.worker.client import JobClient, WorkerIdentity

    body = job(server)
    status = body.get("status") or {}
    ident = WorkerIdentity("j", "ns", 0, int(status.get("gpus") or 1), int(status.get("workerGeneration") or 0),
                           body["metadata"]["uid"])
    worker = JobClient(ident, api=k8s.CustomObjectsApi(server.client()), min_interval=0)
    request = worker.pending_checkpoint(force=True)
    if request is not None:
        worker.acknowledge(request, 200)


async def training_flow(trace: Trace) -> dict[str, Any]:
    server = FakeApiServer()
    operator = OperatorHarness(server)
    server.put("/api/v1/nodes/a", node("a", 4))
    await operator.deliver()
    trace.on = True
    server.put(f"{JOBS}/j", trainingjob("j", 2, 4))  # kubectl apply
    await operator.until(lambda: job(server).get("status", {}).get("phase") == "Running" and len(job_pods(server)) == 4)
    changed = copy.deepcopy(job(server))  # kubectl apply of a smaller spec.elasticity.maxGPUs: a rescale
    changed["spec"]["elasticity"]["maxGPUs"] = 2
    changed["metadata"]["generation"] = 2
    server.put(f"{JOBS}/j", changed, "MODIFIED")

    def shrunk() -> bool:
        if (job(server).get("status") or {}).get("phase") == "Resharding":
            ack(server)
        status = job(server).get("status") or {}
        return status.get("gpus") == 2 and len(job_pods(server)) == 2 and status.get("phase") == "Running"

    await operator.until(shrunk, passes=20)
    trace.on = False
    return {"pods": job_pods(server), "reshards": job(server)["status"].get("reshards")}


def controller(server: FakeApiServer, tmp: Path, **kw: Any) -> Any:
    from fastapi.testclient import TestClient

    from flotilla.controller.api import Controller, create_app
    from flotilla.controller.auth import TokenAuthenticator
    from flotilla.controller.db import create_engine, upgrade
    from flotilla.controller.ingest import Ingestor, SampleStoreSink
    from flotilla.controller.kube import KubeActions
    from flotilla.controller.metrics import ControllerMetrics
    from flotilla.controller.store import Store

    engine = create_engine(f"sqlite:///{tmp / 'controller.db'}")
    upgrade(engine)
    store = Store(engine)
    metrics = ControllerMetrics(store)
    actions = KubeActions(server.client())
    (tmp / "tokens").write_text("flow-agent-token-0123456789,ingest,agent-1\n")
    sinks: list[Any] = [SampleStoreSink(store)]
    parts = {"store": store, "metrics": metrics, "actions": actions}
    if kw.get("health"):
        from flotilla.controller.health import HealthResponder

        parts["health"] = HealthResponder(store, actions, metrics)
        sinks.append(parts["health"])
    stats = None
    if kw.get("replan"):
        from flotilla.controller.replan import ServingReplanner

        parts["replanner"] = ServingReplanner(actions, store, metrics)
        stats = parts["replanner"].observe
    ctl = Controller(store=store, actions=actions, auth=TokenAuthenticator(tmp / "tokens"), metrics=metrics,
                     ingestor=Ingestor(sinks, metrics, dead_letters=store), serving_stats=stats)
    parts["http"] = TestClient(create_app(ctl), raise_server_exceptions=True)
    return parts


async def fault_flow(trace: Trace) -> dict[str, Any]:
    from flotilla.controller.mirror import parse_node, parse_training_job

    server = FakeApiServer()
    operator = OperatorHarness(server)
    for name in ("a", "b"):
        server.put(f"/api/v1/nodes/{name}", node(name, 2))
    server.put(f"{JOBS}/j", trainingjob("j", 2, 2))
    await operator.until(lambda: job(server).get("status", {}).get("phase") == "Running" and len(job_pods(server)) == 2)
    on = next(iter((job(server)["status"].get("placement") or [{}])))["node"]
    with tempfile.TemporaryDirectory() as tmp:
        parts = controller(server, Path(tmp), health=True)
        for name in ("a", "b"):  # what the controller's sync mirrors from its watches
            parts["store"].upsert_node(parse_node(server.objects[f"/api/v1/nodes/{name}"]))
        parts["store"].upsert_job(parse_training_job(job(server)))
        trace.on = True
        sample = {"ts": time.time(), "node": on, "metric": "xid", "value": 79, "gpu": 0}
        reply = parts["http"].post("/v1/ingest", json={"node": on, "samples": [sample]},
                                   headers={"Authorization": "Bearer flow-agent-token-0123456789"})
        assert reply.status_code < 300, reply.text
        moved = await operator.until(lambda: set(job_pods(server).values()) == {"b" if on == "a" else "a"}
                                     and job(server)["status"].get("phase") == "Running", passes=20)
        trace.on = False
        taints = server.objects[f"/api/v1/nodes/{on}"]["spec"]["taints"]
    return {"tainted": on, "taints": [t["effect"] for t in taints], "pods": job_pods(server), "passes": moved}


def servingdeployment() -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "vllm", "image": "vllm"}]}}
    return {"apiVersion": "flotilla.dev/v1alpha1", "kind": "ServingDeployment",
            "metadata": {"name": "chat", "namespace": "ns", "uid": "uid-chat", "generation": 1, "annotations": {}},
            "spec": {"slo": {"ttftMs": 400, "tpotMs": 100, "attainment": 0.9},
                     "workload": {"requestsPerSecond": 2, "inputTokens": 512, "outputTokens": 128},
                     "profile": {"name": "opt-13b-a100"}, "maxGPUs": 16, "minGPUs": 0,
                     "prefill": {"template": template}, "decode": {"template": template},
                     "planner": {"mode": "auto", "intervalSeconds": 1}},
            "status": {}}


def replicas(server: FakeApiServer) -> dict[str, int]:
    return {o["metadata"]["name"]: o["spec"]["replicas"] for p, o in server.objects.items() if "/deployments/" in p}


async def serving_flow(trace: Trace) -> dict[str, Any]:
    server = FakeApiServer()
    operator = OperatorHarness(server, pool=True)
    for name in ("a", "b"):
        server.put(f"/api/v1/nodes/{name}", node(name, 8))
    server.put(f"{SERVINGS}/chat", servingdeployment())
    await operator.until(lambda: len(replicas(server)) == 2)
    before = replicas(server)
    with tempfile.TemporaryDirectory() as tmp:
        parts = controller(server, Path(tmp), replan=True)
        from flotilla.controller.mirror import parse_serving_deployment

        parts["store"].upsert_serving(parse_serving_deployment(server.objects[f"{SERVINGS}/chat"]))  # its sync
        trace.on = True
        stats = {"windowSeconds": 30, "requestsPerSecond": 12, "meanPromptTokens": 512, "meanOutputTokens": 128,
                 "ttftP90Ms": 900, "tpotP90Ms": 90, "attainment": 0.6, "requests": 360}
        reply = parts["http"].post("/v1/serving/ns/chat/stats", json=stats,
                                   headers={"Authorization": "Bearer flow-agent-token-0123456789"})
        assert reply.status_code < 300, reply.text
        parts["replanner"].step()  # its loop's next pass
        await operator.until(lambda: replicas(server) != before and sum(replicas(server).values()) > sum(before.values()))
        trace.on = False
    return {"before": before, "after": replicas(server)}


FLOWS = {"training": training_flow, "fault": fault_flow, "serving": serving_flow}


def measure(name: str) -> dict[str, Any]:
    trace = Trace()
    _install(trace)
    try:
        outcome = asyncio.run(FLOWS[name](trace))
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return {**trace.report(), "outcome": outcome}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("flows", nargs="*", default=list(FLOWS))
    parser.add_argument("--json", action="store_true", help="one JSON object, nothing else")
    args = parser.parse_args()
    import logging

    logging.disable(logging.WARNING)
    results = {name: measure(name) for name in args.flows}
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    for name, r in results.items():
        print(f"{name}: {r['count']} files, visited twice: {sorted(r['twice']) or 'none'}   ({r['outcome']})")
        for i, f in enumerate(r["files"], 1):
            print(f"  {i:2d}. {f}" + (f"   <- visits from {r['twice'][f]}" if f in r["twice"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
