"""Step-time reports from a training rank to the Flotilla agent on its node (one UDP datagram per step).

The datagram is a JSON object

    {"job": "ns/name", "rank": 3, "gpu": 3, "role": "pp1/4",
     "step_time": 0.91, "sync_step_time": 1.02}

`step_time` is the seconds the rank computed this step, without waiting on
collectives (the per-rank signal the straggler detector compares within the
rank's role group); `sync_step_time` (optional) is the wall time of the whole
synchronous step, the same for every rank of the job since all wait for the
slowest: a job-level signal that localises nothing. `gpu` is the rank's GPU
index on the node, `role` its role in the job (`pp<stage>/<stages>`, see
flotilla.health.samples); both optional.

The operator gives every worker pod `FLOTILLA_AGENT_HOST` (the node's IP, from
the downward API) and `FLOTILLA_AGENT_PORT`; the agent (hostNetwork) listens
there. UDP never blocks the training loop and a lost datagram is one lost
sample; `StepReporter.report` never raises.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
from typing import Any, Mapping

from flotilla.resources import names

log = logging.getLogger(__name__)

DEFAULT_PORT = names.DEFAULT_AGENT_PORT


def encode_report(job: str, rank: int | None, step_time: float, *, gpu: int | None = None, role: str | None = None,
                  sync_step_time: float | None = None) -> bytes:
    report: dict[str, object] = {"job": job, "rank": rank, "gpu": gpu, "step_time": step_time}
    if role is not None:
        report["role"] = role
    if sync_step_time is not None:
        report["sync_step_time"] = sync_step_time
    return json.dumps(report, separators=(",", ":")).encode()


class StepReporter:
    """Sends this rank's step times to the agent on its node.

        reporter = StepReporter.from_env()    # None outside a Flotilla worker pod
        ...
        if reporter:
            reporter.report(compute_seconds, sync_step_time=step_wall_seconds)
    """

    def __init__(self, job: str, rank: int | None, host: str, port: int = DEFAULT_PORT, *, gpu: int | None = None,
                 role: str | None = None) -> None:
        self.job, self.rank, self.gpu, self.role = job, rank, gpu, role
        self.address = (host, port)
        self.sent = 0
        self.failed = 0
        # Resolved once here: a name (status.hostIP is always an address) must not cost a DNS lookup per step.
        self._target: tuple[Any, ...] | None
        try:
            family, _, _, _, self._target = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        except (OSError, UnicodeError) as e:
            log.warning("step times are not reported: cannot resolve the agent's address %s: %s", host, e)
            family, self._target = socket.AF_INET, None
        self._sock = socket.socket(family, socket.SOCK_DGRAM)
        self._sock.setblocking(False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "StepReporter | None":
        """From the env the operator gives worker pods: FLOTILLA_NAMESPACE, FLOTILLA_JOB, FLOTILLA_RANK,
        FLOTILLA_AGENT_HOST, FLOTILLA_AGENT_PORT and FLOTILLA_ROLE (when the job says its parallelism).
        A launcher that starts one process per GPU (torchrun) sets RANK and LOCAL_RANK: they give the
        process's global rank and its GPU. None (logged once) when the env does not name an agent."""
        env = os.environ if env is None else env
        host = env.get(names.ENV_AGENT_HOST)
        if not host or not env.get("FLOTILLA_JOB"):
            log.info("no FLOTILLA_AGENT_HOST/FLOTILLA_JOB in the environment: step times are not reported")
            return None
        try:
            port = int(env.get(names.ENV_AGENT_PORT) or DEFAULT_PORT)
            rank_text = env.get("RANK") or env.get("FLOTILLA_RANK")
            rank = int(rank_text) if rank_text else None
            local = env.get("LOCAL_RANK")
            gpu = int(local) if local else None
        except ValueError as e:
            log.warning("step times are not reported: bad worker environment (%s)", e)
            return None
        job = f"{env['FLOTILLA_NAMESPACE']}/{env['FLOTILLA_JOB']}" if env.get("FLOTILLA_NAMESPACE") \
            else env["FLOTILLA_JOB"]
        return cls(job, rank, host, port, gpu=gpu, role=env.get(names.ENV_ROLE) or None)

    def report(self, step_time: float, sync_step_time: float | None = None) -> bool:
        """Send one step's compute time (and the synchronous step's wall time). Never raises, never blocks:
        False when the report was not sent (a bad number, a full socket buffer, no route)."""
        try:
            if not math.isfinite(step_time) or step_time < 0 or (
                    sync_step_time is not None and (not math.isfinite(sync_step_time) or sync_step_time < 0)):
                raise ValueError(f"step times must be finite and >= 0, got {step_time!r}, {sync_step_time!r}")
            if self._target is None:
                raise OSError("the agent's address did not resolve")
            self._sock.sendto(encode_report(self.job, self.rank, float(step_time), gpu=self.gpu, role=self.role,
                                            sync_step_time=None if sync_step_time is None else float(sync_step_time)),
                              self._target)
        except (OSError, ValueError, TypeError) as e:
            self.failed += 1
            if self.failed == 1 or self.failed % 1000 == 0:
                log.warning("step time not sent to the agent at %s:%d (%d so far): %s", *self.address, self.failed, e)
            return False
        self.sent += 1
        return True

    def close(self) -> None:
        self._sock.close()
