"""TrainingJobs: from watched objects to a snapshot, and from a decision to actions. Pure.

Restart safety: the placement a job runs on is recorded in `status.placement`
before its pods are created, and pod names are derived from it
(`<job>-g<generation>-w<rank>`). A restarted operator reads the placement back,
creates only the pods that are missing (a create that finds the pod is a no-op)
and never a second set.
"""

from __future__ import annotations

import copy
import json
import logging
from typing import Any, Iterable, Mapping

from flotilla import API_VERSION
from flotilla.allocation import ClusterSnapshot, JobDecision, JobState, NodeState, ScalingCurve, Verdict
from flotilla.operator.actions import Action, CreatePod, DeletePod, PatchStatus, PostEvent, involved
from flotilla.operator.timeutil import rfc3339, to_unix
from flotilla.resources import names, phases

log = logging.getLogger(__name__)

Body = Mapping[str, Any]
PLURAL = "trainingjobs"


def key_of(body: Body) -> str:
    return f"{body['metadata']['namespace']}/{body['metadata']['name']}"


def deadline_of(body: Body) -> float:
    spec = body["spec"]
    if spec.get("deadline"):
        return to_unix(spec["deadline"])
    return to_unix(body["metadata"]["creationTimestamp"]) + float(spec["deadlineSeconds"])


def placement_of(body: Body) -> dict[str, int]:
    return {p["node"]: int(p["gpus"]) for p in (body.get("status") or {}).get("placement") or [] if p["gpus"]}


def progress_of(body: Body) -> dict[str, Any] | None:
    """Rank 0's latest report (annotation), else what status already holds."""
    raw = (body["metadata"].get("annotations") or {}).get(names.ANNOTATION_PROGRESS)
    if raw:
        try:
            p = json.loads(raw)
            return {"steps": int(p["steps"]), "stepsPerSecond": float(p.get("stepsPerSecond", 0.0)),
                    "updatedAt": p.get("time") or rfc3339(0)}
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring malformed %s annotation on %s", names.ANNOTATION_PROGRESS, key_of(body))
    return (body.get("status") or {}).get("progress")


_VERDICT_OF_PHASE = {
    phases.ADMITTED: Verdict.ADMITTED, phases.RUNNING: Verdict.ADMITTED, phases.RESHARDING: Verdict.ADMITTED,
    phases.REJECTED: Verdict.REJECTED,
}


def job_state(body: Body) -> JobState:
    spec, status = body["spec"], body.get("status") or {}
    el = spec["elasticity"]
    progress = progress_of(body) or {}
    verdict = _VERDICT_OF_PHASE.get(status.get("phase", ""))
    if verdict is Verdict.ADMITTED and spec.get("bestEffort") and _condition(status, names.COND_ADMITTED,
                                                                              "reason") == "BestEffort":
        verdict = Verdict.BEST_EFFORT
    return JobState(
        key=key_of(body),
        submit_time=to_unix(body["metadata"]["creationTimestamp"]),
        deadline=deadline_of(body),
        total_steps=int(spec["totalSteps"]),
        done_steps=int(progress.get("steps", 0)),
        min_gpus=int(el["minGPUs"]),
        max_gpus=int(el["maxGPUs"]),
        gpus_per_worker=int(el.get("gpusPerWorker", 1)),
        curve=ScalingCurve.of([(int(p["gpus"]), float(p["stepsPerSecond"])) for p in spec["throughput"]]),
        restore_seconds=float((spec.get("checkpoint") or {}).get("restoreSeconds", 30.0)),
        best_effort=bool(spec.get("bestEffort", False)),
        placement=placement_of(body),
        verdict=verdict,
        checkpoint_interval_steps=int((spec.get("checkpoint") or {}).get("intervalSteps", 0)),
        last_checkpoint_step=int((status.get("checkpoint") or {}).get("step", 0)),
    )


def node_state(node: Body) -> NodeState:
    meta, spec, status = node["metadata"], node.get("spec") or {}, node.get("status") or {}
    gpus = int(str((status.get("allocatable") or {}).get(names.GPU_RESOURCE, "0")))
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    tainted = any(t.get("key") == names.TAINT_UNHEALTHY for t in spec.get("taints") or [])
    return NodeState(name=meta["name"], total_gpus=gpus,
                     schedulable=ready and not spec.get("unschedulable", False) and not tainted,
                     labels=dict(meta.get("labels") or {}))


def is_final(body: Body) -> bool:
    return (body.get("status") or {}).get("phase") in phases.TRAINING_FINAL


def snapshot(now: float, jobs: Iterable[Body], nodes: Iterable[Body]) -> ClusterSnapshot:
    return ClusterSnapshot(
        now=now,
        nodes=tuple(node_state(n) for n in nodes if "kwok.x-k8s.io/node" in (n["metadata"].get("annotations") or {})
                    or names.GPU_RESOURCE in ((n.get("status") or {}).get("allocatable") or {})),
        jobs=tuple(job_state(j) for j in jobs if not is_final(j)),
    )


