"""TrainingJobs: from watched objects to a snapshot, and from a decision to actions. Pure.

Restart safety: the placement a job runs on is recorded in `status.placement`
before its pods are created, and pod names are derived from it
(`<job>-<h>-g<generation>-w<rank>`, h: a short hash of the job's UID). A restarted
operator reads the placement back, creates only the pods that are missing (a create
that finds the job's own pod is a no-op) and never a second set.

Ownership: a job's pods are those whose controlling ownerReference carries its UID
(`pods.worker_job_uid`). A new job that takes a deleted job's name starts from
nothing: the old one's pods (orphaned, or still terminating) have other names and
another owner; they are never its progress, success or failure, and their GPUs are
held, not the allocator's to give, until they are gone.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import replace
from typing import Any, Callable, Iterable, Mapping

from flotilla import API_VERSION
from flotilla.allocation import ClusterSnapshot, JobDecision, JobState, NodeState, ScalingCurve, Verdict, throughput
from flotilla.operator.actions import (
    Action,
    ApplyObject,
    CreatePod,
    DeletePod,
    PatchAnnotations,
    PatchStatus,
    PostEvent,
    involved,
)
from flotilla.operator.pods import holds_gpus, pod_gpus, worker_job_uid
from flotilla.operator.timeutil import rfc3339, to_unix
from flotilla.resources import checkpoint, names, parse, phases, training_job
from flotilla.resources import node as k8s_node


Body = Mapping[str, Any]
PLURAL = "trainingjobs"
UNHEALTHY_TOLERATION_SECONDS = 600
# Status is for people and costs the API server a write each time: what changes often is written only when
# it is worth one. Rank 0's progress: at a new checkpoint, else at most once a minute (planning reads the
# annotation). A job's first moments: a job placed within QUIET_SECONDS of its creation is written once,
# admitted and placed, without a Pending before; workers that started less than QUIET_SECONDS ago are
# recorded Running with the next write or once that time has passed (a job that ends first goes from
# Admitted to Succeeded in one write, its startedAt taken from its pods).
PROGRESS_EVERY_SECONDS = 60.0
QUIET_SECONDS = 10.0
ACK_TIMEOUT_SECONDS = 120.0  # rank 0's time to acknowledge a checkpoint request before the workers are replaced


def key_of(body: Body) -> str:
    return f"{body['metadata']['namespace']}/{body['metadata']['name']}"


def placement_of(body: Body) -> dict[str, int]:
    """status.placement: node -> GPUs, nodes given none left out."""
    return {node: gpus for node, gpus in parse.keyed_gpus(body.get("status") or {}, "placement", "node").items()
            if gpus}


def placement_reader(state_of: Callable[[Body], JobState] | None) -> Callable[[Body], Mapping[str, int]]:
    """`placement_of`, or the placement a cache of `job_state` already holds (`state_of`)."""
    return placement_of if state_of is None else (lambda body: state_of(body).placement)


def progress_of(body: Body) -> dict[str, Any] | None:
    """Rank 0's latest report (annotation) from the current worker set, else what status holds."""
    status = body.get("status") or {}
    p = checkpoint.parse_progress(body["metadata"].get("annotations"))
    if p and int(p.get("generation", 0)) >= int(status.get("reshards", 0)):
        out = {"steps": int(p["steps"]), "stepsPerSecond": float(p.get("stepsPerSecond", 0.0)),
               "updatedAt": p.get("time") or rfc3339(0)}
        if p.get("checkpointStep") is not None:
            out["checkpointStep"] = int(p["checkpointStep"])
        if isinstance(p.get("restoreSeconds"), (int, float)) and p["restoreSeconds"] >= 0:
            out["restoreSeconds"] = round(float(p["restoreSeconds"]), 2)
        return out
    return status.get("progress")


_VERDICT_OF_PHASE = {
    phases.ADMITTED: Verdict.ADMITTED, phases.RUNNING: Verdict.ADMITTED, phases.RESHARDING: Verdict.ADMITTED,
    phases.REJECTED: Verdict.REJECTED,
}


def job_state(body: Body) -> JobState:
    job = training_job.parse(body)
    if job.created is None or job.deadline is None:
        raise ValueError(f"TrainingJob {job.key} has no metadata.creationTimestamp or no deadline")
    progress = progress_of(body) or {}
    verdict = _VERDICT_OF_PHASE.get(job.phase or "")
    if verdict is None and job.guaranteed_share:
        verdict = Verdict.ADMITTED  # admitted, waiting for its GPUs (phase Pending): admission is decided once
    if verdict is Verdict.ADMITTED and job.best_effort and job.condition(names.COND_ADMITTED,
                                                                          "reason") == "BestEffort":
        verdict = Verdict.BEST_EFFORT
    curve = ScalingCurve.of(list(job.throughput))
    placement = {node: gpus for node, gpus in job.placement.items() if gpus}
    measured, gpus = float(progress.get("stepsPerSecond") or 0.0), sum(placement.values())
    if measured > 0 and gpus and throughput.departs(curve, gpus, measured):
        # The job runs off its declared curve: plan with the curve that matches what it does.
        curve = throughput.calibrated(curve, gpus, measured)
    return JobState(
        key=job.key,
        submit_time=job.created,
        deadline=job.deadline,
        total_steps=job.total_steps,
        done_steps=int(progress.get("steps", 0)),
        min_gpus=job.min_gpus,
        max_gpus=job.max_gpus,
        gpus_per_worker=job.gpus_per_worker,
        curve=curve,
        restore_seconds=job.restore_seconds,
        best_effort=job.best_effort,
        placement=placement,
        verdict=verdict,
        checkpoint_interval_steps=job.checkpoint_interval_steps,
        last_checkpoint_step=job.checkpoint_step,
        resumes_at=_resumes_at(job.reshards, progress, placement, job.restore_seconds),
        share=job.guaranteed_share,
    )


