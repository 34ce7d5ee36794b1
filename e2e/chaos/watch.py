"""A background sampler that measures the harm a fault did, from what the API server shows.

    with HarmSampler(namespace) as harm:      # polls every 0.5 s in a thread
        ... inject the fault, wait for the job ...
    harm.fill(outcome)                         # duplicate_pods, gpus_promised_twice,
                                               # steps_lost_past_checkpoint, jobs_lost (+ details)

What it counts (each the worst seen over the case, summed over jobs or nodes):

* duplicate_pods: per job, worker pods alive beyond its worker set: two live pods for one
  (generation, rank), or Running pods of two generations at once (a pod being deleted is not
  counted there: it is on its way out, and it still counts as holding its GPUs, below).
* gpus_promised_twice: per node, GPUs held by the non-finished pods bound to it (terminating ones
  included), or promised in `status.placement` by the unfinished TrainingJobs of the whole cluster,
  beyond the node's allocatable GPUs.
* steps_lost_past_checkpoint: per job, how far `status.progress.steps` went below the highest
  checkpoint step it had recorded (`status.checkpoint.step`) or rank 0 had acknowledged (the
  checkpoint-ack annotation, counted once the job switched to the worker set it was taken for).
* jobs_lost (at `fill`): the namespace's jobs that were ever Failed, that vanished without the case
  deleting them (`forget(uid)`), that did not end Succeeded, or that ended Succeeded short of totalSteps
  (marked done without running). A case that does not wait for its jobs to finish passes
  `finished=False` (then only Failed, vanished, and short successes count).

Also recorded, for the cases to judge (in the details, counted nowhere): `ghost_placements`, jobs
whose `status.placement` named a node that did not exist at the time.

Pods are matched to jobs by their controlling ownerReference's uid, TrainingJobs told apart by uid,
so a new job that reuses an old one's name is a job of its own. A poll that fails (the API server
down: the fault under test) is skipped and counted in `failed_polls`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from flotilla import GROUP, VERSION
from flotilla.resources import names

log = logging.getLogger(__name__)
FINISHED_POD = ("Succeeded", "Failed")
FINAL_JOB = ("Succeeded", "Failed", "Rejected")


def api_client() -> Any:
    from kubernetes import config

    return config.new_client_from_config(config_file=os.environ.get("KUBECONFIG"))


def owner_uid(obj: dict[str, Any]) -> str | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return ref.get("uid")
    return None


def pod_gpus(pod: dict[str, Any]) -> int:
    return sum(int(str(((c.get("resources") or {}).get("limits") or {}).get(names.GPU_RESOURCE, 0)))
               for c in pod["spec"].get("containers") or [])


def node_gpus(node: dict[str, Any]) -> int:
    return int(str(((node.get("status") or {}).get("allocatable") or {}).get(names.GPU_RESOURCE, 0)))


@dataclass
class JobRecord:
    """One TrainingJob (one uid) as the sampler saw it."""

    name: str
    uid: str
    last: dict[str, Any] = field(default_factory=dict)
    gone: bool = False
    ever_failed: bool = False
    checkpoint: int = 0        # highest checkpoint step recorded or acknowledged
    steps_lost: int = 0        # worst regression of status.progress.steps below `checkpoint`
    duplicates: int = 0        # worst excess of worker pods
    duplicate_seen: str = ""   # what the worst excess was, for the details
    checkpoint_seen: str = ""  # the object when `checkpoint` was reached, and when `steps_lost` was
    steps_lost_seen: str = ""

    def status(self) -> dict[str, Any]:
        return self.last.get("status") or {}


class HarmSampler:
    """Polls one namespace's TrainingJobs and pods, and the cluster's nodes and GPU pods, in a thread."""

    def __init__(self, namespace: str, interval: float = 0.5, api: Any = None):
        from kubernetes import client

        self.namespace, self.interval = namespace, interval
        api = api or api_client()
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.jobs: dict[str, JobRecord] = {}
        self.node_excess: dict[str, int] = {}   # node -> worst GPUs promised beyond allocatable
        self.node_excess_seen: dict[str, str] = {}
        self.ghost_placements: dict[str, set[str]] = {}  # node that did not exist -> jobs placed on it
        self.forgotten: set[str] = set()        # uids of jobs the case deleted on purpose
        self.samples = self.failed_polls = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"harm-{namespace}", daemon=True)

    # --- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> "HarmSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(timeout=10)

    def forget(self, uid: str) -> None:
        """The case deletes this job (by uid) on purpose: its disappearance is no loss."""
        with self._lock:
            self.forgotten.add(uid)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sample()
            except Exception as e:  # the API server down is the fault under test: skip this poll
                self.failed_polls += 1
                log.debug("harm sampler: poll failed: %s", e)
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    # --- one poll --------------------------------------------------------------------------------
    def sample(self) -> None:
        timeout = (2, 4)
        jobs = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, "trainingjobs",
                                                         _request_timeout=timeout)["items"]
        all_jobs = self.custom.list_cluster_custom_object(GROUP, VERSION, "trainingjobs",
                                                          _request_timeout=timeout)["items"]
        pods = self.core.api_client.sanitize_for_serialization(
            self.core.list_pod_for_all_namespaces(_request_timeout=timeout))["items"]
        nodes = self.core.api_client.sanitize_for_serialization(self.core.list_node(_request_timeout=timeout))["items"]
        with self._lock:
            self._observe(jobs, all_jobs, pods, nodes)
            self.samples += 1

    def _observe(self, jobs: list[dict], all_jobs: list[dict], pods: list[dict], nodes: list[dict]) -> None:
        seen = set()
        for job in jobs:
            meta = job["metadata"]
            rec = self.jobs.setdefault(meta["uid"], JobRecord(meta["name"], meta["uid"]))
            rec.last, rec.gone = job, False
            seen.add(meta["uid"])
            status = job.get("status") or {}
            rec.ever_failed |= status.get("phase") == "Failed"
            acked = _ack_step(job)
            recorded = int((status.get("checkpoint") or {}).get("step") or 0)
            if max(recorded, acked) > rec.checkpoint:
                rec.checkpoint, rec.checkpoint_seen = max(recorded, acked), _brief(job)
            steps = (status.get("progress") or {}).get("steps")
            if steps is not None and rec.checkpoint - int(steps) > rec.steps_lost:
                rec.steps_lost, rec.steps_lost_seen = rec.checkpoint - int(steps), _brief(job)
        for uid, rec in self.jobs.items():
            if uid not in seen:
                rec.gone = True

        workers: dict[str, list[dict]] = {}
        for p in pods:
            if p["metadata"]["namespace"] == self.namespace and (uid := owner_uid(p)) in self.jobs:
                workers.setdefault(uid, []).append(p)
        for uid, ps in workers.items():
            excess, what = duplicate_workers(ps)
            rec = self.jobs[uid]
            if excess > rec.duplicates:
                rec.duplicates, rec.duplicate_seen = excess, what

        for node, held in placements_on_missing_nodes(all_jobs, nodes).items():
            self.ghost_placements.setdefault(node, set()).update(held)
        for node, excess, what in gpus_beyond_allocatable(all_jobs, pods, nodes):
            if excess > self.node_excess.get(node, 0):
                self.node_excess[node], self.node_excess_seen[node] = excess, what

    # --- the figures -----------------------------------------------------------------------------
    def lost_jobs(self, finished: bool = True) -> list[str]:
        out = []
        with self._lock:
            for rec in self.jobs.values():
                st = rec.status()
                total = int((rec.last.get("spec") or {}).get("totalSteps", 0))
                steps = int((st.get("progress") or {}).get("steps", 0))
                if rec.ever_failed:
                    out.append(f"{rec.name} ({rec.uid[:8]}) Failed: {st.get('message')}")
                elif rec.gone and rec.uid not in self.forgotten:
                    out.append(f"{rec.name} ({rec.uid[:8]}) vanished")
                elif rec.gone:
                    continue
                elif st.get("phase") == "Succeeded" and steps < total:
                    out.append(f"{rec.name} ({rec.uid[:8]}) Succeeded at step {steps} of {total}: "
                               f"{st.get('message')}")
                elif finished and st.get("phase") != "Succeeded":
                    out.append(f"{rec.name} ({rec.uid[:8]}) not finished: {st.get('phase')} at step {steps} "
                               f"of {total}: {st.get('message')}")
        return out

    def fill(self, outcome: Any, finished: bool = True) -> Any:
        """Add this sampler's counts and findings to a chaos Outcome (counts add up across samplers)."""
        self.stop()
        try:
            self.sample()  # the end state, not the last poll before it
        except Exception as e:
            log.warning("harm sampler: the final poll failed: %s", e)
        lost = self.lost_jobs(finished)
        notes = [f"job lost: {x}" for x in lost]
        with self._lock:
            for rec in self.jobs.values():
                if rec.duplicates:
                    notes.append(f"{rec.name}: {rec.duplicates} duplicate worker pods ({rec.duplicate_seen})")
                if rec.steps_lost:
                    notes.append(f"{rec.name}: progress went {rec.steps_lost} steps below checkpoint step "
                                 f"{rec.checkpoint} (checkpoint seen at {rec.checkpoint_seen}; "
                                 f"progress below it at {rec.steps_lost_seen})")
            for node, held in sorted(self.ghost_placements.items()):
                notes.append(f"placed on {node}, which did not exist: {sorted(held)}")
            for node, excess in sorted(self.node_excess.items()):
                notes.append(f"{node}: {excess} GPUs promised twice ({self.node_excess_seen[node]})")
            outcome.jobs_lost += len(lost)
            outcome.duplicate_pods += sum(r.duplicates for r in self.jobs.values())
            outcome.steps_lost_past_checkpoint += sum(r.steps_lost for r in self.jobs.values())
            outcome.gpus_promised_twice += sum(self.node_excess.values())
        notes.append(f"sampler: {self.samples} polls, {self.failed_polls} failed")
        outcome.details = "; ".join(filter(None, [outcome.details, *notes]))
        return outcome


