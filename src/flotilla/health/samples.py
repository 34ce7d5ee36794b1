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

`Sample.from_dict` is the one validator of a sample, whatever its transport: the HTTP route's schema
(`controller/api.SampleIn`) is drawn from the same bounds, and a sample it lets through is checked here
again. The bounds are the controller database's columns, so that SQLite and PostgreSQL hold every
sample that passes (a 300-character node name is refused here, not by one database and not the other).

Transport encodings (both carry a JSON array of samples):
  * Redis Streams: XADD to stream `STREAM` with field `FIELD`, and `TOKEN_FIELD` (the agent's
    ServiceAccount token) where the controller checks who speaks for which node.
  * HTTP: POST /v1/ingest with body {"node": str, "samples": [...]}.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Iterable

STREAM = "flotilla:metrics"
FIELD = "samples"
TOKEN_FIELD = "token"
MAX_NODE_LENGTH = 253  # a Kubernetes node name
MAX_METRIC_LENGTH = 128
MAX_JOB_LENGTH = 512  # namespace/name
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
    def from_dict(cls, d: Any) -> "Sample":
        """The sample `d` describes; ValueError naming the field when it is not one."""
        if not isinstance(d, dict):
            raise ValueError("a sample must be a JSON object")
        if not FIELDS.issuperset(d):
            raise ValueError(f"sample has unknown field {sorted(str(k) for k in d.keys() - FIELDS)[0]!r}")
        try:
            ts, node, metric, value = d["ts"], d["node"], d["metric"], d["value"]
        except KeyError as e:
            raise ValueError(f"sample is missing field {e.args[0]!r}") from None
        _check_text("node", node, MAX_NODE_LENGTH)
        _check_text("metric", metric, MAX_METRIC_LENGTH)
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
            raise ValueError("sample field 'ts' must be a finite number of seconds")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"sample field 'value' must be a finite number (metric {metric!r})")
        job, gpu = d.get("job"), d.get("gpu")
        if job is not None:
            _check_text("job", job, MAX_JOB_LENGTH, empty=True)
        if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu <= MAX_GPU_INDEX):
            raise ValueError(f"sample field 'gpu' must be an integer from 0 to {MAX_GPU_INDEX} or null")
        role, rank = d.get("role"), d.get("rank")
        if role is not None:
            _check_text("role", role, MAX_ROLE_LENGTH)
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= MAX_RANK):
            raise ValueError(f"sample field 'rank' must be an integer from 0 to {MAX_RANK} or null")
        return cls(float(ts), node, metric, float(value), job, gpu, role, rank)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


FIELDS = frozenset(f.name for f in fields(Sample))


def _check_text(name: str, value: Any, max_length: int, empty: bool = False) -> None:
    """A string field: not empty (unless `empty`), at most `max_length` characters, no NUL (PostgreSQL's text
    types refuse it, SQLite's keep it)."""
    if not isinstance(value, str) or (not value and not empty) or len(value) > max_length or "\x00" in value:
        raise ValueError(f"sample field {name!r} must be a{'' if empty else ' non-empty'} string of at most "
                         f"{max_length} characters without NUL" + ("" if name in ("node", "metric") else " or null"))


def encode_batch(samples: Iterable[Sample]) -> str:
    return json.dumps([s.to_dict() for s in samples], separators=(",", ":"))


def decode_batch(data: str | bytes) -> list[Sample]:
    """Every sample of a batch; ValueError at the first that is not one."""
    return [Sample.from_dict(d) for d in _array(data)]


def split_batch(data: str | bytes) -> tuple[list[Sample], list[tuple[str, str]]]:
    """-> (the batch's valid samples, [(an invalid item as JSON, why)]), so that one bad sample does not cost
    the others; ValueError when `data` is no JSON array at all."""
    valid: list[Sample] = []
    invalid: list[tuple[str, str]] = []
    for item in _array(data):
        try:
            valid.append(Sample.from_dict(item))
        except ValueError as e:
            invalid.append((json.dumps(item, separators=(",", ":")), str(e)))
    return valid, invalid


def _array(data: str | bytes) -> list[Any]:
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"a sample batch must be JSON: {e}") from None
    if not isinstance(raw, list):
        raise ValueError("a sample batch must be a JSON array")
    return raw
