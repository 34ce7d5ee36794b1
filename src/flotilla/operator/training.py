"""TrainingJobs: from watched objects to the allocator's snapshot, the worker pods rendered, and the resharding
protocol's transitions (flotilla.reshard) as actions. Pure.

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
from flotilla.operator import devices
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
from flotilla.resources.parse import rfc3339, to_unix
from flotilla.reshard import protocol, view
from flotilla.reshard.view import JobView, WorkerPod
from flotilla.resources import names, parse, phases, training_job
from flotilla.resources import node as k8s_node


Body = Mapping[str, Any]
PLURAL = "trainingjobs"
UNHEALTHY_TOLERATION_SECONDS = 600
ACK_TIMEOUT_SECONDS = protocol.ACK_TIMEOUT_SECONDS
QUIET_SECONDS = protocol.QUIET_SECONDS
set_condition, ref = protocol.set_condition, protocol.ref  # also the ServingDeployments' (flotilla.operator.serving)


def key_of(body: Body) -> str:
    return f"{body['metadata']['namespace']}/{body['metadata']['name']}"


def placement_of(body: Body) -> dict[str, int]:
    """status.placement: node -> GPUs, nodes given none left out."""
    return {node: gpus for node, gpus in parse.keyed_gpus(body.get("status") or {}, "placement", "node").items()
            if gpus}


def placement_reader(states: Mapping[str, JobState] | None) -> Callable[[Body], Mapping[str, int]]:
    """`placement_of`, or the placement the jobs' `job_state`s already hold (`states`: job key -> its state)."""
    return placement_of if states is None else (lambda body: states[key_of(body)].placement)


def progress_of(body: Body) -> dict[str, Any] | None:
    """Rank 0's latest report (annotation) from the current worker set, else what status holds."""
    status = body.get("status") or {}
    return view.progress_of(body["metadata"].get("annotations"), status, view.worker_set_of(status))


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
    if verdict is not Verdict.REJECTED and job.best_effort and job.condition(
            names.COND_ADMITTED, "reason") == names.Reason.BEST_EFFORT:
        verdict = Verdict.BEST_EFFORT  # running or waiting without a guarantee: not admitted again
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
        resumes_at=_resumes_at(view.worker_set_of(body.get("status") or {}), progress, placement, job.restore_seconds),
        share=job.guaranteed_share,
        rate_unknown=bool(placement) and measured <= 0,
    )


def _resumes_at(worker_set: int, progress: Mapping[str, Any], placement: Mapping[str, int], restore: float) -> float:
    """When a resized or restarted job trains again: its restore runs from the switch (which resets the progress
    to 0 steps/s) until rank 0 of the new worker set reports a rate; 0 when it trains now."""
    if placement and worker_set and not progress.get("stepsPerSecond") and progress.get("updatedAt"):
        return to_unix(progress["updatedAt"]) + restore
    return 0.0


def node_state(body: Body) -> NodeState:
    """The node as the allocator sees it: its GPUs out of service on their own (a device-local fault) are not
    counted; the node keeps its others."""
    node = k8s_node.parse(body)
    return NodeState(name=node.name, total_gpus=node.in_service_gpus or 0, schedulable=node.schedulable,
                     labels=dict(node.labels))


def is_final(body: Body) -> bool:
    return (body.get("status") or {}).get("phase") in phases.TRAINING_FINAL


def live_by_uid(jobs: Iterable[Body]) -> dict[str, str]:
    """UID -> key of the jobs that are not finished: the owners whose pods are theirs to plan."""
    return {body["metadata"]["uid"]: key_of(body) for body in jobs
            if body["metadata"].get("uid") and not is_final(body)}


def snapshot(now: float, jobs: Iterable[Body], nodes: Iterable[Body], pods: Iterable[Body] = (),
             states: Mapping[str, JobState] | None = None,
             node_states: Mapping[str, NodeState] | None = None) -> ClusterSnapshot:
    """The allocator's view. A job in `displaced(...)` is shown holding nothing, so that it is placed afresh.
    `states`: job key -> its `job_state`, when already made (a cache); `node_states`: node name -> its
    `node_state`, likewise. Data, not callbacks: the snapshot is read here without going back to the caller."""
    gpu_nodes = tuple(node_states[n["metadata"]["name"]] if node_states is not None else node_state(n) for n in nodes
                      if "kwok.x-k8s.io/node" in (n["metadata"].get("annotations") or {})
                      or names.GPU_RESOURCE in ((n.get("status") or {}).get("allocatable") or {}))
    live = [j for j in jobs if not is_final(j)]
    pods = list(pods)
    moved = displaced(live, {n.name: n.total_gpus for n in gpu_nodes}, pods) | devices.on_gpus_out(live, nodes, pods)
    made = (states[key_of(j)] if states is not None else job_state(j) for j in live)
    return ClusterSnapshot(now=now, nodes=gpu_nodes,
                           jobs=tuple(replace(s, placement={}) if s.key in moved else s for s in made))


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
        if not protocol.has_not_run(body.get("status") or {}):
            continue
        uid, generation = body["metadata"].get("uid"), view.worker_set_of(body.get("status") or {})
        if any(own_now.get((uid, generation, node), 0) < gpus
               and allocatable.get(node, 0) - (bound.get(node, 0) - own.get((uid, node), 0)) < gpus
               for node, gpus in placement_of(body).items()):
            out.add(key_of(body))
    return out


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