def _brief(job: dict[str, Any]) -> str:
    status = job.get("status") or {}
    return (f"rv {job['metadata'].get('resourceVersion')} {status.get('phase')} reshards {status.get('reshards', 0)} "
            f"progress {status.get('progress')} checkpoint {status.get('checkpoint', {}).get('step')} "
            f"ack {_ack_step(job)}")


def _ack_step(job: dict[str, Any]) -> int:
    """The step of rank 0's acknowledged checkpoint, once the job has switched to the worker set it was
    taken for (before that, status.progress lagging behind the acknowledgement is no loss)."""
    from flotilla.reshard import encoding as checkpoint

    from flotilla.reshard.view import worker_set_of

    ack = checkpoint.parse_ack(job["metadata"].get("annotations"))
    switched = ack and worker_set_of(job.get("status") or {}) >= int(ack["generation"])
    return int(ack["step"]) if switched else 0


def duplicate_workers(pods: list[dict[str, Any]]) -> tuple[int, str]:
    """One job's worker pods -> (pods beyond its worker set, what they were)."""
    live = [p for p in pods if (p.get("status") or {}).get("phase") not in FINISHED_POD]
    by_slot: dict[tuple[str, str], list[str]] = {}
    for p in live:
        labels = p["metadata"].get("labels") or {}
        slot = (labels.get(names.LABEL_GENERATION, "?"), labels.get(names.LABEL_RANK, "?"))
        by_slot.setdefault(slot, []).append(p["metadata"]["name"])
    same_slot = sum(len(v) - 1 for v in by_slot.values())
    running: dict[int, list[str]] = {}
    for p in live:
        if (p.get("status") or {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp"):
            generation = int((p["metadata"].get("labels") or {}).get(names.LABEL_GENERATION, -1))
            running.setdefault(generation, []).append(p["metadata"]["name"])
    older = [n for g in sorted(running)[:-1] for n in running[g]]
    what = []
    if same_slot:
        what.append(f"same generation and rank: {[v for v in by_slot.values() if len(v) > 1]}")
    if older:
        what.append(f"Running beside generation {max(running)}: {older}")
    return same_slot + len(older), "; ".join(what)


def placements_on_missing_nodes(jobs: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> dict[str, set[str]]:
    """node -> unfinished jobs whose status.placement names it, for nodes that do not exist."""
    exist = {n["metadata"]["name"] for n in nodes}
    out: dict[str, set[str]] = {}
    for j in jobs:
        if (j.get("status") or {}).get("phase") in FINAL_JOB:
            continue
        for entry in (j.get("status") or {}).get("placement") or []:
            if entry["node"] not in exist:
                out.setdefault(entry["node"], set()).add(f"{j['metadata']['namespace']}/{j['metadata']['name']}")
    return out


def gpus_beyond_allocatable(jobs: list[dict[str, Any]], pods: list[dict[str, Any]],
                            nodes: list[dict[str, Any]]) -> list[tuple[str, int, str]]:
    """(node, GPUs beyond allocatable, by whom) for nodes where bound pods or job placements exceed it."""
    allocatable = {n["metadata"]["name"]: node_gpus(n) for n in nodes}
    bound: dict[str, int] = {}
    placed: dict[str, dict[str, int]] = {}
    for p in pods:
        node = p["spec"].get("nodeName")
        if node and (p.get("status") or {}).get("phase") not in FINISHED_POD:
            bound[node] = bound.get(node, 0) + pod_gpus(p)
    for j in jobs:
        status = j.get("status") or {}
        if status.get("phase") in FINAL_JOB:
            continue
        key = f"{j['metadata']['namespace']}/{j['metadata']['name']}"
        for entry in status.get("placement") or []:
            placed.setdefault(entry["node"], {})[key] = int(entry.get("gpus") or 0)
    out = []
    for node in sorted((set(bound) | set(placed)) & set(allocatable)):  # a missing node: see placements_on
        have = allocatable[node]
        promised = sum(placed.get(node, {}).values())
        excess = max(bound.get(node, 0) - have, promised - have, 0)
        if excess:
            out.append((node, excess, f"allocatable {have}, bound pods {bound.get(node, 0)}, placements "
                                      f"{placed.get(node, {})}"))
    return out