def pod_name(job: str, generation: int, rank: int) -> str:
    return f"{job}-g{generation}-w{rank}"


def worker_pods(body: Body, placement: Mapping[str, int], generation: int) -> list[dict[str, Any]]:
    """The worker pods for a placement: one per `gpusPerWorker` GPUs, ranks in node order."""
    meta, spec = body["metadata"], body["spec"]
    per_worker = int(spec["elasticity"].get("gpusPerWorker", 1))
    template = spec["template"]
    t_meta = template.get("metadata") or {}
    nodes = [node for node in sorted(placement) for _ in range(placement[node] // per_worker)]
    world = len(nodes)
    pods = []
    for rank, node in enumerate(nodes):
        pod_spec = copy.deepcopy(template["spec"])
        pod_spec["restartPolicy"] = "Never"
        pod_spec.setdefault("nodeSelector", {})["kubernetes.io/hostname"] = node
        pod_spec.setdefault("tolerations", []).append(
            {"key": names.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
        env = [
            {"name": "FLOTILLA_JOB", "value": meta["name"]},
            {"name": "FLOTILLA_NAMESPACE", "value": meta["namespace"]},
            {"name": "FLOTILLA_RANK", "value": str(rank)},
            {"name": "FLOTILLA_WORLD_SIZE", "value": str(world)},
            {"name": "FLOTILLA_GENERATION", "value": str(generation)},
        ]
        for i, c in enumerate(pod_spec["containers"]):
            c.setdefault("env", []).extend(env)
            if i == 0:
                limits = c.setdefault("resources", {}).setdefault("limits", {})
                limits[names.GPU_RESOURCE] = str(per_worker)
        labels = {**(t_meta.get("labels") or {}),
                  names.LABEL_JOB: meta["name"], names.LABEL_ROLE: names.ROLE_WORKER,
                  names.LABEL_GENERATION: str(generation), names.LABEL_RANK: str(rank),
                  names.LABEL_MANAGED_BY: names.MANAGED_BY}
        pods.append({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name(meta["name"], generation, rank),
                "namespace": meta["namespace"],
                "labels": labels,
                "annotations": dict(t_meta.get("annotations") or {}),
                "ownerReferences": [{"apiVersion": API_VERSION, "kind": "TrainingJob", "name": meta["name"],
                                     "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": pod_spec,
        })
    return pods


def _condition(status: Mapping[str, Any], type_: str, field: str = "status") -> str | None:
    for c in status.get("conditions") or []:
        if c.get("type") == type_:
            return c.get(field)
    return None


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


def _outlook(body: Body, state: JobState, gpus: int, now: float) -> dict[str, Any]:
    """Predicted completion from reported progress, or from the curve since the run started."""
    status = body.get("status") or {}
    rate = state.curve.rate(gpus)
    if rate <= 0:
        return {}
    progress = progress_of(body)
    if progress:
        since = to_unix(progress["updatedAt"]) if progress.get("updatedAt") else now
        eta = since + state.remaining_steps / rate
    elif status.get("startedAt"):
        eta = to_unix(status["startedAt"]) + state.total_steps / rate
    else:
        eta = now + state.total_steps / rate
    return {"estimatedCompletion": rfc3339(eta), "deadlineMet": eta <= state.deadline}


def plan_job(body: Body, pods: Iterable[Body], decision: JobDecision | None, now: float,
             policy: str) -> list[Action]:
    """Actions that bring one TrainingJob's pods and status in line with the decision."""
    if is_final(body):
        return []
    meta, status = body["metadata"], body.get("status") or {}
    state = job_state(body)
    obj = involved(body)
    ns, name = meta["namespace"], meta["name"]
    generation = int(status.get("reshards", 0))
    current = placement_of(body)
    patch: dict[str, Any] = {}
    actions: list[Action] = []
    if status.get("observedGeneration") != meta.get("generation"):
        patch["observedGeneration"] = meta.get("generation")
    if not status.get("deadline"):
        patch["deadline"] = rfc3339(state.deadline)
    if status.get("policy") != policy:
        patch["policy"] = policy

    def event(type_: str, reason: str, message: str) -> None:
        actions.append(PostEvent(obj, type_, reason, message))

    def finish() -> list[Action]:
        if patch:
            actions.insert(0, PatchStatus(PLURAL, ns, name, patch))
        return actions

    by_gen: dict[int, list[Body]] = {}
    for p in pods:
        by_gen.setdefault(int(p["metadata"]["labels"].get(names.LABEL_GENERATION, -1)), []).append(p)
    stale = [p for g, ps in by_gen.items() if g != generation for p in ps]

    want = dict(decision.placement) if decision else {}
    verdict = decision.verdict if decision else Verdict.PENDING
    reason = decision.reason if decision else "waiting for the allocator"

    if verdict is Verdict.REJECTED and not current:
        if status.get("phase") != phases.REJECTED:
            patch.update(phase=phases.REJECTED, message=reason, gpus=0,
                         conditions=set_condition(status, {"type": names.COND_ADMITTED, "status": "False",
                                                           "reason": names.Reason.REJECTED, "message": reason}, now))
            event("Warning", names.Reason.REJECTED, reason)
        return finish()

    if want != current and want:
        # A new placement: record it first, then create its pods (restart-safe order).
        if current:
            generation += 1
            patch.update(reshards=generation, phase=phases.RESHARDING)
            event("Normal", names.Reason.RESHARDING,
                  f"moving from {sum(current.values())} to {sum(want.values())} GPUs ({_describe(want)}): {reason}")
            stale = [p for ps in by_gen.values() for p in ps]
        else:
            patch["phase"] = phases.ADMITTED
            admitted_reason = "BestEffort" if verdict is Verdict.BEST_EFFORT else names.Reason.ADMITTED
            patch["conditions"] = set_condition(status, {"type": names.COND_ADMITTED, "status": "True",
                                                         "reason": admitted_reason, "message": reason}, now)
            event("Normal", names.Reason.ADMITTED, f"{sum(want.values())} GPUs on {_describe(want)}: {reason}")
        patch.update(placement=_placement_list(want), gpus=sum(want.values()),
                     workers=sum(want.values()) // state.gpus_per_worker, message=reason)
        patch.update(_outlook(body, state, sum(want.values()), now))
        actions.extend(DeletePod(ns, p["metadata"]["name"]) for p in stale
                       if not p["metadata"].get("deletionTimestamp"))
        actions.extend(CreatePod(m) for m in worker_pods(body, want, generation))
        return finish()

    if not current:
        if status.get("phase") != phases.PENDING or status.get("message") != reason:
            patch.update(phase=phases.PENDING, message=reason, gpus=0)
            if status.get("phase") != phases.PENDING:
                event("Normal", names.Reason.QUEUED, reason)
        return finish()

    # Running on its recorded placement: keep the pod set whole and derive the phase from it.
    actions.extend(DeletePod(ns, p["metadata"]["name"]) for p in stale if not p["metadata"].get("deletionTimestamp"))
    mine = {p["metadata"]["name"]: p for p in by_gen.get(generation, [])}
    expected = worker_pods(body, current, generation)
    actions.extend(CreatePod(m) for m in expected if m["metadata"]["name"] not in mine)
    pod_phase = {n: (p.get("status") or {}).get("phase", "Pending") for n, p in mine.items()}
    failed = sorted(n for n, ph in pod_phase.items() if ph == "Failed")
    rank0 = pod_name(name, generation, 0)
    if failed:
        why = f"worker pod {failed[0]} failed"
        patch.update(phase=phases.FAILED, message=why,
                     conditions=set_condition(status, {"type": names.COND_READY, "status": "False",
                                                       "reason": names.Reason.WORKER_FAILED, "message": why}, now))
        event("Warning", names.Reason.WORKER_FAILED, why)
        actions.extend(DeletePod(ns, n) for n, ph in pod_phase.items() if ph not in ("Failed", "Succeeded"))
        return [a for a in finish() if not isinstance(a, CreatePod)]
    if pod_phase.get(rank0) == "Succeeded":
        patch.update(phase=phases.SUCCEEDED, message="rank 0 exited successfully", gpus=0,
                     estimatedCompletion=rfc3339(now), deadlineMet=now <= state.deadline,
                     conditions=set_condition(status, {"type": names.COND_READY, "status": "False",
                                                       "reason": names.Reason.SUCCEEDED,
                                                       "message": "finished"}, now))
        met = "met" if now <= state.deadline else "missed"
        event("Normal", names.Reason.SUCCEEDED, f"finished; deadline {met}")
        return [a for a in finish() if not isinstance(a, CreatePod)]
    all_running = len(mine) == len(expected) and all(ph == "Running" for ph in pod_phase.values())
    if all_running and status.get("phase") != phases.RUNNING:
        patch.update(phase=phases.RUNNING, message=f"{len(mine)} workers running on {_describe(current)}")
        if not status.get("startedAt"):
            patch["startedAt"] = rfc3339(now)
        patch["conditions"] = set_condition(status, {"type": names.COND_READY, "status": "True",
                                                     "reason": names.Reason.WORKERS_RUNNING,
                                                     "message": f"{len(mine)} workers running"}, now)
        event("Normal", names.Reason.WORKERS_RUNNING, f"{len(mine)} workers running on {_describe(current)}")
    progress = progress_of(body)
    if progress and progress != status.get("progress"):
        patch["progress"] = progress
    outlook = _outlook(body, state, sum(current.values()), now)
    for k, v in outlook.items():
        if status.get(k) != v:
            patch[k] = v
    return finish()
