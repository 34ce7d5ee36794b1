"""The latency profile of one model on one kind of GPU: the contract of `ServingDeployment.spec.profile`.

A profile is either a reference to a shipped profile, `{"name": "opt-13b-a100"}`, or inline
coefficients (the `name` is then only a label):

    {"name": "my-model-h100",                       # optional label
     "prefill": [{"gpus": 1, "constantMs": 16.5, "perTokenMs": 0.0926, "perTokenSquaredMs": 6.5e-6,
                  "maxBatchTokens": 4096}],
     "decode":  [{"gpus": 1, "constantMs": 19.9, "perRequestMs": 0.0385, "perContextTokenMs": 0.000627,
                  "kvCacheTokens": 66144, "maxBatchSize": 256, "maxBatchTokens": 50000}],
     "chunkedPrefill": true,                       # optional: colocated engines chunk prompts (vLLM's default)
     "provenance": "where the numbers come from"}

Engine limits the planner honours (its analytical model and its check, flotilla.serving.check):
prefill `maxBatchTokens` (prompt tokens in one batch), decode `kvCacheTokens` (KV capacity),
`maxBatchSize` (requests in a decode batch) and `maxBatchTokens` (context tokens one decode batch
may hold; the KV capacity when absent), and `chunkedPrefill` (colocated instances: prompts run in
chunks beside the decode batch, or first, alone, while decode waits). Profiles written before these
fields existed stay valid: absent means the defaults below.

One entry per tensor-parallel degree (`gpus` GPUs per instance). The formulas are in
`flotilla.serving.latency`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

DEFAULT_MAX_BATCH_TOKENS = 4096
DEFAULT_MAX_BATCH_SIZE = 256


class ProfileError(ValueError):
    """A profile that cannot be used; the message names the offending field."""


@dataclass(frozen=True)
class PrefillFit:
    """Prefill time of one batch, per tensor-parallel degree:
    t_ms = constantMs + perTokenMs * sum(l) + perTokenSquaredMs * sum(l^2) over the batch's prompt lengths l
    (the square term is attention's cost, quadratic in each prompt's length)."""

    gpus: int
    constant_ms: float
    per_token_ms: float
    per_token_squared_ms: float
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS

    def batch_ms(self, prompt_lengths: list[int] | tuple[int, ...]) -> float:
        total = sum(prompt_lengths)
        squares = sum(length * length for length in prompt_lengths)
        return self.constant_ms + self.per_token_ms * total + self.per_token_squared_ms * squares


@dataclass(frozen=True)
class DecodeFit:
    """Time of one decode step (one token for every request in the batch), per tensor-parallel degree:
    t_ms = constantMs + perRequestMs * batch + perContextTokenMs * context, context being the batch's
    total KV-cache tokens. A batch is limited by `kvCacheTokens` (memory) and `maxBatchSize`."""

    gpus: int
    constant_ms: float
    per_request_ms: float
    per_context_token_ms: float
    kv_cache_tokens: int
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    max_batch_tokens: int | None = None  # context tokens one iteration runs; None: kv_cache_tokens
    # A second piece of the fit for batches of at least large_batch_from requests (DistServe publishes its
    # decode fits in two pieces, split at 95); None: one piece for every batch.
    large_batch_from: int | None = None
    large_batch_constant_ms: float | None = None
    large_batch_per_request_ms: float | None = None
    large_batch_per_context_token_ms: float | None = None

    @property
    def batch_token_cap(self) -> int:
        return min(self.max_batch_tokens or self.kv_cache_tokens, self.kv_cache_tokens)

    def _piece(self, batch: float) -> tuple[float, float, float]:
        """(constant, per request, per context token) ms of the piece that prices a batch of this size."""
        if (self.large_batch_from is not None and batch >= self.large_batch_from
                and self.large_batch_constant_ms is not None and self.large_batch_per_request_ms is not None
                and self.large_batch_per_context_token_ms is not None):
            return self.large_batch_constant_ms, self.large_batch_per_request_ms, self.large_batch_per_context_token_ms
        return self.constant_ms, self.per_request_ms, self.per_context_token_ms

    def pieces(self) -> tuple[tuple[float, float, float], float, tuple[float, float, float]]:
        """(small-batch piece, the batch size from which the large-batch piece prices, that piece): _piece's
        choice taken apart once, for a loop that prices many steps (the size is infinite without a second piece)."""
        small, large = self._piece(0.0), self._piece(math.inf)
        return small, (math.inf if large == small else float(self.large_batch_from or 0)), large

    def constant_at(self, batch: float) -> float:
        return self._piece(batch)[0]

    def step_ms(self, batch: float, context_tokens: float) -> float:
        constant, per_request, per_token = self._piece(batch)
        return constant + per_request * batch + per_token * context_tokens


@dataclass(frozen=True)
class Profile:
    name: str
    prefill: tuple[PrefillFit, ...]
    decode: tuple[DecodeFit, ...]
    provenance: str = ""
    chunked_prefill: bool = True  # colocated instances chunk prompts beside the decode batch
    # (kind, gpus, worst measured relative error of the predicted goodput): flotilla.serving.validation.
    # Known for shipped profiles only; not part of the coefficients (nor of to_dict / equality).
    prediction_errors: tuple[tuple[str, int, float], ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        for field, fits in (("prefill", self.prefill), ("decode", self.decode)):
            if not fits:
                raise ProfileError(f"profile.{field}: at least one entry is required")
            degrees = [fit.gpus for fit in fits]
            if len(set(degrees)) != len(degrees):
                raise ProfileError(f"profile.{field}: gpus values must be unique, got {degrees}")

    @property
    def errors(self) -> dict[tuple[str, int], float]:
        return {(kind, gpus): error for kind, gpus, error in self.prediction_errors}

    def prefill_fit(self, gpus: int) -> PrefillFit:
        for fit in self.prefill:
            if fit.gpus == gpus:
                return fit
        raise ProfileError(f"profile {self.name!r} has no prefill entry for gpus={gpus}")

    def decode_fit(self, gpus: int) -> DecodeFit:
        for fit in self.decode:
            if fit.gpus == gpus:
                return fit
        raise ProfileError(f"profile {self.name!r} has no decode entry for gpus={gpus}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Profile:
        """Inline coefficients in the CRD's camelCase form (see the module docstring)."""
        _require_mapping(data, "profile")
        _reject_unknown(data, "profile", {"name", "prefill", "decode", "provenance", "chunkedPrefill"})
        chunked = data.get("chunkedPrefill", True)
        if not isinstance(chunked, bool):
            raise ProfileError(f"profile.chunkedPrefill: must be true or false, got {chunked!r}")
        for field in ("prefill", "decode"):
            if field not in data:
                raise ProfileError(f"profile.{field}: required (or give only a shipped profile name)")
            if not isinstance(data[field], list):
                raise ProfileError(f"profile.{field}: must be a list, got {type(data[field]).__name__}")
        prefill = tuple(_prefill_from_dict(item, f"profile.prefill[{i}]") for i, item in enumerate(data["prefill"]))
        decode = tuple(_decode_from_dict(item, f"profile.decode[{i}]") for i, item in enumerate(data["decode"]))
        return cls(name=_string(data, "name", "profile", "inline"), prefill=prefill, decode=decode,
                   provenance=_string(data, "provenance", "profile", ""), chunked_prefill=chunked)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "provenance": self.provenance,
            "chunkedPrefill": self.chunked_prefill,
            "prefill": [{"gpus": f.gpus, "constantMs": f.constant_ms, "perTokenMs": f.per_token_ms,
                         "perTokenSquaredMs": f.per_token_squared_ms, "maxBatchTokens": f.max_batch_tokens}
                        for f in self.prefill],
            "decode": [{"gpus": f.gpus, "constantMs": f.constant_ms, "perRequestMs": f.per_request_ms,
                        "perContextTokenMs": f.per_context_token_ms, "kvCacheTokens": f.kv_cache_tokens,
                        "maxBatchSize": f.max_batch_size,
                        **({"maxBatchTokens": f.max_batch_tokens} if f.max_batch_tokens else {}),
                        **({"largeBatchFrom": f.large_batch_from, "largeBatchConstantMs": f.large_batch_constant_ms,
                            "largeBatchPerRequestMs": f.large_batch_per_request_ms,
                            "largeBatchPerContextTokenMs": f.large_batch_per_context_token_ms}
                           if f.large_batch_from is not None else {})}
                       for f in self.decode],
        }


