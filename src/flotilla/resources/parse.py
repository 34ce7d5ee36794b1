"""Reading fields of an object as the API server returns it (a dict, camelCase): each helper raises
ValueError naming the field when the value has the wrong type. The one home of RFC 3339 times, read and written."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any


def rfc3339(ts: float) -> str:
    """Unix seconds -> RFC 3339 as Kubernetes writes it: UTC, whole seconds, 'Z'."""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso(ts: float | None) -> str | None:
    """Unix seconds -> RFC 3339 with the fraction kept (UTC, 'Z'), as the controller's API answers; None stays None."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, timezone.utc).isoformat().replace("+00:00", "Z")


def to_datetime(value: str) -> datetime:
    """RFC 3339 -> datetime ('Z' read as UTC); raises ValueError."""
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def to_unix(value: str) -> float:
    """RFC 3339 -> Unix seconds; raises ValueError."""
    return to_datetime(value).timestamp()


def parse_time(value: Any, where: str) -> float | None:
    """RFC 3339 -> Unix seconds; None stays None."""
    if value is None:
        return None
    if isinstance(value, datetime):  # the kubernetes client deserialises some times
        return value.timestamp()
    if not isinstance(value, str):
        raise ValueError(f"{where} must be an RFC 3339 time, got {value!r}")
    seconds = _unix(value)
    if seconds is None:
        raise ValueError(f"{where} must be an RFC 3339 time with a time zone (e.g. 'Z'), got {value!r}")
    return seconds


@functools.lru_cache(maxsize=1 << 16)  # every pass reads every job's times again: most are the same strings
def _unix(value: str) -> float | None:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.timestamp() if parsed.tzinfo is not None else None


def mapping(obj: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    """obj[key] as a mapping; {} when absent or null."""
    value = obj.get(key)
    if value is None:
        return {}
    if type(value) is not dict and not isinstance(value, Mapping):  # dict first: the common case, and quick
        raise ValueError(f"{where}.{key} must be an object")
    return value


def integer(obj: Mapping[str, Any], key: str, where: str, default: int = 0) -> int:
    value = obj.get(key, default)
    if type(value) is int:
        return value
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}.{key} must be an integer, got {value!r}")
    return value


def optional_integer(obj: Mapping[str, Any], key: str, where: str) -> int | None:
    return integer(obj, key, where) if obj.get(key) is not None else None


def number(obj: Mapping[str, Any], key: str, where: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}.{key} must be a number, got {value!r}")
    return float(value)


def boolean(obj: Mapping[str, Any], key: str, where: str, default: bool | None = False) -> bool | None:
    value = obj.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"{where}.{key} must be a boolean")
    return value


def metadata(obj: Mapping[str, Any], namespaced: bool) -> tuple[str, str, Mapping[str, Any]]:
    """(namespace, name, metadata); the namespace is "default" when a namespaced object has none."""
    meta = mapping(obj, "metadata", "")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("metadata.name must be a non-empty string")
    namespace = meta.get("namespace") or ("default" if namespaced else "")
    if not isinstance(namespace, str):
        raise ValueError("metadata.namespace must be a string")
    return namespace, name, meta


def annotation_request(meta: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    """A request annotation: a JSON object with an integer "generation" (checkpoint and re-plan requests)."""
    raw = mapping(meta, "annotations", "metadata").get(key)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        raise ValueError(f"metadata.annotations[{key!r}] must be a JSON object") from None
    generation = value.get("generation") if isinstance(value, dict) else None
    if not isinstance(value, dict) or isinstance(generation, bool) or not isinstance(generation, int):
        raise ValueError(f"metadata.annotations[{key!r}] must be a JSON object with an integer 'generation'")
    return value


def conditions(status: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
    """status.conditions; entries that are not objects, or a value that is not a list, are skipped."""
    raw = status.get("conditions") or []
    if not isinstance(raw, list):
        return ()
    return tuple(c for c in raw if isinstance(c, dict | Mapping))  # dict first: the ABC's check is slow


def last_condition(found: tuple[Mapping[str, Any], ...]) -> str:
    """"Reason: message" of the newest condition (by lastTransitionTime), "" when there is none."""
    newest = max(found, key=lambda c: str(c.get("lastTransitionTime") or ""), default=None)
    if newest is None:
        return ""
    return f"{newest.get('reason') or newest.get('type', '')}: {newest.get('message') or ''}".strip(": ")


def keyed_gpus(status: Mapping[str, Any], key: str, other: str) -> dict[str, int]:
    """A list of {other: str, gpus: int} (status.placement, lentTo, borrowedFrom) -> {other: GPUs}, summed."""
    raw = status.get(key) or []
    if not isinstance(raw, list):
        raise ValueError(f"status.{key} must be a list")
    out: dict[str, int] = {}
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict | Mapping) or not isinstance(entry.get(other), str):
            raise ValueError(f"status.{key}[{i}].{other} must be a string")
        gpus = entry.get("gpus")
        if type(gpus) is not int:  # the slow path names the field
            gpus = integer(entry, "gpus", f"status.{key}[{i}]")
        out[entry[other]] = out.get(entry[other], 0) + gpus
    return out


def queue_name(spec: Mapping[str, Any]) -> str | None:
    """spec.queue of a TrainingJob or ServingDeployment; None when unset."""
    value = spec.get("queue")
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"spec.queue must be a string, got {value!r}")
    return value
