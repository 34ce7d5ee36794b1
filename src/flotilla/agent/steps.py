"""The step-time intake: training ranks report each step to the agent on their node over UDP.

The report format and the sender are `flotilla.worker.steps` (one JSON datagram
per step: job, rank, gpu, role, step_time, sync_step_time). The agent binds
`host:port` on the node (the chart runs it with hostNetwork and binds the node's
IP, which the operator gives worker pods as FLOTILLA_AGENT_HOST). Each report
becomes a `step_time` sample (and `sync_step_time` when given) carrying its job,
GPU, role and rank. A malformed report is dropped and counted (`rejected`), with
a warning for the first and then one a minute; so is a report from a sender outside `allow` (--step-allow),
when given.

The intake also tells the agent what runs on the node: `placement(gpu)` is the
(job, role) the reports of the last minute give for that GPU, so the agent can
stamp the node's GPU and host samples with them (GPU metrics of a pipeline's last
stage are then compared with other last stages).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import socket
from dataclasses import dataclass
from typing import Any, Sequence

from flotilla.health.samples import MAX_GPU_INDEX, MAX_RANK, MAX_ROLE_LENGTH, Sample
from flotilla.resources.names import DEFAULT_AGENT_PORT as DEFAULT_PORT

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_PORT", "JOB_TTL_S", "StepIntake", "StepReport", "parse_report"]

JOB_TTL_S = 60.0
WARN_EVERY_S = 60.0


@dataclass(frozen=True, slots=True)
class StepReport:
    job: str
    step_time: float
    rank: int | None = None
    gpu: int | None = None
    role: str | None = None
    sync_step_time: float | None = None


def _seconds(report: dict[str, Any], field: str) -> float | None:
    value = report.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"field {field!r} must be a finite number of seconds >= 0")
    return float(value)


def _index(report: dict[str, Any], field: str, maximum: int) -> int | None:
    value = report.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise ValueError(f"field {field!r} must be an integer from 0 to {maximum} or null")
    return value


def parse_report(data: bytes) -> StepReport:
    """One datagram -> a report; ValueError naming the field when it is not one."""
    try:
        report = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"not JSON ({e})") from None
    if not isinstance(report, dict):
        raise ValueError("a step report must be a JSON object")
    job, role = report.get("job"), report.get("role")
    if not isinstance(job, str) or not job:
        raise ValueError("field 'job' must be a non-empty string")
    if role is not None and (not isinstance(role, str) or not 0 < len(role) <= MAX_ROLE_LENGTH):
        raise ValueError(f"field 'role' must be a non-empty string of at most {MAX_ROLE_LENGTH} characters or null")
    step_time = _seconds(report, "step_time")
    if step_time is None:
        raise ValueError("field 'step_time' is missing")
    return StepReport(job, step_time, _index(report, "rank", MAX_RANK), _index(report, "gpu", MAX_GPU_INDEX), role,
                      _seconds(report, "sync_step_time"))


class StepIntake:
    name = "steps"

    def __init__(self, node: str, port: int = DEFAULT_PORT, host: str = "127.0.0.1",
                 allow: Sequence[str] = ()) -> None:
        """`allow`: CIDRs the reports may come from (e.g. the cluster's pod CIDR); empty: any sender."""
        self.node = node
        self.allow = [ipaddress.ip_network(cidr, strict=False) for cidr in allow]
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self._sock.bind((host, port))
        except OSError:
            self._sock.close()
            raise
        self._sock.setblocking(False)
        self.address = self._sock.getsockname()[:2]
        self.port = self.address[1]
        self.rejected = 0
        self._warned_rejected = 0
        self._warned_at = float("-inf")
        self._seen: dict[int | None, tuple[str, str | None, float]] = {}   # gpu -> (job, role, last report)

    @property
    def job(self) -> str | None:
        return self.placement(None)[0]

    def placement(self, gpu: int | None) -> tuple[str | None, str | None]:
        """(job, role) for a GPU of this node, from the reports of the last JOB_TTL_S seconds: that GPU's own
        reports, else (and for node-wide metrics, gpu None) the latest job reported on the node, with a role
        only when every recent report of that job on the node agrees on it."""
        if gpu is not None and gpu in self._seen:
            job, role, _ = self._seen[gpu]
            return job, role
        if not self._seen:
            return None, None
        job = max(self._seen.values(), key=lambda v: v[2])[0]
        roles = {role for j, role, _ in self._seen.values() if j == job}
        return job, roles.pop() if len(roles) == 1 else None

    def _reject(self, now: float, why: Exception) -> None:
        self.rejected += 1
        if self._warned_rejected == 0 or now - self._warned_at >= WARN_EVERY_S:
            log.warning("step report rejected (%d rejected so far): %s", self.rejected, why)
            self._warned_rejected, self._warned_at = self.rejected, now

    def collect(self, now: float) -> list[Sample]:
        out: list[Sample] = []
        while True:
            try:
                data, sender = self._sock.recvfrom(65536)
            except BlockingIOError:
                break
            try:
                if self.allow and not any(ipaddress.ip_address(sender[0]) in net for net in self.allow):
                    raise ValueError(f"sender {sender[0]} is not in the allowed networks")
                r = parse_report(data)
            except ValueError as e:
                self._reject(now, e)
                continue
            self._seen[r.gpu] = (r.job, r.role, now)
            out.append(Sample(now, self.node, "step_time", r.step_time, r.job, r.gpu, r.role, r.rank))
            if r.sync_step_time is not None:
                out.append(Sample(now, self.node, "sync_step_time", r.sync_step_time, r.job, r.gpu, r.role, r.rank))
        for gpu in [g for g, (_, _, seen) in self._seen.items() if now - seen > JOB_TTL_S]:
            del self._seen[gpu]
        return out

    def close(self) -> None:
        self._sock.close()