def resolve_profile(spec_profile: Mapping[str, Any]) -> Profile:
    """`spec.profile` -> Profile: inline coefficients when given, else the shipped profile named."""
    from flotilla.serving.shipped_profiles import SHIPPED_PROFILES  # imports this module: load late

    _require_mapping(spec_profile, "profile")
    if "prefill" in spec_profile or "decode" in spec_profile:
        return Profile.from_dict(spec_profile)
    if "name" not in spec_profile:
        raise ProfileError("profile: give a shipped profile name or inline prefill and decode coefficients")
    _reject_unknown(spec_profile, "profile", {"name", "provenance"})
    name = _string(spec_profile, "name", "profile", "")
    if name not in SHIPPED_PROFILES:
        raise ProfileError(f"profile.name: unknown profile {name!r}; shipped: {', '.join(sorted(SHIPPED_PROFILES))}")
    return SHIPPED_PROFILES[name]


# Fields per list entry: camelCase key -> (dataclass field, kind, required).
_PREFILL_FIELDS = {
    "gpus": ("gpus", "gpus", True),
    "constantMs": ("constant_ms", "number", True),
    "perTokenMs": ("per_token_ms", "number", True),
    "perTokenSquaredMs": ("per_token_squared_ms", "number", True),
    "maxBatchTokens": ("max_batch_tokens", "count", False),
}
_DECODE_FIELDS = {
    "gpus": ("gpus", "gpus", True),
    "constantMs": ("constant_ms", "number", True),
    "perRequestMs": ("per_request_ms", "number", True),
    "perContextTokenMs": ("per_context_token_ms", "number", True),
    "kvCacheTokens": ("kv_cache_tokens", "count", True),
    "maxBatchSize": ("max_batch_size", "count", False),
    "maxBatchTokens": ("max_batch_tokens", "count", False),
    "largeBatchFrom": ("large_batch_from", "count", False),
    "largeBatchConstantMs": ("large_batch_constant_ms", "number", False),
    "largeBatchPerRequestMs": ("large_batch_per_request_ms", "number", False),
    "largeBatchPerContextTokenMs": ("large_batch_per_context_token_ms", "number", False),
}
_LARGE_BATCH = ("largeBatchFrom", "largeBatchConstantMs", "largeBatchPerRequestMs", "largeBatchPerContextTokenMs")


