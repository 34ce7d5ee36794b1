"""Labels, annotations, condition types and Event reasons: one place for every name."""

import hashlib
import re

from flotilla import GROUP

# Labels on the objects Flotilla creates.
LABEL_JOB = f"{GROUP}/job"
LABEL_JOB_UID = f"{GROUP}/job-uid"  # for selectors; what owns a pod is its controller ownerReference
LABEL_ROLE = f"{GROUP}/role"  # worker | prefill | decode
LABEL_GENERATION = f"{GROUP}/generation"  # a TrainingJob's worker set; bumped at each reshard
LABEL_RANK = f"{GROUP}/rank"  # a worker pod's global rank
LABEL_STAGE = f"{GROUP}/stage"  # its pipeline stage, when the TrainingJob's spec.parallelism says the stages
LABEL_SERVING = f"{GROUP}/serving"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "flotilla"
# On serving pods, for the ecosystem's routers: llm-d's role label (its P/D scheduler splits an
# InferencePool's pods by it: prefill | decode) and its marker of inference-serving pods.
LABEL_LLMD_ROLE = "llm-d.ai/role"
LABEL_LLMD_INFERENCE_SERVING = "llm-d.ai/inference-serving"

ROLE_WORKER = "worker"
ROLE_PREFILL = "prefill"
ROLE_DECODE = "decode"

# Env given to every worker pod for its step-time reports (flotilla.worker.steps).
ENV_AGENT_HOST = "FLOTILLA_AGENT_HOST"  # the node's IP (downward API status.hostIP): the agent binds it
ENV_AGENT_PORT = "FLOTILLA_AGENT_PORT"
ENV_ROLE = "FLOTILLA_ROLE"  # "pp<stage>/<stages>", when spec.parallelism says the stages
DEFAULT_AGENT_PORT = 9477
OPERATOR_METRICS_PORT = 8082  # the operator's /metrics, beside its liveness endpoint's 8081 (the controller serves 8080)

# Annotations.
ANNOTATION_CHECKPOINT_REQUEST = f"{GROUP}/checkpoint-request"  # JSON, see design.md
ANNOTATION_CHECKPOINT_ACK = f"{GROUP}/checkpoint-ack"  # JSON {"generation", "step", "time"}, written by rank 0
# JSON {"steps", "stepsPerSecond", "time", "generation", "checkpointStep"}, written by rank 0.
ANNOTATION_PROGRESS = f"{GROUP}/progress"

# On a serving Deployment: the replicas the operator set; a different spec.replicas is a hand edit.
ANNOTATION_PLANNED_REPLICAS = f"{GROUP}/planned-replicas"
# On a ServingDeployment: the controller's latest observed load window (JSON, see docs/serving.md),
# server-side applied by the controller; the operator mirrors it into status.observed.
ANNOTATION_OBSERVED = f"{GROUP}/observed"
# On a ServingDeployment: a request to the controller to re-plan now (JSON {"generation", "time", ...}).
ANNOTATION_REPLAN_REQUEST = f"{GROUP}/replan-request"

# Endpoints: the Gateway API Inference Extension's InferencePool (installed CRD, optional).
INFERENCE_POOL_GROUP = "inference.networking.k8s.io"
INFERENCE_POOL_VERSION = "v1"
INFERENCE_POOL_PLURAL = "inferencepools"
ENGINE_PORT = 8000  # vLLM's default HTTP port: OpenAI API and /metrics
ENDPOINT_PICKER_PORT = 9002  # the inference extension's endpoint picker (ext-proc gRPC) default port


def service_name(serving: str, role: str) -> str:
    """The Service of one role's pool of a ServingDeployment: `<name>-<role>`, made a DNS-1035 label (Service
    names are; a ServingDeployment's may hold dots or start with a digit, and be longer than 63)."""
    base = re.sub(r"[^a-z0-9-]", "-", serving.lower())
    if not base[:1].isalpha():
        base = f"s{base}"
    name = f"{base}-{role}"
    if len(name) <= 63 and name == f"{serving}-{role}":
        return name
    digest = hashlib.sha256(serving.encode()).hexdigest()[:8]
    return f"{base[:62 - len(role) - 9].rstrip('-')}-{digest}-{role}"