def _resumes_at(reshards: int, progress: Mapping[str, Any], placement: Mapping[str, int], restore: float) -> float:
    """When a resized job trains again: its restore runs from the switch (`_switch` resets the progress to
    0 steps/s then) until rank 0 of the new worker set reports a rate; 0 when it trains now."""
    if placement and reshards and not progress.get("stepsPerSecond") and progress.get("updatedAt"):
        return to_unix(progress["updatedAt"]) + restore
    return 0.0


def node_state(body: Body) -> NodeState:
    node = k8s_node.parse(body)
    return NodeState(name=node.name, total_gpus=node.allocatable_gpus or 0, schedulable=node.schedulable,
                     labels=dict(node.labels))


def is_final(body: Body) -> bool:
    return (body.get("status") or {}).get("phase") in phases.TRAINING_FINAL


def live_by_uid(jobs: Iterable[Body]) -> dict[str, str]:
    """UID -> key of the jobs that are not finished: the owners whose pods are theirs to plan."""
    return {body["metadata"]["uid"]: key_of(body) for body in jobs
            if body["metadata"].get("uid") and not is_final(body)}


def snapshot(now: float, jobs: Iterable[Body], nodes: Iterable[Body], pods: Iterable[Body] = (),
             state_of: Callable[[Body], JobState] | None = None,
             node_of: Callable[[Body], NodeState] | None = None) -> ClusterSnapshot:
    """The allocator's view. A job in `displaced(...)` is shown holding nothing, so that it is placed afresh.
    `state_of`: `job_state`, or a cache of it; `node_of`: `node_state`, or a cache of it."""
    gpu_nodes = tuple((node_of or node_state)(n) for n in nodes
                      if "kwok.x-k8s.io/node" in (n["metadata"].get("annotations") or {})
                      or names.GPU_RESOURCE in ((n.get("status") or {}).get("allocatable") or {}))
    live = [j for j in jobs if not is_final(j)]
    moved = displaced(live, {n.name: n.total_gpus for n in gpu_nodes}, pods)
    states = ((state_of or job_state)(j) for j in live)
    return ClusterSnapshot(now=now, nodes=gpu_nodes,
                           jobs=tuple(replace(s, placement={}) if s.key in moved else s for s in states))


def held_beyond_placement(jobs: Iterable[Body], pods: Iterable[Body],
                          placement: Callable[[Body], Mapping[str, int]] = placement_of) -> dict[str, int]:
    """node -> GPUs that live jobs' pods hold there beyond what their recorded placement reserves: an old
    worker set still terminating on a node the job has left. Nobody may be given those GPUs until it is gone.
    `placement`: `placement_of`, or what a cache of `job_state` says it is."""
    jobs = list(jobs)
    live = live_by_uid(jobs)
    reserved = {(uid, node): gpus for body in jobs if (uid := body["metadata"].get("uid")) in live
                for node, gpus in placement(body).items()}
    held: dict[tuple[str, str], int] = {}
    for pod in pods:
        if (uid := worker_job_uid(pod)) in live and holds_gpus(pod):
            key = (uid, pod["spec"]["nodeName"])
            held[key] = held.get(key, 0) + pod_gpus(pod)
    out: dict[str, int] = {}
    for (uid, node), gpus in held.items():
        if gpus > reserved.get((uid, node), 0):
            out[node] = out.get(node, 0) + gpus - reserved.get((uid, node), 0)
    return out


def displaced(jobs: Iterable[Body], allocatable: Mapping[str, int], pods: Iterable[Body]) -> set[str]:
    """Jobs whose worker set has not run yet and cannot all start where it was placed: on one of its
    nodes (`allocatable`: node -> GPUs) its workers are not all bound, and pods bound since (a serving
    pod the scheduler put there, another job's) took the GPUs. Nothing ran (workers need every rank),
    so it may move at once."""
    bound: dict[str, int] = {}
    own: dict[tuple[str, str], int] = {}  # (job UID, node) -> GPUs of its pods of any generation
    own_now: dict[tuple[str, int, str], int] = {}  # (job UID, generation, node) -> GPUs
    for pod in pods:
        spec, meta = pod.get("spec") or {}, pod["metadata"]
        node = spec.get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        gpus = pod_gpus(pod)
        bound[node] = bound.get(node, 0) + gpus
        if (job := worker_job_uid(pod)) is not None:
            own[(job, node)] = own.get((job, node), 0) + gpus
            generation = int(meta["labels"].get(names.LABEL_GENERATION, -1))
            own_now[(job, generation, node)] = own_now.get((job, generation, node), 0) + gpus
    out = set()
    for body in jobs:
        if not _not_run_yet(body):
            continue
        uid, generation = body["metadata"].get("uid"), int((body.get("status") or {}).get("reshards", 0))
        if any(own_now.get((uid, generation, node), 0) < gpus
               and allocatable.get(node, 0) - (bound.get(node, 0) - own.get((uid, node), 0)) < gpus
               for node, gpus in placement_of(body).items()):
            out.add(key_of(body))
    return out


def _not_run_yet(body: Body) -> bool:
    """The current worker set has not had all its workers running: admitted and not yet Running, or
    switched to a new generation (not waiting for rank 0's checkpoint on the old one)."""
    status = body.get("status") or {}
    ckpt = status.get("checkpoint") or {}
    waiting = int(ckpt.get("requestedGeneration", 0)) > int(ckpt.get("generation", 0))
    return status.get("phase") == phases.ADMITTED or (status.get("phase") == phases.RESHARDING and not waiting)


POD_NAME_MAX = 63  # a DNS-1123 label: the pod's hostname is its name


def uid_hash(uid: str) -> str:
    """Five hex digits of sha256(uid): what tells apart the pods of two jobs of the same name."""
    return hashlib.sha256(uid.encode()).hexdigest()[:5]


def pod_name(job: str, uid: str, generation: int, rank: int) -> str:
    """`<job>-<h>-g<generation>-w<rank>`, the job's name cut short to keep it a DNS-1123 label."""
    suffix = f"-{uid_hash(uid)}-g{generation}-w{rank}"
    return job[:POD_NAME_MAX - len(suffix)].rstrip("-.") + suffix


