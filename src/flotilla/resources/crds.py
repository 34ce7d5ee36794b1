"""The CRDs, generated from this module (the single source of truth).

`flotilla crds --write crds/` regenerates the checked-in YAML; a test fails
when it drifts from what this module produces.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import yaml

from flotilla import GROUP, VERSION
from flotilla.resources import phases
from flotilla.resources.schema import (
    Schema,
    array,
    boolean,
    free_object,
    integer,
    number,
    obj,
    rule,
    string,
)

CATEGORY = "flotilla"

CONDITIONS = array(
    obj(
        {
            "type": string("Condition type, e.g. Admitted, Ready, DeadlineAtRisk.", max_length=316),
            "status": string(enum=["True", "False", "Unknown"]),
            "reason": string("CamelCase reason for the last transition.", max_length=1024),
            "message": string("Human-readable details.", max_length=32768),
            "lastTransitionTime": string(fmt="date-time"),
            "observedGeneration": integer(minimum=0),
        },
        required=["type", "status"],
    ),
    "Standard Kubernetes conditions.",
    list_type="map",
    list_map_keys=["type"],
)

QUEUE_REF = string("The Queue (cluster-scoped) this counts against; default: the queue that serves the namespace, "
                   "none when no Queue does.", min_length=1, max_length=253)
QUEUE_STATUS = string("The queue it counts against, as the operator resolved it.", max_length=253)

POD_TEMPLATE = obj(
    {
        "metadata": free_object("Labels and annotations added to every pod."),
        "spec": obj(
            {
                "containers": array(
                    obj({"name": string(min_length=1), "image": string(min_length=1)},
                        required=["name", "image"], preserve_unknown=True),
                    min_items=1,
                ),
            },
            "A core/v1 PodSpec. Flotilla adds the GPU requests and the placement.",
            required=["containers"],
            preserve_unknown=True,
        ),
    },
    "The worker pod template.",
    required=["spec"],
)


def _training_job_schema() -> Schema:
    spec = obj(
        {
            "deadline": string("Absolute deadline (RFC 3339). Exactly one of deadline and deadlineSeconds.",
                               fmt="date-time"),
            "deadlineSeconds": integer("Deadline in seconds after the job's creation.", minimum=1),
            "totalSteps": integer("Training steps to run in all.", minimum=1),
            "elasticity": obj(
                {
                    "minGPUs": integer("Fewest GPUs the job may run on.", minimum=1),
                    "maxGPUs": integer("Most GPUs the job may use.", minimum=1),
                    "gpusPerWorker": integer("GPUs per worker pod; counts move in whole workers.",
                                             minimum=1, maximum=16, default=1),
                },
                "The elastic GPU range.",
                required=["minGPUs", "maxGPUs"],
                rules=[
                    rule("self.minGPUs <= self.maxGPUs",
                         "spec.elasticity.minGPUs must be <= spec.elasticity.maxGPUs", ".minGPUs"),
                    rule("!has(self.gpusPerWorker) || self.minGPUs % self.gpusPerWorker == 0",
                         "spec.elasticity.minGPUs must be a multiple of gpusPerWorker", ".minGPUs"),
                    rule("!has(self.gpusPerWorker) || self.maxGPUs % self.gpusPerWorker == 0",
                         "spec.elasticity.maxGPUs must be a multiple of gpusPerWorker", ".maxGPUs"),
                ],
            ),
            "throughput": array(
                obj(
                    {
                        "gpus": integer(minimum=1),
                        "stepsPerSecond": number(minimum=0, exclusive_minimum=True),
                    },
                    required=["gpus", "stepsPerSecond"],
                ),
                "Measured scaling curve: steps/s at a GPU count. Interpolated between points, "
                "never extrapolated upward.",
                min_items=1,
                max_items=64,
                rules=[rule("self.all(p, self.exists_one(q, q.gpus == p.gpus))",
                            "spec.throughput must not list the same gpus twice")],
            ),
            "checkpoint": obj(
                {
                    "intervalSteps": integer("Steps between periodic checkpoints.", minimum=1),
                    "uri": string("Where checkpoints are written: file:///dir (a host directory, mounted at "
                                  "the same path), pvc://CLAIM/sub/dir (a PersistentVolumeClaim, mounted at "
                                  "/flotilla/checkpoint), or any other URI, passed on as FLOTILLA_CHECKPOINT_URI.",
                                  max_length=2048),
                    "restoreSeconds": number("Declared cost of a stop/reshard/restart, in seconds, until the "
                                             "workers measure it (status.checkpoint.restoreSeconds).",
                                             minimum=0, default=30),
                },
                "Checkpointing, used for resharding when the job changes size.",
                rules=[rule("!has(self.uri) || !self.uri.startsWith('file://') || self.uri.startsWith('file:///')",
                            "spec.checkpoint.uri: a file:// URI needs an absolute path (file:///dir)"),
                       rule("!has(self.uri) || !self.uri.startsWith('pvc://') "
                            "|| self.uri.matches('^pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/.*)?$')",
                            "spec.checkpoint.uri: pvc://CLAIM/path needs a claim name (a DNS-1123 label)")],
            ),
            "bestEffort": boolean("Run even when the deadline cannot be guaranteed.", default=False),
            "priority": integer("Higher runs first among best-effort jobs.", default=0,
                                minimum=-1000, maximum=1000),
            "parallelism": obj(
                {
                    "pipelineStages": integer(
                        "Pipeline-parallel stages. Worker pods get contiguous blocks of ranks per stage, the label "
                        "flotilla.dev/stage and FLOTILLA_ROLE=pp<stage>/<stages>; the health detector compares "
                        "machines only with those in the same stage.", minimum=1, maximum=1024),
                },
                "How the job splits its model, where it matters to Flotilla (health: which machines are peers).",
            ),
            "queue": QUEUE_REF,
            "template": POD_TEMPLATE,
        },
        required=["totalSteps", "elasticity", "throughput", "template"],
        rules=[rule("has(self.deadline) != has(self.deadlineSeconds)",
                    "exactly one of spec.deadline and spec.deadlineSeconds must be set"),
               rule("!has(self.parallelism) || !has(self.parallelism.pipelineStages) || self.elasticity.minGPUs >= "
                    "self.parallelism.pipelineStages * (has(self.elasticity.gpusPerWorker) ? "
                    "self.elasticity.gpusPerWorker : 1)",
                    "spec.parallelism.pipelineStages must be at most the number of workers at spec.elasticity.minGPUs "
                    "(minGPUs / gpusPerWorker)", ".parallelism.pipelineStages")],
    )
    status = obj(
        {
            "phase": string("Where the job is in its life.", enum=list(phases.TRAINING)),
            "gpus": integer("GPUs the job holds now.", minimum=0),
            "placement": array(obj({"node": string(), "gpus": integer(minimum=0)}, required=["node", "gpus"])),
            "deadline": string("The deadline as an absolute time.", fmt="date-time"),
            "progress": obj({
                "steps": integer(minimum=0),
                "stepsPerSecond": number(minimum=0),
                "updatedAt": string(fmt="date-time"),
            }),
            "estimatedCompletion": string(fmt="date-time"),
            "deadlineMet": boolean("Prediction: will the job finish by its deadline?"),
            "checkpoint": obj({
                "step": integer("Step of the last completed checkpoint.", minimum=0),
                "time": string(fmt="date-time"),
                "generation": integer("The last checkpoint request that was acted on.", minimum=0),
                "requestedGeneration": integer("The checkpoint request outstanding, if above generation.",
                                               minimum=0),
                "requestedAt": string(fmt="date-time"),
                "reason": string("Why the last checkpoint was requested.", max_length=1024),
                "restoreSeconds": number("Measured by the workers: from the acknowledged checkpoint to the new "
                                         "worker set's first step (stop, reschedule, rendezvous, reshard-load).",
                                         minimum=0),
            }),
            "reshards": integer("Times the worker set was replaced to change size or placement, or at a checkpoint "
                                "request (crash restarts are counted in restarts).", minimum=0),
            "workerGeneration": integer("The number of the worker set that runs now: its pods' "
                                        "flotilla.dev/generation label. A new set at every reshard and restart.",
                                        minimum=0),
            "startedAt": string("When all workers first ran.", fmt="date-time"),
            "restarts": integer("Times the worker set restarted from a checkpoint after a worker failed.", minimum=0),
            "workers": integer("Worker pods the current placement needs.", minimum=0),
            "message": string("What is happening, in one line.", max_length=1024),
            "policy": string("Allocation policy that decided the placement.", max_length=64),
            "guaranteedShare": integer("The share (GPUs) the deadline guarantee is planned at; the allocator "
                                       "re-plans from it.", minimum=0),
            "lentTo": array(obj({"serving": string("namespace/name of the ServingDeployment.", max_length=320),
                                 "gpus": integer(minimum=0)}, required=["serving", "gpus"]),
                            "GPUs this job lent to ServingDeployments through the unified pool and has not got "
                            "back.", max_items=256),
            "queue": QUEUE_STATUS,
            "conditions": CONDITIONS,
            "observedGeneration": integer(minimum=0),
        }
    )
    return obj({"spec": spec, "status": status}, required=["spec"])


def _serving_deployment_schema() -> Schema:
    from flotilla.resources.profile_schema import PROFILE_SCHEMA

    phase_pool = lambda what: obj(  # noqa: E731
        {
            "template": POD_TEMPLATE,
            "gpusPerInstance": integer(f"GPUs per {what} instance (tensor parallelism); unset, the "
                                       "planner chooses (1 in fixed mode).", minimum=1, maximum=16),
        },
        f"The {what} pool.",
        required=["template"],
    )
    spec = obj(
        {
            "slo": obj(
                {
                    "ttftMs": number("Time-to-first-token target, ms.", minimum=0, exclusive_minimum=True),
                    "tpotMs": number("Time-per-output-token target, ms.", minimum=0, exclusive_minimum=True),
                    "attainment": number("Fraction of requests that must meet both targets.",
                                         minimum=0, maximum=1, exclusive_minimum=True, default=0.9),
                },
                "Latency SLOs.",
                required=["ttftMs", "tpotMs"],
            ),
            "workload": obj(
                {
                    "requestsPerSecond": number(minimum=0),
                    "inputTokens": integer("Mean prompt length.", minimum=1),
                    "outputTokens": integer("Mean output length.", minimum=1),
                },
                "Initial estimate of the load, until observed statistics arrive.",
                required=["requestsPerSecond", "inputTokens", "outputTokens"],
            ),
            "prefill": phase_pool("prefill"),
            "decode": phase_pool("decode"),
            "endpoint": obj(
                {
                    "port": integer("The engines' HTTP port (OpenAI API and /metrics) in both pools' pods; the "
                                    "Services and the InferencePool forward to it.", minimum=1, maximum=65535,
                                    default=8000),
                    "endpointPicker": obj(
                        {"name": string("The endpoint picker's Service.", max_length=253),
                         "port": integer(minimum=1, maximum=65535, default=9002)},
                        "The InferencePool's endpointPickerRef (the Gateway API Inference Extension's endpoint "
                        "picker, e.g. llm-d's scheduler, deployed by you); default <name>-epp, port 9002.",
                        required=["name"]),
                },
                "Where clients and routers reach the engines: a Service per pool, and an InferencePool when "
                "its CRD (inference.networking.k8s.io/v1) is installed.",
            ),
            "profile": PROFILE_SCHEMA,
            "minGPUs": integer(minimum=0, default=0),
            "maxGPUs": integer(minimum=1),
            "queue": QUEUE_REF,
            "planner": obj(
                {
                    "mode": string("auto: the planner owns the replica counts; fixed: the spec does.",
                                   enum=["auto", "fixed"], default="auto"),
                    "intervalSeconds": integer(minimum=5, maximum=3600, default=30),
                    "prefillReplicas": integer(minimum=0),
                    "decodeReplicas": integer(minimum=0),
                },
                rules=[rule("self.mode != 'fixed' || (has(self.prefillReplicas) && has(self.decodeReplicas))",
                            "spec.planner.prefillReplicas and decodeReplicas are required when mode is fixed")],
            ),
            "plan": obj(
                {
                    "prefillReplicas": integer(minimum=0),
                    "decodeReplicas": integer(minimum=0),
                    "prefillGPUsPerInstance": integer(minimum=1, maximum=16),
                    "decodeGPUsPerInstance": integer(minimum=1, maximum=16),
                    "predictedGoodput": number("Requests/s predicted to meet the SLO with this plan.", minimum=0),
                    "reason": string("Why the planner chose it.", max_length=1024),
                    "time": string("When the planner chose it.", fmt="date-time"),
                },
                "The planner's current plan, written by the controller (server-side apply, field manager "
                "flotilla-controller) in auto mode; the operator deploys it. Leave it out of your manifests. "
                "Ignored in fixed mode.",
                required=["prefillReplicas", "decodeReplicas"],
            ),
        },
        required=["slo", "workload", "prefill", "decode", "maxGPUs"],
        rules=[rule("!has(self.minGPUs) || self.minGPUs <= self.maxGPUs",
                    "spec.minGPUs must be <= spec.maxGPUs", ".minGPUs"),
               rule("(has(self.planner) && self.planner.mode == 'fixed') || has(self.profile)",
                    "spec.profile is required unless spec.planner.mode is fixed")],
    )
    status = obj(
        {
            "phase": string(enum=list(phases.SERVING)),
            "prefillReplicas": integer(minimum=0),
            "decodeReplicas": integer(minimum=0),
            "prefillGPUsPerInstance": integer(minimum=1),
            "decodeGPUsPerInstance": integer(minimum=1),
            "readyPrefill": integer(minimum=0),
            "readyDecode": integer(minimum=0),
            "gpus": integer(minimum=0),
            "ratio": string("prefill:decode, for kubectl get.", max_length=32),
            "observed": obj({
                "requestsPerSecond": number(minimum=0),
                "ttftP90Ms": number(minimum=0),
                "tpotP90Ms": number(minimum=0),
                "attainment": number(minimum=0, maximum=1),
            }, "The controller's latest load window (its flotilla.dev/observed annotation), mirrored."),
            "predictedGoodput": number("Requests/s predicted to meet the SLO with the current plan.", minimum=0),
            "lastPlan": obj({"time": string(fmt="date-time"), "reason": string(max_length=1024)},
                            "The time and reason of the plan deployed (spec.plan's in auto mode)."),
            "pool": obj({
                "grantedGPUs": integer("GPUs the unified pool grants now.", minimum=0),
                "demandedGPUs": integer("The plan's GPUs within minGPUs..maxGPUs, in whole instances.", minimum=0),
                "reason": string("Why the pool granted what it did.", max_length=1024),
                "belowSince": string("Since when demand has been below what the deployment holds (hold-down).",
                                     fmt="date-time"),
                "peakGPUs": integer("The highest demand within the forecast window: the forecast admission "
                                    "counts.", minimum=0),
                "peakAt": string("When that peak was first reached.", fmt="date-time"),
            }, "The unified GPU pool's decision for this deployment."),
            "borrowedFrom": array(obj({"job": string("namespace/name of the TrainingJob.", max_length=320),
                                       "gpus": integer(minimum=0)}, required=["job", "gpus"]),
                                  "GPUs TrainingJobs lent this deployment and have not got back.", max_items=256),
            "endpoint": string("Where clients send OpenAI API requests: the decode pool's Service (its pods "
                               "call a prefill pod first, as llm-d's routing sidecar does).", max_length=512),
            "inferencePool": string("The InferencePool that puts both pools behind a gateway (when the "
                                    "CRD is installed).", max_length=253),
            "message": string(max_length=1024),
            "queue": QUEUE_STATUS,
            "conditions": CONDITIONS,
            "observedGeneration": integer(minimum=0),
        }
    )
    return obj({"spec": spec, "status": status}, required=["spec"])


def _queue_schema() -> Schema:
    quota = obj(
        {
            "name": string("The resource: nvidia.com/gpu (GPU types may become resources of their own later).",
                           min_length=1, max_length=253),
            "nominal": integer("GPUs the queue is guaranteed: its jobs' deadlines are promised out of them.",
                               minimum=0),
            "borrowingLimit": integer("Most GPUs the queue may borrow beyond its nominal share from queues that "
                                      "lend them; unset: no limit.", minimum=0),
            "lendingLimit": integer("Most of its nominal GPUs the queue lends to others while it does not use "
                                    "them; unset: all of them.", minimum=0),
        },
        required=["name", "nominal"],
        rules=[rule("!has(self.lendingLimit) || self.lendingLimit <= self.nominal",
                    "spec.resources[].lendingLimit must be <= spec.resources[].nominal", ".lendingLimit")],
    )
    spec = obj(
        {
            "resources": array(quota, "Quotas per resource, keyed by name.", max_items=16,
                               list_type="map", list_map_keys=["name"]),
            "weight": number("Share of idle GPUs (what no guarantee needs) relative to other queues' weights.",
                             minimum=0, default=1),
            "parent": string("The queue above this one (a department above its teams); the children's nominal "
                             "shares fit inside the parent's.", min_length=1, max_length=253),
            "namespaces": array(string(min_length=1, max_length=63), "Namespaces whose jobs go to this queue "
                                "when they name none (spec.queue).", max_items=1024, list_type="set"),
        },
        required=["resources"],
    )
    status = obj(
        {
            "nominal": integer("GPUs guaranteed (spec, as the operator last read it).", minimum=0),
            "used": integer("GPUs its jobs and deployments hold now.", minimum=0),
            "borrowed": integer("GPUs used beyond the nominal share, lent by other queues.", minimum=0),
            "lent": integer("Nominal GPUs other queues use now.", minimum=0),
            "admitted": integer("Jobs and deployments admitted.", minimum=0),
            "pending": integer("Jobs waiting for admission.", minimum=0),
            "guaranteed": integer("GPUs promised to its jobs' deadlines now.", minimum=0),
            "conditions": CONDITIONS,
            "observedGeneration": integer(minimum=0),
        }
    )
    return obj({"spec": spec, "status": status}, required=["spec"],
               rules=[rule("!has(self.spec.parent) || self.spec.parent != self.metadata.name",
                           "spec.parent must not name the queue itself", ".spec.parent")])


def _crd(kind: str, plural: str, short: str | None, schema: Schema, columns: list[dict[str, Any]],
         scope: str = "Namespaced") -> dict[str, Any]:
    names: dict[str, Any] = {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()}
    if short:
        names["shortNames"] = [short]
    names["categories"] = [CATEGORY]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": scope,
            "names": names,
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": schema},
                "additionalPrinterColumns": columns,
            }],
        },
    }


def _col(name: str, path: str, type_: str = "string", description: str = "", priority: int = 0) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "type": type_, "jsonPath": path}
    if description:
        c["description"] = description
    if priority:
        c["priority"] = priority
    return c


def training_job_crd() -> dict[str, Any]:
    return _crd("TrainingJob", "trainingjobs", "tj", _training_job_schema(), [
        _col("Phase", ".status.phase"),
        _col("GPUs", ".status.gpus", "integer", "GPUs held now"),
        _col("Min", ".spec.elasticity.minGPUs", "integer", priority=1),
        _col("Max", ".spec.elasticity.maxGPUs", "integer", priority=1),
        _col("Steps", ".status.progress.steps", "integer", "steps done"),
        _col("Total", ".spec.totalSteps", "integer"),
        _col("Deadline", ".status.deadline", description="absolute deadline"),
        _col("ETA", ".status.estimatedCompletion", description="predicted completion"),
        _col("On-Time", ".status.deadlineMet", "boolean", "predicted to meet its deadline"),
        _col("Queue", ".status.queue", priority=1),
        _col("Message", ".status.message", priority=1),
        _col("Age", ".metadata.creationTimestamp", "date"),
    ])


def serving_deployment_crd() -> dict[str, Any]:
    return _crd("ServingDeployment", "servingdeployments", "sd", _serving_deployment_schema(), [
        _col("Phase", ".status.phase"),
        _col("P:D", ".status.ratio", description="prefill:decode instances"),
        _col("GPUs", ".status.gpus", "integer"),
        _col("Mode", ".spec.planner.mode"),
        _col("Granted", ".status.pool.grantedGPUs", "integer", "GPUs the unified pool grants", priority=1),
        _col("Attainment", ".status.observed.attainment", "number", "observed joint SLO attainment"),
        _col("Goodput", ".status.predictedGoodput", "number", "predicted requests/s within SLO", priority=1),
        _col("Plan", ".status.lastPlan.reason", priority=1),
        _col("Endpoint", ".status.endpoint", description="where clients send requests", priority=1),
        _col("Queue", ".status.queue", priority=1),
        _col("Age", ".metadata.creationTimestamp", "date"),
    ])


def queue_crd() -> dict[str, Any]:
    """Cluster-scoped; no short name (q would clash with other tools' kinds)."""
    return _crd("Queue", "queues", None, _queue_schema(), [
        _col("Nominal", ".status.nominal", "integer", "GPUs guaranteed"),
        _col("Used", ".status.used", "integer", "GPUs in use"),
        _col("Borrowed", ".status.borrowed", "integer", "GPUs borrowed from other queues"),
        _col("Lent", ".status.lent", "integer", "nominal GPUs other queues use"),
        _col("Admitted", ".status.admitted", "integer", "jobs and deployments admitted"),
        _col("Pending", ".status.pending", "integer", "jobs waiting for admission"),
        _col("Guaranteed", ".status.guaranteed", "integer", "GPUs promised to deadlines", priority=1),
        _col("Parent", ".spec.parent", priority=1),
        _col("Age", ".metadata.creationTimestamp", "date"),
    ], scope="Cluster")


CRDS = {
    "trainingjobs.flotilla.dev.yaml": training_job_crd,
    "servingdeployments.flotilla.dev.yaml": serving_deployment_crd,
    "queues.flotilla.dev.yaml": queue_crd,
}

HEADER = "# Generated by `flotilla crds --write crds/` from src/flotilla/resources/crds.py. Do not edit.\n"


def render(make: Callable[[], dict[str, Any]]) -> str:
    return HEADER + yaml.safe_dump(make(), sort_keys=False, width=120)


def write_all(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for filename, make in CRDS.items():
        path = directory / filename
        path.write_text(render(make))
        out.append(path)
    return out
