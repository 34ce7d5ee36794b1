"""Benchmark: the operator's CPU per watch event, kopf's handler path against its own watches (no API server).

  python bench/watch_events.py [--pods 2000] [--events 5]

Both paths are given the same raw watch lines (a pod as the API server sends it, managed fields and all;
each pod created, then modified `--events` times: bound, Running, a status patch, ...) and end in the
same `View.record`:

* kopf (the baseline, what the operator ran until now): the line parsed, then `process_resource_event`
  with one `@kopf.on.event` handler that records the object, as `handlers.py` had them. kopf's own
  queueing (a task per object, batching) is left out, so its figure is a lower bound.
* ours (`flotilla.operator.watch`): the line parsed, then `View.record` (the watch thread's hand-off to
  the event loop is left out too, and timed on its own: one `call_soon_threadsafe` per event against the
  watches' batched hand-off).

Prints CPU microseconds per event for each, and as its last line one JSON object:
{"events": n, "kopf_us_per_event": a, "ours_us_per_event": b, "ratio": a/b, "handoff_us_per_event": c,
 "batched_handoff_us_per_event": d}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import kopf  # noqa: E402
from kopf._cogs.structs import references  # noqa: E402
from kopf._core.actions import lifecycles  # noqa: E402
from kopf._core.engines import indexing, posting  # noqa: E402
from kopf._core.intents import registries  # noqa: E402
from kopf._core.reactor import inventory, processing  # noqa: E402

from flotilla.operator.view import View  # noqa: E402

PODS = references.Resource("", "v1", "pods", kind="Pod", namespaced=True)


def pod(i: int, version: int, phase: str, node: str | None) -> dict:
    """A worker pod as the API server sends it in a watch event (~4 KB)."""
    name = f"job{i}-abcdef-g0-w0"
    managed = [{"manager": m, "operation": "Update", "apiVersion": "v1", "time": "2026-01-01T00:00:00Z",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {f"f:l{j}": {} for j in range(6)}},
                                                       "f:spec": {"f:containers": {"k:{\"name\":\"w\"}": {
                                                           ".": {}, "f:image": {}, "f:resources": {}}}},
                                                       "f:status": {"f:conditions": {}, "f:phase": {}}}}
               for m in ("flotilla-operator", "kube-scheduler", "kwok")]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "bench", "uid": f"uid-pod-{i}", "resourceVersion": str(version),
                     "creationTimestamp": "2026-01-01T00:00:00Z", "generation": 1,
                     "labels": {"app.kubernetes.io/managed-by": "flotilla", "flotilla.dev/job": f"job{i}",
                                "flotilla.dev/role": "worker", "flotilla.dev/generation": "0",
                                "flotilla.dev/rank": "0", "flotilla.dev/job-uid": f"uid-{i}"},
                     "annotations": {"flotilla.dev/sim-exit-after": "5s"},
                     "ownerReferences": [{"apiVersion": "flotilla.dev/v1alpha1", "kind": "TrainingJob",
                                          "name": f"job{i}", "uid": f"uid-{i}", "controller": True,
                                          "blockOwnerDeletion": True}],
                     "managedFields": managed},
        "spec": {**({"nodeName": node} if node else {}), "nodeSelector": {"kubernetes.io/hostname": "n1"},
                 "restartPolicy": "Never", "schedulerName": "default-scheduler",
                 "containers": [{"name": "w", "image": "registry.example/train:1",
                                 "env": [{"name": f"FLOTILLA_{k}", "value": str(k)} for k in range(12)],
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}}],
                 "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                  "effect": "NoExecute", "tolerationSeconds": 300}]},
        "status": {"phase": phase, "qosClass": "BestEffort",
                   "conditions": [{"type": t, "status": "True", "lastTransitionTime": "2026-01-01T00:00:01Z"}
                                  for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]},
    }


def lines(pods: int, events: int) -> list[bytes]:
    out, version = [], 100
    steps = [("ADDED", "Pending", None), ("MODIFIED", "Pending", "n1")] + [("MODIFIED", "Running", "n1")] * events
    for kind, phase, node in steps[:events + 1]:
        for i in range(pods):
            version += 1
            out.append(json.dumps({"type": kind, "object": pod(i, version, phase, node)}).encode())
    return out


async def through_kopf(raw: list[bytes]) -> tuple[float, View]:
    view = View()
    registry = registries.OperatorRegistry()

    @kopf.on.event("", "v1", "pods", registry=registry)
    async def on_pod(event: dict, **_: object) -> None:
        view.record("pods", event)

    settings, memories, indexers = kopf.OperatorSettings(), inventory.ResourceMemories(), indexing.OperatorIndexers()
    settings.posting.enabled = False
    queue: asyncio.Queue = asyncio.Queue()
    started = time.process_time()
    for line in raw:
        await processing.process_resource_event(
            lifecycle=lifecycles.all_at_once, indexers=indexers, registry=registry, settings=settings,
            memories=memories, memobase=kopf.Memo(), resource=PODS, raw_event=json.loads(line),
            event_queue=queue, no_throttling=True)
    return time.process_time() - started, view


def through_ours(raw: list[bytes]) -> tuple[float, View]:
    view = View()
    started = time.process_time()
    for line in raw:
        view.record("pods", json.loads(line))
    return time.process_time() - started, view


def handoff(count: int, batched: bool) -> float:
    """CPU seconds (the whole process: both threads) to hand `count` events from a watch thread to the event
    loop: one `call_soon_threadsafe` each (the watches until issue 20's second round), or the watches'
    batched hand-off (`Informer._on_loop`). The loop only counts them."""
    from flotilla.operator.watch import Informer

    async def scenario() -> float:
        loop, got, done = asyncio.get_running_loop(), [0], asyncio.Event()

        def take(_: object) -> None:
            got[0] += 1
            if got[0] == count:
                done.set()

        informer = Informer(View(), "pods", None, lambda **_: None, loop, 1.0)
        deliver = (lambda e: informer._on_loop(take, e)) if batched else (lambda e: loop.call_soon_threadsafe(take, e))
        started = time.process_time()
        sender = threading.Thread(target=lambda: [deliver(i) for i in range(count)])
        sender.start()
        await done.wait()
        sender.join()
        return time.process_time() - started

    return asyncio.run(scenario())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--events", type=int, default=5, help="modifications per pod after its creation")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    posting.event_queue_var.set(asyncio.Queue())
    raw = lines(args.pods, args.events)
    kopf_s, ours_s = [], []
    for _ in range(args.repeats):
        k, kview = asyncio.run(through_kopf(raw))
        o, oview = through_ours(raw)
        assert kview.pods == oview.pods and len(oview.pods) == args.pods, "the two paths disagree on the view"
        kopf_s.append(k)
        ours_s.append(o)
    kopf_us, ours_us = min(kopf_s) / len(raw) * 1e6, min(ours_s) / len(raw) * 1e6
    each_us = min(handoff(len(raw), False) for _ in range(args.repeats)) / len(raw) * 1e6
    batched_us = min(handoff(len(raw), True) for _ in range(args.repeats)) / len(raw) * 1e6
    print(f"{len(raw)} pod events ({args.pods} pods, {args.events + 1} events each), best of {args.repeats}: "
          f"kopf {kopf_us:.0f} us/event, ours {ours_us:.0f} us/event (x{kopf_us / ours_us:.1f}); hand-off from "
          f"the watch thread to the loop: {each_us:.1f} us/event one by one, {batched_us:.1f} batched")
    print(json.dumps({"events": len(raw), "kopf_us_per_event": round(kopf_us, 1),
                      "ours_us_per_event": round(ours_us, 1), "ratio": round(kopf_us / ours_us, 2),
                      "handoff_us_per_event": round(each_us, 1), "batched_handoff_us_per_event": round(batched_us, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