def _prefill_from_dict(item: Any, where: str) -> PrefillFit:
    fit = PrefillFit(**_fields(item, where, _PREFILL_FIELDS))
    if fit.batch_ms([1]) <= 0:
        raise ProfileError(f"{where}: a one-token prefill must take positive time")
    return fit


def _decode_from_dict(item: Any, where: str) -> DecodeFit:
    fields = _fields(item, where, _DECODE_FIELDS)
    given = [key for key in _LARGE_BATCH if key in item]
    if given and len(given) < len(_LARGE_BATCH):
        missing = next(key for key in _LARGE_BATCH if key not in item)
        raise ProfileError(f"{where}.{missing}: required with {given[0]} (the large-batch piece is all four or none)")
    fit = DecodeFit(**fields)
    if fit.step_ms(1, 1) <= 0:
        raise ProfileError(f"{where}: a decode step must take positive time")
    return fit


def _fields(item: Any, where: str, spec: dict[str, tuple[str, str, bool]]) -> dict[str, Any]:
    _require_mapping(item, where)
    _reject_unknown(item, where, set(spec))
    out: dict[str, Any] = {}
    for key, (attr, kind, required) in spec.items():
        if key not in item:
            if required:
                raise ProfileError(f"{where}.{key}: required")
            continue
        value = item[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProfileError(f"{where}.{key}: must be a number, got {value!r}")
        if kind == "number":
            if value < 0:
                raise ProfileError(f"{where}.{key}: must be >= 0, got {value!r}")
            out[attr] = float(value)
        else:
            if int(value) != value or value < 1:
                raise ProfileError(f"{where}.{key}: must be a positive integer, got {value!r}")
            out[attr] = int(value)
    return out


def _require_mapping(data: Any, where: str) -> None:
    if not isinstance(data, Mapping):
        raise ProfileError(f"{where}: must be an object, got {type(data).__name__}")


def _reject_unknown(data: Mapping[str, Any], where: str, known: set[str]) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise ProfileError(f"{where}.{unknown[0]}: unknown field (known: {', '.join(sorted(known))})")


def _string(data: Mapping[str, Any], key: str, where: str, default: str) -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise ProfileError(f"{where}.{key}: must be a string, got {value!r}")
    return value


def _entry_schema(fields: dict[str, tuple[str, str, bool]], descriptions: dict[str, str]) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    for key, (_, kind, _) in fields.items():
        if kind == "number":
            properties[key] = {"type": "number", "minimum": 0}
        else:
            properties[key] = {"type": "integer", "minimum": 1}
        properties[key]["description"] = descriptions[key]
    return {
        "type": "object",
        "required": [key for key, (_, _, required) in fields.items() if required],
        "properties": properties,
    }


# Kubernetes structural OpenAPI v3 schema of ServingDeployment.spec.profile.
OPENAPI_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Latency profile of the model on its GPUs: the name of a shipped profile, "
                   "or inline prefill and decode coefficients (one entry per GPUs-per-instance).",
    "properties": {
        "name": {"type": "string", "minLength": 1,
                 "description": "A shipped profile (e.g. opt-13b-a100) when no coefficients are given; "
                                "otherwise a label."},
        "provenance": {"type": "string", "description": "Where the coefficients come from."},
        "prefill": {
            "type": "array", "minItems": 1,
            "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["gpus"],
            "items": _entry_schema(_PREFILL_FIELDS, {
                "gpus": "GPUs per prefill instance (tensor-parallel degree).",
                "constantMs": "Fixed cost of one prefill batch, ms.",
                "perTokenMs": "ms per prompt token in the batch.",
                "perTokenSquaredMs": "ms per squared prompt length (attention), summed over the batch.",
                "maxBatchTokens": f"Most prompt tokens in one prefill batch (default {DEFAULT_MAX_BATCH_TOKENS}).",
            }),
        },
        "decode": {
            "type": "array", "minItems": 1,
            "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["gpus"],
            "items": _entry_schema(_DECODE_FIELDS, {
                "gpus": "GPUs per decode instance (tensor-parallel degree).",
                "constantMs": "Fixed cost of one decode step, ms.",
                "perRequestMs": "ms per request in the batch, per step.",
                "perContextTokenMs": "ms per KV-cache token in the batch, per step.",
                "kvCacheTokens": "KV-cache capacity of one instance, tokens.",
                "maxBatchSize": f"Most requests in one decode batch (default {DEFAULT_MAX_BATCH_SIZE}).",
                "maxBatchTokens": "Most context tokens one decode iteration runs; more admitted take turns "
                                  "(default: kvCacheTokens).",
                "largeBatchFrom": "Batch size from which the large-batch piece of the step fit applies.",
                "largeBatchConstantMs": "Large-batch piece: fixed cost of one decode step, ms.",
                "largeBatchPerRequestMs": "Large-batch piece: ms per request in the batch, per step.",
                "largeBatchPerContextTokenMs": "Large-batch piece: ms per KV-cache token in the batch, per step.",
            }),
        },
        "chunkedPrefill": {"type": "boolean",
                           "description": "Colocated engines run prompts in chunks beside the decode batch "
                                          "(vLLM's default, true) or first and alone (false)."},
    },
    "x-kubernetes-validations": [
        {"rule": "has(self.name) || (has(self.prefill) && has(self.decode))",
         "message": "profile needs a shipped profile name or inline prefill and decode coefficients"},
        {"rule": "has(self.prefill) == has(self.decode)",
         "message": "profile: inline coefficients need both prefill and decode"},
    ],
}