# Node health.
NODE_CONDITION_HEALTHY = "FlotillaGPUHealthy"
TAINT_UNHEALTHY = f"{GROUP}/unhealthy"
# Single GPUs out of service for a device-local fault (the node keeps serving on its others): on the Node, a JSON
# object {"<gpu index>": "<why>"} written by the controller; the condition True while any GPU is out.
ANNOTATION_UNHEALTHY_GPUS = f"{GROUP}/unhealthy-gpus"
NODE_CONDITION_GPUS_OUT = "FlotillaGPUsOutOfService"
# On a worker pod: the node's GPU indices the operator gave it (comma-separated), so that a fault of one GPU
# finds the pods on it; also in the pod's env as FLOTILLA_GPU_INDICES.
ANNOTATION_GPU_INDICES = f"{GROUP}/gpu-indices"
ENV_GPU_INDICES = "FLOTILLA_GPU_INDICES"

GPU_RESOURCE = "nvidia.com/gpu"

# Condition types.
COND_ADMITTED = "Admitted"
COND_READY = "Ready"
COND_DEADLINE_AT_RISK = "DeadlineAtRisk"
COND_SLO_AT_RISK = "SLOAtRisk"
COND_QUEUE = "QueueResolved"  # on a TrainingJob or ServingDeployment: the queue it counts against exists
COND_VALID = "Valid"  # on a Queue: its spec, and its place in the tree, are sound
COND_BORROWING = "Borrowing"  # on a Queue: it uses GPUs beyond its nominal share
COND_LENDING = "Lending"  # on a Queue: other queues use some of its nominal GPUs


class Reason:
    """Event and condition reasons (CamelCase, as Kubernetes users expect)."""

    ADMITTED = "Admitted"
    # Admitted without a deadline guarantee (spec.bestEffort, its deadline could not be promised): it runs on GPUs
    # no guarantee needs, and is the first to give them back, through a checkpoint.
    BEST_EFFORT = "BestEffort"
    REJECTED = "Rejected"
    PLACED = "Placed"
    RESHARDING = "Resharding"
    WORKERS_RUNNING = "WorkersRunning"
    SUCCEEDED = "Succeeded"
    WORKER_FAILED = "WorkerFailed"
    CHECKPOINT_REQUESTED = "CheckpointRequested"
    CHECKPOINT_WRITTEN = "CheckpointWritten"
    RESTART_FROM_CHECKPOINT = "RestartFromCheckpoint"
    CREATE_FAILED = "CreateFailed"
    POD_NAME_CONFLICT = "PodNameConflict"  # a pod the operator would create exists and is another owner's
    INVALID_SPEC = "InvalidSpec"
    DEADLINE_AT_RISK = "DeadlineAtRisk"
    ON_TRACK = "OnTrack"
    DEPLOYMENTS_SYNCED = "DeploymentsSynced"
    SCALED = "Scaled"
    REPLICAS_REVERTED = "ReplicasReverted"
    AVAILABLE = "Available"
    PROGRESSING = "Progressing"
    SLO_AT_RISK = "SLOAtRisk"
    SLO_MET = "SLOMet"
    BORROWED_GPUS = "BorrowedGPUs"  # a ServingDeployment took GPUs a TrainingJob lent it
    RETURNED_GPUS = "ReturnedGPUs"
    LENT_GPUS = "LentGPUs"  # a TrainingJob shrank to lend GPUs to serving
    GOT_GPUS_BACK = "GotGPUsBack"
    NO_PLAN = "NoPlan"  # the PD planner found no plan for the spec
    OVER_BUDGET = "OverBudget"  # the plan needs more than spec.maxGPUs
    GPU_HEALTHY = "GPUHealthy"  # on a Node: the controller's health verdict
    GPU_UNHEALTHY = "GPUUnhealthy"
    GPU_OUT_OF_SERVICE = "GPUOutOfService"  # on a Node: one GPU out for a device-local fault, the node kept
    GPU_IN_SERVICE = "GPUInService"
    INGEST_STALLED = "IngestStalled"  # on the controller's Pod: the metric pipeline delivers nothing
    INGEST_RESUMED = "IngestResumed"
    CONTROLLER_STALLED = "ControllerStalled"
    # Teams (queues).
    QUEUE_RESOLVED = "QueueResolved"
    QUEUE_NOT_FOUND = "QueueNotFound"  # the job names a Queue that does not exist: not admitted
    QUEUE_INVALID = "QueueInvalid"  # its Queue's spec is malformed: not admitted
    QUEUE_VALID = "QueueValid"
    RECLAIMED = "Reclaimed"  # a borrower gives GPUs back to the queue that lent them, through a checkpoint
    RECLAIM_STOPS = "ReclaimStops"  # a borrower with no checkpoint is stopped to give GPUs back: it loses progress
    WITHIN_SHARE = "WithinShare"


# Every reason above: an Event with any other reason is refused (flotilla.operator.events).
REASONS = frozenset(v for k, v in vars(Reason).items() if k.isupper() and isinstance(v, str))
