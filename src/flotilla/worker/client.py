"""A worker's view of its TrainingJob, through the Kubernetes API (the pod's ServiceAccount
needs get and patch on trainingjobs in its namespace)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from flotilla import GROUP, VERSION
from flotilla.reshard import encoding as checkpoint
from flotilla.worker.steps import StepReporter

PLURAL = "trainingjobs"


@dataclass(frozen=True)
class WorkerIdentity:
    job: str
    namespace: str
    rank: int
    world_size: int
    generation: int
    job_uid: str = ""  # the TrainingJob's UID: a worker never writes to a newer job that took its job's name

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "WorkerIdentity":
        env = dict(os.environ if env is None else env)
        missing = [k for k in ("FLOTILLA_JOB", "FLOTILLA_NAMESPACE", "FLOTILLA_RANK", "FLOTILLA_WORLD_SIZE")
                   if k not in env]
        if missing:
            raise RuntimeError(f"not running as a Flotilla worker: {', '.join(missing)} not set")
        return cls(env["FLOTILLA_JOB"], env["FLOTILLA_NAMESPACE"], int(env["FLOTILLA_RANK"]),
                   int(env["FLOTILLA_WORLD_SIZE"]), int(env.get("FLOTILLA_GENERATION", "0")),
                   env.get("FLOTILLA_JOB_UID", ""))


@dataclass(frozen=True)
class CheckpointRequest:
    generation: int
    reason: str
    restart: bool


class JobClient:
    def __init__(self, identity: WorkerIdentity, api: Any = None, min_interval: float = 1.0,
                 clock: Callable[[], float] = time.time):
        if api is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api = client.CustomObjectsApi()
        self.identity = identity
        self._api = api
        self._min_interval = min_interval
        self._clock = clock
        self._last_report = float("-inf")
        self._last_poll = float("-inf")
        self._acked = 0
        self._steps: StepReporter | None = None   # None: not made yet (`_steps_made`), or no agent in the env
        self._steps_made = False
        self._role: str | None = None   # the rank's role as the framework knows it (flotilla.worker.torch)

    @classmethod
    def from_env(cls, **kwargs: Any) -> "JobClient":
        return cls(WorkerIdentity.from_env(), **kwargs)

    @property
    def rank(self) -> int:
        return self.identity.rank

    @property
    def world_size(self) -> int:
        return self.identity.world_size

    def report_step_time(self, step_time: float, sync_step_time: float | None = None) -> bool:
        """Every rank, every step: this rank's compute time (without collective waits) and, optionally, the wall
        time of the whole synchronous step, to the agent on this node (flotilla.worker.steps). Never raises or
        blocks; False when not sent (no agent named in the environment, or the datagram could not go)."""
        if not self._steps_made:
            self._steps, self._steps_made = StepReporter.from_env(), True
            if isinstance(self._steps, StepReporter) and self._role and not self._steps.role:
                self._steps.role = self._role
        return self._steps.report(step_time, sync_step_time) if self._steps else False

    def report_role(self, role: str) -> None:
        """The rank's role (`pp<stage>/<stages>`) as the framework knows it, sent with its step times unless the
        TrainingJob declares one (FLOTILLA_ROLE wins: it is what the operator stamps on the node's metrics)."""
        self._role = role
        if isinstance(self._steps, StepReporter) and not self._steps.role:
            self._steps.role = role

    def _patch_annotations(self, annotations: dict[str, str]) -> None:
        # With the job's UID in the patch the API server refuses it (uid is immutable) once the job is gone
        # and another took its name: an orphaned worker cannot report into the new job.
        meta: dict[str, Any] = {"annotations": annotations}
        if self.identity.job_uid:
            meta["uid"] = self.identity.job_uid
        self._api.patch_namespaced_custom_object(GROUP, VERSION, self.identity.namespace, PLURAL, self.identity.job,
                                                 {"metadata": meta})

    def report_progress(self, steps: int, steps_per_second: float, checkpoint_step: int | None = None,
                        force: bool = False, restore_seconds: float | None = None) -> bool:
        """Rank 0 reports; at most once per `min_interval` unless forced. True if sent. `restore_seconds`: what
        this worker set's start from an acknowledged checkpoint cost (the operator records it in status)."""
        now = self._clock()
        if not force and now - self._last_report < self._min_interval:
            return False
        self._patch_annotations(checkpoint.progress_annotation(steps, steps_per_second, now,
                                                               self.identity.generation, checkpoint_step,
                                                               restore_seconds))
        self._last_report = now
        return True

    def pending_checkpoint(self, force: bool = False) -> CheckpointRequest | None:
        """The checkpoint request not yet acknowledged, if any (polled at most once per `min_interval`)."""
        now = self._clock()
        if not force and now - self._last_poll < self._min_interval:
            return None
        self._last_poll = now
        body = self._api.get_namespaced_custom_object(GROUP, VERSION, self.identity.namespace, PLURAL,
                                                      self.identity.job)
        if self.identity.job_uid and body["metadata"].get("uid") != self.identity.job_uid:
            return None  # another job of the same name: its requests are not ours
        annotations = body["metadata"].get("annotations") or {}
        request, ack = checkpoint.parse_request(annotations), checkpoint.parse_ack(annotations)
        acked = max(self._acked, ack["generation"] if ack else 0,
                    int(((body.get("status") or {}).get("checkpoint") or {}).get("generation", 0)))
        if request and request["generation"] > acked:
            return CheckpointRequest(request["generation"], str(request.get("reason", "")),
                                     bool(request.get("restart", False)))
        return None

    def acknowledge(self, request: CheckpointRequest, step: int) -> None:
        """Rank 0: the checkpoint for `request` is written and complete at `step`."""
        self._patch_annotations(checkpoint.ack_annotation(request.generation, step, self._clock()))
        self._acked = request.generation
