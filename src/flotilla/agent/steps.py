"""The step-time intake: training workers report each step's compute time to the agent on their node.

Protocol: one UDP datagram per step to 127.0.0.1:PORT (default 9477), a JSON
object `{"job": "ns/name", "rank": 3, "gpu": 3, "step_time": 0.91}`; `gpu` is
the rank's local GPU index (optional), `step_time` the seconds the rank spent
computing the step, without waiting on collectives. UDP never blocks a worker
when the agent is down. `send_step_time` is the sender, for `flotilla.worker`.
The intake also tells the agent which job runs on its node (the latest job
reported in the last minute).
"""

from __future__ import annotations

import json
import logging
import math
import socket

from flotilla.health.samples import Sample

log = logging.getLogger(__name__)

DEFAULT_PORT = 9477
JOB_TTL_S = 60.0


def send_step_time(job: str, rank: int, step_time: float, gpu: int | None = None, port: int = DEFAULT_PORT) -> None:
    payload = {"job": job, "rank": rank, "gpu": gpu, "step_time": step_time}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(json.dumps(payload).encode(), ("127.0.0.1", port))


class StepIntake:
    name = "steps"

    def __init__(self, node: str, port: int = DEFAULT_PORT) -> None:
        self.node = node
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", port))
        self._sock.setblocking(False)
        self.port = self._sock.getsockname()[1]
        self._job: tuple[str, float] | None = None
        self.rejected = 0

    @property
    def job(self) -> str | None:
        return self._job[0] if self._job is not None else None

    def collect(self, now: float) -> list[Sample]:
        out: list[Sample] = []
        while True:
            try:
                data = self._sock.recv(65536)
            except BlockingIOError:
                break
            try:
                report = json.loads(data)
                job, step_time, gpu = report["job"], report["step_time"], report.get("gpu")
                if not isinstance(job, str) or not job:
                    raise ValueError("field 'job' must be a non-empty string")
                if isinstance(step_time, bool) or not isinstance(step_time, (int, float)) or not math.isfinite(step_time):
                    raise ValueError("field 'step_time' must be a finite number")
                if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int)):
                    raise ValueError("field 'gpu' must be an integer or null")
            except (ValueError, KeyError, TypeError) as e:
                self.rejected += 1
                log.warning("step report rejected: %s", e)
                continue
            self._job = (job, now)
            out.append(Sample(now, self.node, "step_time", float(step_time), job, gpu))
        if self._job is not None and now - self._job[1] > JOB_TTL_S:
            self._job = None
        return out

    def close(self) -> None:
        self._sock.close()
