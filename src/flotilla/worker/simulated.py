"""Simulated training workers for clusters whose GPU nodes are KWOK fakes.

No process runs inside a KWOK pod, so this plays rank 0 of every running
TrainingJob from outside, through the same `JobClient` a real worker uses: it
advances steps at the rate the job's scaling curve gives for its GPUs (times
`speed`), reports progress and periodic checkpoints, acknowledges checkpoint
requests at the current step and then waits for the new worker set, and when
the job's steps are done makes its pods exit 0 (KWOK's flotilla-pod-exit stage).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from flotilla import GROUP, VERSION
from flotilla.allocation import ScalingCurve
from flotilla.reshard.view import worker_set_of
from flotilla.resources import names
from flotilla.worker.client import JobClient, WorkerIdentity

log = logging.getLogger(__name__)


@dataclass
class _Run:
    generation: int
    steps: float
    last: float
    paused_for: int = 0  # checkpoint generation acknowledged; no progress until the new worker set runs
    finished: bool = False


class SimulatedWorkers:
    def __init__(self, api_client: Any, speed: float = 1.0, namespace: str | None = None):
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.speed = speed
        self.namespace = namespace
        self.runs: dict[str, _Run] = {}
        self.clients: dict[str, JobClient] = {}

    def _jobs(self) -> list[dict]:
        listed: Any = (self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, "trainingjobs")
                       if self.namespace else self.custom.list_cluster_custom_object(GROUP, VERSION, "trainingjobs"))
        return list(listed["items"])

    def _pods(self) -> dict[tuple[str, int], list[Any]]:
        """(job UID, generation) -> the worker pods that job controls (an orphan is nobody's)."""
        selector = f"{names.LABEL_ROLE}={names.ROLE_WORKER}"
        pods = (self.core.list_namespaced_pod(self.namespace, label_selector=selector) if self.namespace
                else self.core.list_pod_for_all_namespaces(label_selector=selector)).items
        out: dict[tuple[str, int], list[Any]] = {}
        for p in pods:
            meta = p.metadata
            if meta is None:  # the API server always sends it; the client's model says it may not
                continue
            owner = next((r for r in meta.owner_references or [] if r.controller), None)
            if owner is None:
                continue
            labels = meta.labels or {}
            out.setdefault((owner.uid, int(labels.get(names.LABEL_GENERATION, -1))), []).append(p)
        return out

    def step(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        pods = self._pods()
        seen = set()
        for job in self._jobs():
            meta, spec, status = job["metadata"], job["spec"], job.get("status") or {}
            key = meta["uid"]  # a new job of an old name starts from nothing
            # Admitted too: the operator records Running a while after the pods run (or with their first report).
            if status.get("phase") not in ("Admitted", "Running", "Resharding") or not status.get("placement"):
                continue
            seen.add(key)
            generation = worker_set_of(status)
            mine = pods.get((meta["uid"], generation), [])
            running = bool(mine) and len(mine) == int(status.get("workers", 0)) and all(
                p.status.phase == "Running" for p in mine)
            run = self.runs.get(key)
            if run is None or run.generation != generation:
                start = int((status.get("progress") or {}).get("steps", 0))
                run = self.runs[key] = _Run(generation, float(start), now)
            client = self._client(meta, generation, int(status.get("workers", 1)))
            if run.finished or not running:
                run.last = now
                continue
            if not run.paused_for:
                curve = ScalingCurve.of([(p["gpus"], p["stepsPerSecond"]) for p in spec["throughput"]])
                rate = curve.rate(int(status.get("gpus", 0))) * self.speed
                run.steps = min(float(spec["totalSteps"]), run.steps + rate * (now - run.last))
                interval = int((spec.get("checkpoint") or {}).get("intervalSteps", 0))
                ckpt = int(run.steps) // interval * interval if interval else None
                client.report_progress(int(run.steps), rate, ckpt, force=True)
            run.last = now
            request = client.pending_checkpoint(force=True)
            if request and request.generation > run.paused_for:
                client.acknowledge(request, int(run.steps))
                run.paused_for = request.generation
                log.info("%s/%s: checkpoint generation %d written at step %d", meta["namespace"], meta["name"],
                         request.generation, int(run.steps))
            if run.steps >= spec["totalSteps"] and not run.paused_for:
                self._finish(mine)
                run.finished = True
                log.info("%s/%s: all %d steps done; workers exit", meta["namespace"], meta["name"], spec["totalSteps"])
        for key in set(self.runs) - seen:
            del self.runs[key]
            self.clients.pop(key, None)

    def _client(self, meta: dict, generation: int, world: int) -> JobClient:
        key = meta["uid"]
        c = self.clients.get(key)
        if c is None or c.identity.generation != generation:
            c = self.clients[key] = JobClient(WorkerIdentity(meta["name"], meta["namespace"], 0, world, generation,
                                                             meta["uid"]), api=self.custom)
        return c

    def _finish(self, pods: list[Any]) -> None:
        for p in pods:
            self.core.patch_namespaced_pod(p.metadata.name, p.metadata.namespace, {"metadata": {"annotations": {
                "flotilla.dev/sim-exit-code": "0", "flotilla.dev/sim-exit-after": "0s"}}})

    def run_forever(self, interval: float = 1.0) -> None:
        while True:
            started = time.monotonic()
            try:
                self.step()
            except Exception:
                log.exception("simulated workers: pass failed")
            time.sleep(max(0.0, interval - (time.monotonic() - started)))