def lent_to(body: Body) -> dict[str, int]:
    """ServingDeployment key -> GPUs this job lent it through the unified pool and has not got back."""
    return {sd: gpus for sd, gpus in parse.keyed_gpus(body.get("status") or {}, "lentTo", "serving").items() if gpus}


def worker_pod(pod: Body, job_uid: str) -> WorkerPod:
    """A worker pod of the job with that UID, as the protocol reads it. Its rank is read from its name (`pod_name`):
    a pod of another name is no rank of the set."""
    meta, status = pod["metadata"], pod.get("status") or {}
    raw = (meta.get("labels") or {}).get(names.LABEL_GENERATION, "")
    worker_set = int(raw) if str(raw).isdigit() else -1
    name = meta["name"]
    tail = f"-{uid_hash(job_uid)}-g{worker_set}-w"
    rank = name[name.rfind(tail) + len(tail):] if tail in name else ""
    start = status.get("startTime")
    return WorkerPod(name=name, uid=meta.get("uid"), worker_set=worker_set,
                     rank=int(rank) if rank.isdigit() else -1, node=(pod.get("spec") or {}).get("nodeName"),
                     phase=status.get("phase") or "Pending", started=to_unix(str(start)) if start else None,
                     terminating=bool(meta.get("deletionTimestamp")), holds_gpus=holds_gpus(pod))


def plan_job(body: Body, pods: Iterable[Body], decision: JobDecision | None, now: float,
             policy: str, ack_timeout: float = ACK_TIMEOUT_SECONDS, max_restarts: int = 3,
             lending: Mapping[str, int] | None = None,
             agent_port: int = names.DEFAULT_AGENT_PORT, state: JobState | None = None) -> list[Action]:
    """Actions that bring one TrainingJob's pods and status in line with the decision: the resharding
    protocol's transition (flotilla.reshard.protocol), its pods rendered.
    `lending` (unified pool): the ServingDeployments the decision's shrink lends GPUs to.
    `agent_port`: the node agents' step-time port, given to the worker pods.
    `state`: `job_state(body)`, when already made (the planner caches it)."""
    if is_final(body):
        return []
    settings = protocol.Settings(policy, ack_timeout, max_restarts, dict(lending or {}))
    uid = str(body["metadata"].get("uid") or "")
    move = protocol.transition(JobView.of(body), state or job_state(body), [worker_pod(p, uid) for p in pods],
                               decision, now, settings)
    return actions_of(body, move, agent_port)


def actions_of(body: Body, move: protocol.Transition, agent_port: int = names.DEFAULT_AGENT_PORT) -> list[Action]:
    """A transition as the operator's writes: status, annotations, then its effects in order, pods rendered."""
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    out: list[Action] = []
    if move.status:
        out.append(PatchStatus(PLURAL, ns, name, {**move.lazy, **move.status}))
    if move.annotations:
        out.append(PatchAnnotations(PLURAL, ns, name, move.annotations))
    rendered: dict[tuple[int, tuple[tuple[str, int], ...]], list[dict[str, Any]]] = {}
    for effect in move.effects:
        if isinstance(effect, protocol.Event):
            out.append(PostEvent(involved(body), effect.type, effect.reason, effect.message))
        elif isinstance(effect, protocol.DeleteWorker):
            out.append(DeletePod(ns, effect.name, effect.uid))
        elif isinstance(effect, protocol.CreateWorker):
            key = (effect.worker_set, effect.placement)
            if key not in rendered:
                rendered[key] = worker_pods(body, dict(effect.placement), effect.worker_set, agent_port)
            out.append(CreatePod(rendered[key][effect.rank]))
        else:
            out.append(ApplyObject(rendezvous_service(body)))
    return out


def replan_at(body: Body, pods: Iterable[Body], now: float, state: JobState | None = None) -> float | None:
    """When time alone next changes what `plan_job` does for this job (its objects and its decision
    unchanged), after it was planned at `now`; None if only news does (`protocol.next_change_at`).
    `state`: `job_state(body)`, when already made."""
    if is_final(body):
        return None
    uid = str(body["metadata"].get("uid") or "")
    return protocol.next_change_at(JobView.of(body), [worker_pod(p, uid) for p in pods], now,
                                   state or job_state(body))