RENDEZVOUS_PORT = 29500  # rank 0's TCP store / torchrun's --master-port, as PyTorch's default
CHECKPOINT_MOUNT = "/flotilla/checkpoint"  # where a pvc:// checkpoint claim is mounted in every worker


def rendezvous_service_name(job: str, uid: str) -> str:
    """`<job>-<h>-rdzv` (a DNS-1035 label: it starts with a letter, at most 63 characters)."""
    suffix = f"-{uid_hash(uid)}-rdzv"
    return ("w" + job if not job[:1].isalpha() else job)[:POD_NAME_MAX - len(suffix)].rstrip("-.") + suffix


LOCAL_RENDEZVOUS = "127.0.0.1"


def needs_rendezvous_service(world: int) -> bool:
    """A worker set of one has its process group inside its pod (rank 0 serves and joins it on the loopback):
    no headless Service, and none of the Endpoints and EndpointSlice writes the cluster makes for one."""
    return world > 1


def rendezvous_address(meta: Mapping[str, Any], generation: int, world: int) -> str:
    """Rank 0's DNS name for a worker set: its hostname (the pod name) under the job's headless Service;
    the loopback for a set of one worker."""
    if not needs_rendezvous_service(world):
        return LOCAL_RENDEZVOUS
    service = rendezvous_service_name(meta["name"], meta["uid"])
    return f"{pod_name(meta['name'], meta['uid'], generation, 0)}.{service}.{meta['namespace']}.svc"


