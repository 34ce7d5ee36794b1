"""The metric sample: one number from one node at one time.

This is the unit everything exchanges: agents publish batches of samples, the
controller ingests them, the detectors read them, and `flotilla detect` reads
and writes them as JSON lines. One sample is

    {"ts": 1700000000.0, "node": "gpu-0", "job": "default/llama" | null,
     "gpu": 0 | null, "metric": "gpu_util", "value": 97.0,
     "role": "pp1/4" | null, "rank": 12 | null}

`role` (optional) is the machine's role within its job (`pp<stage>/<stages>`, with `,tp<i>` / `,dp<i>`
appended where known): machines with equal (job, role) do the same work and are compared with each other.
`rank` (optional) is the worker's global rank, on per-rank metrics such as `step_time`.

Transport encodings (both carry a JSON array of samples):
  * Redis Streams: XADD to stream `STREAM` with field `FIELD`, and `TOKEN_FIELD` (the agent's
    ServiceAccount token) where the controller checks who speaks for which node.
  * HTTP: POST /v1/ingest with body {"node": str, "samples": [...]}.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any, Iterable

STREAM = "flotilla:metrics"
FIELD = "samples"
TOKEN_FIELD = "token"
MAX_GPU_INDEX = 65_535  # a device index; bounded so that every database's integer column holds it
MAX_ROLE_LENGTH = 63
MAX_RANK = 2**31 - 1  # bounded, as a GPU index is, so that every database's integer column holds it


@dataclass(frozen=True, slots=True)
class Sample:
    ts: float
    node: str
    metric: str
    value: float
    job: str | None = None
    gpu: int | None = None
    role: str | None = None   # opaque role within the job, e.g. "pp1/4"; machines with equal (job, role) are peers
    rank: int | None = None   # the worker's global rank, for per-rank metrics (step_time)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Sample":
        try:
            ts, node, metric, value = d["ts"], d["node"], d["metric"], d["value"]
        except KeyError as e:
            raise ValueError(f"sample is missing field {e.args[0]!r}") from None
        if not isinstance(node, str) or not node:
            raise ValueError("sample field 'node' must be a non-empty string")
        if not isinstance(metric, str) or not metric:
            raise ValueError("sample field 'metric' must be a non-empty string")
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
            raise ValueError("sample field 'ts' must be a finite number of seconds")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"sample field 'value' must be a finite number (metric {metric!r})")
        job, gpu = d.get("job"), d.get("gpu")
        if job is not None and not isinstance(job, str):
            raise ValueError("sample field 'job' must be a string or null")
        if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu <= MAX_GPU_INDEX):
            raise ValueError(f"sample field 'gpu' must be an integer from 0 to {MAX_GPU_INDEX} or null")
        role, rank = d.get("role"), d.get("rank")
        if role is not None and (not isinstance(role, str) or not 0 < len(role) <= MAX_ROLE_LENGTH):
            raise ValueError(f"sample field 'role' must be a non-empty string of at most {MAX_ROLE_LENGTH} "
                             "characters or null")
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= MAX_RANK):
            raise ValueError(f"sample field 'rank' must be an integer from 0 to {MAX_RANK} or null")
        return cls(float(ts), node, metric, float(value), job, gpu, role, rank)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def encode_batch(samples: Iterable[Sample]) -> str:
    return json.dumps([s.to_dict() for s in samples], separators=(",", ":"))


def decode_batch(data: str | bytes) -> list[Sample]:
    raw = json.loads(data)
    if not isinstance(raw, list):
        raise ValueError("a sample batch must be a JSON array")
    return [Sample.from_dict(d) for d in raw]
