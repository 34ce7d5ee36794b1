"""Kubernetes Events, correlated the way client-go's EventCorrelator does it. Pure.

What to send for one occurrence of an Event, given the ones sent before:

* the same (object UID, type, reason, message) again within the window is one Event whose
  `count` and `lastTimestamp` go up (a `Bump`), not a new object;
* more than `max_similar` different messages for the same (object, type, reason) within the window
  become one Event, "(combined from similar events): <latest message>" (client-go's aggregator);
* at most `max_per_object` distinct Events per object within the window (the spam filter); past
  that they are dropped (`Drop`) and the recorder logs it;
* names are `<object name>.<hash>` from the object's UID and what the Event says, so a restarted
  component finds its own earlier Event (a create answered 409) and continues its count;
* reasons only from `names.Reason`, types only Normal and Warning.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping

from flotilla.resources.parse import rfc3339
from flotilla.resources.names import REASONS

TYPES = ("Normal", "Warning")
COMBINED = "(combined from similar events): "
MAX_MESSAGE = 1024


@dataclass(frozen=True)
class SeriesKey:
    object: tuple[str, str, str, str]  # uid (or ""), kind, namespace, name
    type: str
    reason: str
    message: str  # the message, or COMBINED for an aggregated series


@dataclass(frozen=True)
class Create:
    key: SeriesKey
    namespace: str
    name: str
    body: dict[str, Any]  # a core/v1 Event


@dataclass(frozen=True)
class Bump:
    key: SeriesKey
    namespace: str
    name: str
    patch: dict[str, Any]  # count, lastTimestamp (and the message of an aggregated series)


@dataclass(frozen=True)
class Drop:
    key: SeriesKey
    why: str


@dataclass
class _Series:
    name: str
    count: int
    first: float
    last: float


def event_name(object_name: str, key: SeriesKey, component: str) -> str:
    digest = hashlib.sha256("\x00".join((*key.object, key.type, key.reason, key.message, component)).encode())
    return f"{object_name[:200]}.{digest.hexdigest()[:16]}"


def _object(involved: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (str(involved.get("uid") or ""), str(involved.get("kind") or ""),
            str(involved.get("namespace") or ""), str(involved["name"]))


class EventCorrelator:
    """Remembers the Events sent in the last `window_s` seconds (at most `max_series` of them) and
    decides, for each new occurrence, whether to create, bump or drop. Not thread-safe: the
    recorder serialises calls."""

    def __init__(self, component: str, window_s: float = 600.0, max_per_object: int = 25,
                 max_similar: int = 10, max_series: int = 4096) -> None:
        self.component = component
        self.window_s, self.max_per_object, self.max_similar = window_s, max_per_object, max_similar
        self.max_series = max_series
        self._series: OrderedDict[SeriesKey, _Series] = OrderedDict()
        self._by_object: dict[tuple[str, str, str, str], set[SeriesKey]] = {}

    def observe(self, involved: Mapping[str, Any], type_: str, reason: str, message: str,
                now: float) -> Create | Bump | Drop:
        if reason not in REASONS:
            raise ValueError(f"Event reason {reason!r} is not in flotilla.resources.names.Reason")
        if type_ not in TYPES:
            raise ValueError(f"Event type {type_!r} must be one of {TYPES}")
        self._expire(now)
        obj = _object(involved)
        message = message[:MAX_MESSAGE]
        key = SeriesKey(obj, type_, reason, message)
        if key not in self._series and self._similar(obj, type_, reason, message) >= self.max_similar:
            key, message = SeriesKey(obj, type_, reason, COMBINED), (COMBINED + message)[:MAX_MESSAGE]
        series = self._series.get(key)
        if series is not None:
            series.count, series.last = series.count + 1, now
            self._series.move_to_end(key)
            patch: dict[str, Any] = {"count": series.count, "lastTimestamp": rfc3339(now)}
            if key.message == COMBINED:
                patch["message"] = message
            return Bump(key, obj[2] or "default", series.name, patch)
        if len(self._by_object.get(obj, ())) >= self.max_per_object:
            return Drop(key, f"more than {self.max_per_object} distinct Events for {obj[1]} {obj[2]}/{obj[3]} "
                             f"within {self.window_s:.0f} s")
        name = event_name(obj[3], key, self.component)
        self._series[key] = _Series(name, 1, now, now)
        self._by_object.setdefault(obj, set()).add(key)
        while len(self._series) > self.max_series:
            self._forget(next(iter(self._series)))
        return Create(key, obj[2] or "default", name, self.body(involved, key, name, message, now))

    def settled(self, key: SeriesKey, count: int) -> None:
        """The API server holds `count` for this series (after a create found an older copy, or a bump
        found it gone)."""
        if (series := self._series.get(key)) is not None:
            series.count = count

    def body(self, involved: Mapping[str, Any], key: SeriesKey, name: str, message: str, now: float,
             count: int = 1) -> dict[str, Any]:
        at = rfc3339(now)
        return {
            "metadata": {"name": name, "namespace": key.object[2] or "default"},
            "involvedObject": dict(involved),
            "type": key.type, "reason": key.reason, "message": message,
            "source": {"component": self.component}, "reportingComponent": self.component,
            "firstTimestamp": at, "lastTimestamp": at, "count": count,
        }

    def _similar(self, obj: tuple[str, str, str, str], type_: str, reason: str, message: str) -> int:
        return sum(1 for k in self._by_object.get(obj, ()) if k.type == type_ and k.reason == reason
                   and k.message not in (message, COMBINED))

    def _expire(self, now: float) -> None:
        # Least recently used first: stop at the first series still within the window.
        while self._series:
            key, series = next(iter(self._series.items()))
            if now - series.last <= self.window_s:
                return
            self._forget(key)

    def _forget(self, key: SeriesKey) -> None:
        del self._series[key]
        keys = self._by_object[key.object]
        keys.discard(key)
        if not keys:
            del self._by_object[key.object]