def rendezvous_service(body: Body) -> dict[str, Any]:
    """The job's headless Service: it gives each worker pod a DNS name (`<pod>.<service>.<ns>.svc`), ready or
    not (rank 0 must be reachable before any readiness probe passes). Owned by the job: deleted with it."""
    meta = body["metadata"]
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {
            "name": rendezvous_service_name(meta["name"], meta["uid"]), "namespace": meta["namespace"],
            "labels": {names.LABEL_JOB: meta["name"], names.LABEL_JOB_UID: meta["uid"],
                       names.LABEL_MANAGED_BY: names.MANAGED_BY},
            "ownerReferences": [{"apiVersion": API_VERSION, "kind": "TrainingJob", "name": meta["name"],
                                 "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": {names.LABEL_JOB_UID: meta["uid"], names.LABEL_ROLE: names.ROLE_WORKER},
                 "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT, "targetPort": RENDEZVOUS_PORT}]},
    }


def checkpoint_storage(spec: Mapping[str, Any]) -> tuple[str | None, dict[str, Any] | None, dict[str, Any] | None]:
    """`spec.checkpoint.uri` -> (the directory workers see, the pod volume, its mount).

    * `file:///abs/dir`: a host directory (the local control plane, a single node, a node-mounted share),
      mounted at the same path;
    * `pvc://CLAIM/sub/dir`: a PersistentVolumeClaim (ReadWriteMany for workers on several nodes), mounted at
      CHECKPOINT_MOUNT with the sub-path;
    * anything else (s3://...): nothing mounted, the URI is the worker's to use (FLOTILLA_CHECKPOINT_URI).
    """
    uri = str((spec.get("checkpoint") or {}).get("uri") or "")
    if uri.startswith("file://"):
        path = uri[len("file://"):]
        volume = {"name": "flotilla-checkpoint", "hostPath": {"path": path, "type": "DirectoryOrCreate"}}
        return path, volume, {"name": "flotilla-checkpoint", "mountPath": path}
    if uri.startswith("pvc://"):
        claim, _, sub = uri[len("pvc://"):].partition("/")
        volume = {"name": "flotilla-checkpoint", "persistentVolumeClaim": {"claimName": claim}}
        mount = {"name": "flotilla-checkpoint", "mountPath": CHECKPOINT_MOUNT}
        if sub.strip("/"):
            mount["subPath"] = sub.strip("/")
        return CHECKPOINT_MOUNT, volume, mount
    return None, None, None


def pipeline_stages(body: Body) -> int | None:
    """`spec.parallelism.pipelineStages`, when the job says it."""
    return parse.optional_integer(body["spec"].get("parallelism") or {}, "pipelineStages",
                                  "spec.parallelism") or None


def stage_of(rank: int, world: int, stages: int) -> int:
    """Pipeline stage of a worker: contiguous blocks of ranks, as Megatron-LM and torch.distributed.pipelining
    lay them out (pipeline outermost). With `world` not a multiple of `stages` the blocks differ by one."""
    return rank * stages // world


def worker_names(body: Body, placement: Mapping[str, int], generation: int) -> list[str]:
    """The names of `worker_pods(body, placement, generation)`, by rank, without making the pods."""
    meta = body["metadata"]
    per_worker = int(body["spec"]["elasticity"].get("gpusPerWorker", 1))
    world = sum(gpus // per_worker for gpus in placement.values())
    return [pod_name(meta["name"], meta["uid"], generation, rank) for rank in range(world)]


def worker_pods(body: Body, placement: Mapping[str, int], generation: int,
                agent_port: int = names.DEFAULT_AGENT_PORT) -> list[dict[str, Any]]:
    """The worker pods for a placement: one per `gpusPerWorker` GPUs, ranks in node order. Each gets the
    address of the agent on its node (the node's IP and `agent_port`) for its step-time reports, and, when
    the spec says the pipeline stages, its stage (label) and role (env); all get the rendezvous of their
    worker set and the checkpoint storage the spec names."""
    meta, spec = body["metadata"], body["spec"]
    ckpt_dir, volume, mount = checkpoint_storage(spec)
    ckpt = spec.get("checkpoint") or {}
    per_worker = int(spec["elasticity"].get("gpusPerWorker", 1))
    template = spec["template"]
    t_meta = template.get("metadata") or {}
    nodes = [node for node in sorted(placement) for _ in range(placement[node] // per_worker)]
    world = len(nodes)
    stages = pipeline_stages(body)
    pods = []
    for rank, node in enumerate(nodes):
        stage = stage_of(rank, world, stages) if stages else None
        pod_spec = copy.deepcopy(template["spec"])
        pod_spec["restartPolicy"] = "Never"
        pod_spec.setdefault("nodeSelector", {})["kubernetes.io/hostname"] = node
        pod_spec.setdefault("tolerations", []).extend([
            {"key": names.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
            # A node tainted unhealthy NoExecute must not evict the workers before they checkpoint:
            # the operator moves them through the resharding protocol; eviction is the backstop.
            {"key": names.TAINT_UNHEALTHY, "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": UNHEALTHY_TOLERATION_SECONDS},
        ])
        env = [
            {"name": "FLOTILLA_JOB", "value": meta["name"]},
            {"name": "FLOTILLA_JOB_UID", "value": meta["uid"]},
            {"name": "FLOTILLA_NAMESPACE", "value": meta["namespace"]},
            {"name": "FLOTILLA_RANK", "value": str(rank)},
            {"name": "FLOTILLA_WORLD_SIZE", "value": str(world)},
            {"name": "FLOTILLA_GENERATION", "value": str(generation)},
            {"name": names.ENV_AGENT_HOST, "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
            {"name": names.ENV_AGENT_PORT, "value": str(agent_port)},
            {"name": "FLOTILLA_GPUS_PER_WORKER", "value": str(per_worker)},
            # The process group's rendezvous: rank 0 of this worker set (torchrun's --master-addr/--master-port).
            {"name": "FLOTILLA_RENDEZVOUS_ADDR", "value": rendezvous_address(meta, generation, world)},
            {"name": "FLOTILLA_RENDEZVOUS_PORT", "value": str(RENDEZVOUS_PORT)},
            {"name": "MASTER_ADDR", "value": rendezvous_address(meta, generation, world)},
            {"name": "MASTER_PORT", "value": str(RENDEZVOUS_PORT)},
        ]
        if stage is not None:
            env.append({"name": names.ENV_ROLE, "value": f"pp{stage}/{stages}"})
        if ckpt.get("uri"):
            env.append({"name": "FLOTILLA_CHECKPOINT_URI", "value": str(ckpt["uri"])})
        if ckpt_dir:
            env.append({"name": "FLOTILLA_CHECKPOINT_DIR", "value": ckpt_dir})
        if ckpt.get("intervalSteps"):
            env.append({"name": "FLOTILLA_CHECKPOINT_INTERVAL_STEPS", "value": str(int(ckpt["intervalSteps"]))})
        if needs_rendezvous_service(world):
            pod_spec["subdomain"] = rendezvous_service_name(meta["name"], meta["uid"])
        if volume:
            pod_spec.setdefault("volumes", []).append(volume)
        for i, c in enumerate(pod_spec["containers"]):
            c.setdefault("env", []).extend(env)
            if mount:
                c.setdefault("volumeMounts", []).append(mount)
            if i == 0:
                limits = c.setdefault("resources", {}).setdefault("limits", {})
                limits[names.GPU_RESOURCE] = str(per_worker)
        labels = {**(t_meta.get("labels") or {}),
                  names.LABEL_JOB: meta["name"], names.LABEL_JOB_UID: meta["uid"], names.LABEL_ROLE: names.ROLE_WORKER,
                  names.LABEL_GENERATION: str(generation), names.LABEL_RANK: str(rank),
                  names.LABEL_MANAGED_BY: names.MANAGED_BY}
        if stage is not None:
            labels[names.LABEL_STAGE] = str(stage)
        pods.append({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name(meta["name"], meta["uid"], generation, rank),
                "namespace": meta["namespace"],
                "labels": labels,
                "annotations": dict(t_meta.get("annotations") or {}),
                "ownerReferences": [{"apiVersion": API_VERSION, "kind": "TrainingJob", "name": meta["name"],
                                     "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": pod_spec,
        })
    return pods


def set_condition(status: Mapping[str, Any], new: dict[str, Any], now: float) -> list[dict[str, Any]]:
    """Conditions with `new` merged in; lastTransitionTime moves only when status changes."""
    out, found = [], False
    for c in status.get("conditions") or []:
        if c.get("type") == new["type"]:
            found = True
            merged = {**c, **new}
            merged["lastTransitionTime"] = (c.get("lastTransitionTime") if c.get("status") == new["status"]
                                            else rfc3339(now))
            out.append(merged)
        else:
            out.append(c)
    if not found:
        out.append({**new, "lastTransitionTime": rfc3339(now)})
    return out


def _placement_list(placement: Mapping[str, int]) -> list[dict[str, Any]]:
    return [{"node": n, "gpus": g} for n, g in sorted(placement.items())]


def _describe(placement: Mapping[str, int]) -> str:
    return ", ".join(f"{n}:{g}" for n, g in sorted(placement.items())) or "none"


def checkpoint_request(body: Body) -> dict[str, Any] | None:
    return checkpoint.parse_request(body["metadata"].get("annotations"))


def checkpoint_ack(body: Body) -> dict[str, Any] | None:
    return checkpoint.parse_ack(body["metadata"].get("annotations"))


def _outlook(body: Body, state: JobState, gpus: int, now: float) -> dict[str, Any]:
    """Predicted completion: at rank 0's measured rate when it has reported one on this
    worker set, else at the rate the scaling curve gives for `gpus`."""
    status = body.get("status") or {}
    progress = progress_of(body) or {}
    rate = float(progress.get("stepsPerSecond") or 0.0) or state.curve.rate(gpus)
    if rate <= 0:
        return {}
    if progress.get("updatedAt"):
        eta = to_unix(progress["updatedAt"]) + state.remaining_steps / rate
    elif status.get("startedAt"):
        eta = to_unix(status["startedAt"]) + state.total_steps / rate
    else:
        eta = now + state.remaining_steps / rate
    return {"estimatedCompletion": rfc3339(eta), "deadlineMet": eta <= state.deadline}


def lent_to(body: Body) -> dict[str, int]:
    """ServingDeployment key -> GPUs this job lent it through the unified pool and has not got back."""
    return {sd: gpus for sd, gpus in parse.keyed_gpus(body.get("status") or {}, "lentTo", "serving").items() if gpus}


class _Plan:
    """Accumulates one job's status patch, annotation patch, pod actions and Events."""

    def __init__(self, body: Body, now: float, lending: Mapping[str, int] | None = None,
                 agent_port: int = names.DEFAULT_AGENT_PORT):
        self.body, self.now, self.agent_port = body, now, agent_port
        self.lending = dict(lending or {})  # serving key -> GPUs the pool lends it in this decision
        self.meta, self.status = body["metadata"], body.get("status") or {}
        self.ns, self.name = self.meta["namespace"], self.meta["name"]
        self.patch: dict[str, Any] = {}
        self.lazy: dict[str, Any] = {}  # written only with another status change
        self.annotations: dict[str, str] = {}
        self.actions: list[Action] = []

    def event(self, type_: str, reason: str, message: str) -> None:
        self.actions.append(PostEvent(involved(self.body), type_, reason, message))

    def condition(self, type_: str, status: str, reason: str, message: str) -> None:
        base = {**self.status, "conditions": self.patch.get("conditions", self.status.get("conditions"))}
        self.patch["conditions"] = set_condition(base, {"type": type_, "status": status, "reason": reason,
                                                        "message": message}, self.now)

    def checkpoint(self, **fields: Any) -> None:
        self.patch["checkpoint"] = {**self.recorded_checkpoint(), **fields}

    def recorded_checkpoint(self) -> dict[str, Any]:
        """status.checkpoint as this pass's patch leaves it."""
        return {**(self.status.get("checkpoint") or {}), **self.patch.get("checkpoint", {})}

    def done(self, *, keep_creates: bool = True) -> list[Action]:
        out: list[Action] = []
        if self.patch:
            out.append(PatchStatus(PLURAL, self.ns, self.name, {**self.lazy, **self.patch}))
        if self.annotations:
            out.append(PatchAnnotations(PLURAL, self.ns, self.name, self.annotations))
        out.extend(a for a in self.actions if keep_creates or not isinstance(a, (CreatePod, ApplyObject)))
        return out


def plan_job(body: Body, pods: Iterable[Body], decision: JobDecision | None, now: float,
             policy: str, ack_timeout: float = ACK_TIMEOUT_SECONDS, max_restarts: int = 3,
             lending: Mapping[str, int] | None = None,
             agent_port: int = names.DEFAULT_AGENT_PORT, state: JobState | None = None) -> list[Action]:
    """Actions that bring one TrainingJob's pods and status in line with the decision.

    A running job changes placement only through the resharding protocol: ask rank 0
    for a checkpoint (annotation), wait for its acknowledgement (or `ack_timeout`, or
    a request marked `restart`), then replace the worker set with a new generation.
    A failed worker pod restarts the worker set from the last completed checkpoint, up to
    `max_restarts` times; then the job fails.
    `lending` (unified pool): the ServingDeployments the decision's shrink lends GPUs to; recorded in
    `status.lentTo` when the job switches to the smaller worker set, and paid back as it grows again.
    `agent_port`: the node agents' step-time port, given to the worker pods.
    `state`: `job_state(body)`, when already made (the planner caches it).
    """
    if is_final(body):
        return []
    plan = _Plan(body, now, lending, agent_port)
    meta, status = plan.meta, plan.status
    state = state or job_state(body)
    if status.get("observedGeneration") != meta.get("generation"):
        plan.patch["observedGeneration"] = meta.get("generation")
    if not status.get("deadline"):
        plan.patch["deadline"] = rfc3339(state.deadline)
    if status.get("policy") != policy:
        plan.patch["policy"] = policy

    generation = int(status.get("reshards", 0))
    by_gen: dict[int, list[Body]] = {}
    for p in pods:
        by_gen.setdefault(int(p["metadata"]["labels"].get(names.LABEL_GENERATION, -1)), []).append(p)
    current = placement_of(body)
    want = dict(decision.placement) if decision else {}
    verdict = decision.verdict if decision else Verdict.PENDING
    reason = decision.reason if decision else "waiting for the allocator"
    _note_external_request(plan)
    _consume_acknowledgement(plan)
    if decision and decision.verdict is Verdict.ADMITTED and decision.share != state.share:
        # The allocator's input next pass (JobState.share). A larger share is written at once; a smaller one
        # (a job ahead of its plan) with the next write: until then the re-plan falls back on the larger.
        (plan.patch if decision.share > state.share else plan.lazy)["guaranteedShare"] = decision.share

    if not current:
        if verdict is Verdict.REJECTED:
            if status.get("phase") != phases.REJECTED:
                plan.patch.update(phase=phases.REJECTED, message=reason, gpus=0)
                plan.condition(names.COND_ADMITTED, "False", names.Reason.REJECTED, reason)
                plan.event("Warning", names.Reason.REJECTED, reason)
            return plan.done()
        if want:
            plan.patch["phase"] = phases.ADMITTED
            admitted = "BestEffort" if verdict is Verdict.BEST_EFFORT else names.Reason.ADMITTED
            plan.condition(names.COND_ADMITTED, "True", admitted, reason)
            _switch(plan, state, by_gen, want, generation, reason)
            return plan.done()
        if not status.get("phase") and plan.now - to_unix(meta["creationTimestamp"]) < QUIET_SECONDS:
            return []  # it may be placed in a moment: one write then, admitted and placed
        if status.get("phase") != phases.PENDING or status.get("message") != reason:
            plan.patch.update(phase=phases.PENDING, message=reason, gpus=0)
        return plan.done()

    if want and want != current:
        workers = by_gen.get(generation, [])
        # Workers need every rank: until all have run together there is no progress to checkpoint.
        ran = not _not_run_yet(body) or (bool(workers) and all(
            (p.get("status") or {}).get("phase") == "Running" for p in workers))
        if not ran:  # nothing has run on the old placement: nothing to checkpoint
            _switch(plan, state, by_gen, want, generation + 1, reason)
            return plan.done()
        if _ready_to_switch(plan, reason, ack_timeout):
            _switch(plan, state, by_gen, want, generation + 1, reason)
            return plan.done()
        return _keep_running(plan, state, by_gen, current, generation, max_restarts, resharding=True)
    if _acknowledged_now(plan):
        # Rank 0 wrote the checkpoint it was asked for, and its worker set stopped to be replaced, but the
        # decision no longer moves the job (it changed since the request): replace the set where it is.
        _switch(plan, state, by_gen, current, generation + 1, f"checkpoint written; staying on {_describe(current)}")
        return plan.done()
    return _keep_running(plan, state, by_gen, current, generation, max_restarts)


def _acknowledged_now(plan: _Plan) -> bool:
    """This pass records rank 0's acknowledgement of the last checkpoint request (the workers stopped)."""
    ckpt = plan.recorded_checkpoint()
    return ("generation" in plan.patch.get("checkpoint", {})
            and int(ckpt.get("generation", 0)) == int(ckpt.get("requestedGeneration", 0)) > 0)


def _note_external_request(plan: _Plan) -> None:
    """A checkpoint request the operator did not make (controller, admin) becomes the outstanding one."""
    request = checkpoint_request(plan.body)
    ckpt = plan.status.get("checkpoint") or {}
    if request and request["generation"] > max(int(ckpt.get("requestedGeneration", 0)),
                                               int(ckpt.get("generation", 0))):
        plan.checkpoint(requestedGeneration=request["generation"],
                        requestedAt=request.get("time") or rfc3339(plan.now), reason=str(request.get("reason", "")))
        plan.event("Normal", names.Reason.CHECKPOINT_REQUESTED,
                   f"checkpoint generation {request['generation']} requested by "
                   f"{request.get('requestedBy', 'someone')}: {request.get('reason', '')}")


def _consume_acknowledgement(plan: _Plan) -> None:
    """Record a checkpoint that rank 0 has acknowledged (once)."""
    ack = checkpoint_ack(plan.body)
    ckpt = plan.status.get("checkpoint") or {}
    if ack and ack["generation"] > int(ckpt.get("generation", 0)) and ack["generation"] <= int(
            ckpt.get("requestedGeneration", 0)):
        plan.checkpoint(generation=ack["generation"], step=ack["step"], time=ack.get("time") or rfc3339(plan.now))
        plan.event("Normal", names.Reason.CHECKPOINT_WRITTEN,
                   f"rank 0 wrote checkpoint generation {ack['generation']} at step {ack['step']}")


def _ready_to_switch(plan: _Plan, reason: str, ack_timeout: float) -> bool:
    """Drive the checkpoint request for a placement change; True once the workers may be replaced."""
    ckpt = plan.recorded_checkpoint()
    applied, requested = int(ckpt.get("generation", 0)), int(ckpt.get("requestedGeneration", 0))
    request = checkpoint_request(plan.body)
    if requested > applied:
        if request and request.get("restart"):
            return True
        asked_at = to_unix(ckpt.get("requestedAt") or rfc3339(plan.now))
        if plan.now - asked_at > ack_timeout:
            plan.event("Warning", names.Reason.RESTART_FROM_CHECKPOINT,
                       f"rank 0 did not acknowledge checkpoint generation {requested} within {ack_timeout:.0f}s")
            return True
        message = f"waiting for rank 0 to write checkpoint generation {requested}: {ckpt.get('reason') or reason}"
        if plan.status.get("message") != message:
            plan.patch.update(phase=phases.RESHARDING, message=message)
        return False
    if requested == applied and applied and ckpt.get("step") is not None and plan.patch.get("checkpoint"):
        return True  # acknowledged in this very pass
    generation = max(applied, requested, request["generation"] if request else 0) + 1
    plan.annotations.update(checkpoint.request_annotation(generation, reason, plan.now))
    plan.checkpoint(requestedGeneration=generation, requestedAt=rfc3339(plan.now), reason=reason)
    plan.patch.update(phase=phases.RESHARDING, message=f"checkpoint requested to change size: {reason}")
    plan.event("Normal", names.Reason.CHECKPOINT_REQUESTED, f"checkpoint generation {generation}: {reason}")
    return False


def _switch(plan: _Plan, state: JobState, by_gen: Mapping[int, list[Body]], want: Mapping[str, int],
            generation: int, reason: str) -> None:
    """Record the new placement (status first), then replace the worker set."""
    status = plan.status
    old = placement_of(plan.body)
    if old:
        ckpt = plan.recorded_checkpoint()
        progress = progress_of(plan.body) or {}
        resume = int(ckpt.get("step", 0))
        if int(ckpt.get("requestedGeneration", 0)) > int(ckpt.get("generation", 0)):
            plan.checkpoint(generation=int(ckpt["requestedGeneration"]))  # consumed, acknowledged or not
        lost = max(0, int(progress.get("steps", resume)) - resume)
        # The old worker set's rate says nothing of the new size: 0 until rank 0 reports again.
        plan.patch["progress"] = {"steps": resume, "stepsPerSecond": 0.0, "updatedAt": rfc3339(plan.now)}
        plan.patch.update(reshards=generation, phase=phases.RESHARDING)
        plan.event("Normal", names.Reason.RESHARDING,
                   f"from {sum(old.values())} to {sum(want.values())} GPUs ({_describe(want)}), resuming at step "
                   f"{resume}" + (f", {lost} steps lost" if lost else "") + f": {reason}")
        _settle_loans(plan, sum(old.values()), sum(want.values()))
    gpus = sum(want.values())
    plan.patch.update(placement=_placement_list(want), gpus=gpus, workers=gpus // state.gpus_per_worker,
                      message=reason)
    plan.patch.update(_outlook(plan.body, state, gpus, plan.now))
    _retire_old(plan, by_gen, generation)
    _create_when_free(plan, by_gen, generation, worker_pods(plan.body, want, generation, plan.agent_port))


def _retire_old(plan: _Plan, by_gen: Mapping[int, list[Body]], generation: int) -> None:
    """Delete the job's pods of other generations, each with its own grace period (the API server keeps a
    terminating pod, and the scheduler its GPUs, until its containers are gone), and only the pod seen (UID)."""
    plan.actions.extend(DeletePod(plan.ns, p["metadata"]["name"], p["metadata"].get("uid"))
                        for g, ps in by_gen.items() if g != generation
                        for p in ps if not p["metadata"].get("deletionTimestamp"))


def _create_when_free(plan: _Plan, by_gen: Mapping[int, list[Body]], generation: int,
                      manifests: Iterable[dict[str, Any]]) -> list[str]:
    """Create the worker pods of `generation`, each once no pod of another generation of this job holds GPUs
    on its node: the new worker must not start on GPUs whose old containers are still terminating.
    Returns the nodes it waits for (a later pass creates the rest when the old pods are gone)."""
    busy = {p["spec"]["nodeName"] for g, ps in by_gen.items() if g != generation for p in ps if holds_gpus(p)}
    waiting = []
    creating = False
    manifests = list(manifests)
    for m in manifests:
        node = m["spec"]["nodeSelector"]["kubernetes.io/hostname"]
        if node in busy:
            waiting.append(node)
        else:
            plan.actions.append(CreatePod(m))
            creating = True
    # Applied with every pod creation of a set that needs it: idempotent, and there before rank 0 is looked up.
    if creating and any("subdomain" in m["spec"] for m in manifests):
        plan.actions.append(ApplyObject(rendezvous_service(plan.body)))
    return sorted(set(waiting))


def _settle_loans(plan: _Plan, before: int, after: int) -> None:
    """status.lentTo: a shrink made for serving adds what it lends; growing back pays loans off, oldest key first."""
    ledger = lent_to(plan.body)
    ns = plan.ns
    if after < before and plan.lending:
        left = before - after
        for sd, g in sorted(plan.lending.items()):
            g = min(g, left)
            if g:
                left -= g
                ledger[sd] = ledger.get(sd, 0) + g
                plan.event("Normal", names.Reason.LENT_GPUS, f"lent {g} GPUs to {ref('sd', sd, ns)} "
                                                             f"({ledger[sd]} in all)")
    elif after > before and ledger:
        back = after - before
        for sd in sorted(ledger):
            g = min(ledger[sd], back)
            if g:
                back -= g
                ledger[sd] -= g
                plan.event("Normal", names.Reason.GOT_GPUS_BACK, f"got {g} GPUs back from {ref('sd', sd, ns)}")
    else:
        return
    plan.patch["lentTo"] = [{"serving": sd, "gpus": g} for sd, g in sorted(ledger.items()) if g]


def ref(kind: str, key: str, namespace: str) -> str:
    """"sd/name" for an object in `namespace`, "sd/other-ns/name" otherwise."""
    ns, _, name = key.rpartition("/")
    return f"{kind}/{name}" if ns == namespace else f"{kind}/{key}"


def _keep_running(plan: _Plan, state: JobState, by_gen: Mapping[int, list[Body]], current: Mapping[str, int],
                  generation: int, max_restarts: int, resharding: bool = False) -> list[Action]:
    """On the recorded placement: keep the pod set whole and derive the phase from it. `resharding`: the
    workers wait for rank 0's checkpoint to move (phase Resharding, not Running again)."""
    status, name = plan.status, plan.name
    _retire_old(plan, by_gen, generation)
    mine = {p["metadata"]["name"]: p for p in by_gen.get(generation, [])}
    expected = worker_names(plan.body, current, generation)
    missing = [n for n in expected if n not in mine]
    held_up = _create_when_free(plan, by_gen, generation, (
        m for m in (worker_pods(plan.body, current, generation, plan.agent_port) if missing else [])
        if m["metadata"]["name"] not in mine))
    pod_phase = {n: (p.get("status") or {}).get("phase", "Pending") for n, p in mine.items()}
    failed = sorted(n for n, ph in pod_phase.items() if ph == "Failed")
    if failed:
        restarts = int(status.get("restarts", 0))
        if restarts < max_restarts:
            why = f"worker pod {failed[0]} failed; restart {restarts + 1} of {max_restarts} from the last checkpoint"
            plan.patch["restarts"] = restarts + 1
            plan.event("Warning", names.Reason.WORKER_FAILED, why)
            _switch(plan, state, by_gen, current, generation + 1, why)
            return plan.done()
        why = f"worker pod {failed[0]} failed after {restarts} restarts"
        plan.patch.update(phase=phases.FAILED, message=why)
        plan.condition(names.COND_READY, "False", names.Reason.WORKER_FAILED, why)
        plan.event("Warning", names.Reason.WORKER_FAILED, why)
        plan.actions.extend(DeletePod(plan.ns, n, mine[n]["metadata"].get("uid"))
                            for n, ph in pod_phase.items() if ph not in ("Failed", "Succeeded"))
        return plan.done(keep_creates=False)
    if pod_phase.get(pod_name(name, plan.meta["uid"], generation, 0)) == "Succeeded":
        met = plan.now <= state.deadline
        plan.patch.update(phase=phases.SUCCEEDED, message="rank 0 exited successfully", gpus=0,
                          estimatedCompletion=rfc3339(plan.now), deadlineMet=met)
        if not status.get("startedAt") and (started := workers_started(mine.values())) is not None:
            plan.patch["startedAt"] = rfc3339(started)
        progress = progress_of(plan.body)
        if progress:
            plan.patch["progress"] = progress
        plan.condition(names.COND_READY, "False", names.Reason.SUCCEEDED,
                       f"finished; deadline {'met' if met else 'missed'}")
        return plan.done(keep_creates=False)
    all_running = len(mine) == len(expected) and all(ph == "Running" for ph in pod_phase.values())
    waiting = resharding or plan.patch.get("phase") == phases.RESHARDING
    if held_up and not waiting:
        msg = f"waiting for the previous worker set's pods to terminate on {', '.join(held_up)}"
        if status.get("message") != msg:
            plan.patch["message"] = msg
    _mirror_progress(plan)
    started = workers_started(mine.values()) if all_running else None
    if all_running and not waiting and status.get("phase") != phases.RUNNING and (
            plan.patch or started is None or plan.now - started >= QUIET_SECONDS):
        msg = f"{len(mine)} workers running on {_describe(current)}"
        plan.patch.update(phase=phases.RUNNING, message=msg)
        if not status.get("startedAt"):
            plan.patch["startedAt"] = rfc3339(min(started or plan.now, plan.now))
        plan.condition(names.COND_READY, "True", names.Reason.WORKERS_RUNNING, msg)
    outlook = _outlook(plan.body, state, sum(current.values()), plan.now)
    # The outlook moves with every progress report: refresh it with a patch made anyway, or when it flips.
    if plan.patch or outlook.get("deadlineMet") != status.get("deadlineMet"):
        plan.patch.update({k: v for k, v in outlook.items() if status.get(k) != v})
    return plan.done()


def workers_started(pods: Iterable[Body]) -> float | None:
    """When the last of a worker set's pods started (their status.startTime); None if one has not said."""
    times = [str((p.get("status") or {}).get("startTime") or "") for p in pods]
    return max(to_unix(t) for t in times) if times and all(times) else None


def _mirror_progress(plan: _Plan) -> None:
    """Copy rank 0's report into status: a new checkpoint at once (restarts resume from it), plain
    progress every PROGRESS_EVERY_SECONDS from the start (planning reads the annotation, status is for people;
    a job shorter than that gets its progress recorded when it finishes), or with a write made anyway."""
    progress, mirrored = progress_of(plan.body), plan.status.get("progress") or {}
    measured = (progress or {}).pop("restoreSeconds", None)
    if measured is not None and measured != (plan.status.get("checkpoint") or {}).get("restoreSeconds"):
        plan.checkpoint(restoreSeconds=measured)  # the allocator's cost of moving this job follows reality
    if not progress or progress == mirrored or "progress" in plan.patch:
        return
    checkpointed = progress.get("checkpointStep") is not None and progress["checkpointStep"] > int(
        (plan.status.get("checkpoint") or {}).get("step", 0))
    since = mirrored.get("updatedAt") or plan.status.get("startedAt")
    age = to_unix(progress["updatedAt"]) - (to_unix(since) if since else 0.0)
    if not checkpointed and age < PROGRESS_EVERY_SECONDS and not plan.patch:
        return
    plan.patch["progress"] = progress
    if checkpointed:
        plan.checkpoint(step=int(progress["checkpointStep"]), time=progress.get("updatedAt"))


def replan_at(body: Body, pods: Iterable[Body], now: float, state: JobState | None = None) -> float | None:
    """When time alone next changes what `plan_job` does for this job (its objects and its decision
    unchanged), after it was planned at `now`; None if only news does. The earliest of `TIMERS`, the
    places where `plan_job` reads the clock (each gives None once what it times was seen at `now`).
    `state`: `job_state(body)`, when already made."""
    if is_final(body):
        return None
    pods = list(pods)
    return min((t for timer in TIMERS if (t := timer(body, pods, now, state)) is not None), default=None)


def _quiet_start_ends(body: Body, pods: list[Body], now: float, state: JobState | None) -> float | None:
    """A job's first status (Pending) is written QUIET_SECONDS after its creation."""
    if (body.get("status") or {}).get("phase"):
        return None
    ends = to_unix(body["metadata"]["creationTimestamp"]) + QUIET_SECONDS
    return ends if ends > now else None


def _ack_times_out(body: Body, pods: list[Body], now: float, state: JobState | None) -> float | None:
    """The workers are replaced once ACK_TIMEOUT_SECONDS have passed since an unacknowledged checkpoint request."""
    ckpt = (body.get("status") or {}).get("checkpoint") or {}
    if int(ckpt.get("requestedGeneration", 0)) > int(ckpt.get("generation", 0)) and ckpt.get("requestedAt"):
        out = to_unix(ckpt["requestedAt"]) + ACK_TIMEOUT_SECONDS
        return out if out >= now else None  # `_ready_to_switch`: strictly more than the timeout
    return None


def _running_recorded_at(body: Body, pods: list[Body], now: float, state: JobState | None) -> float | None:
    """Workers all running are recorded Running QUIET_SECONDS after the last of them started (a job still
    not Running after that waits for something else: a checkpoint, a patch)."""
    status = body.get("status") or {}
    if status.get("phase") in (None, "", phases.RUNNING):
        return None
    generation = str(status.get("reshards", 0))
    mine = [p for p in pods if p["metadata"]["labels"].get(names.LABEL_GENERATION) == generation]
    if mine and all((p.get("status") or {}).get("phase") == "Running" for p in mine):
        if (started := workers_started(mine)) is not None and started + QUIET_SECONDS > now:
            return started + QUIET_SECONDS
    return None


def _outlook_turns_at(body: Body, pods: list[Body], now: float, state: JobState | None) -> float | None:
    """A placed job that has neither started nor reported progress is predicted to finish `now` plus what
    is left at its rate (`_outlook`): its `deadlineMet` turns false when that passes the deadline (and is
    written then: a time past it is the next pass)."""
    status = body.get("status") or {}
    placement = placement_of(body)
    if not placement or status.get("startedAt") or status.get("deadlineMet") is False:
        return None
    progress = progress_of(body) or {}
    if progress.get("updatedAt"):
        return None
    state = state or job_state(body)
    rate = float(progress.get("stepsPerSecond") or 0.0) or state.curve.rate(sum(placement.values()))
    if rate <= 0:
        return None
    # A hair early: `now + left <= deadline` is read in floating point, and a pass too early only plans it again.
    return state.deadline - state.remaining_steps / rate - 1e-6


TIMERS: tuple[Callable[[Body, list[Body], float, JobState | None], float | None], ...] = (
    _quiet_start_ends, _ack_times_out, _running_recorded_at, _outlook_turns_at)
