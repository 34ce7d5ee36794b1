"""RFC 3339 times as Kubernetes writes them."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone


def parse(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def to_unix(value: str) -> float:
    return parse(value).timestamp()


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_not_after(ts: float) -> str:
    """`rfc3339` to the microsecond where `ts` has a fraction: read back, no later than `ts`."""
    if ts == int(ts):
        return rfc3339(ts)
    at = datetime.fromtimestamp(ts, tz=timezone.utc)
    if at.timestamp() > ts:
        at -= timedelta(microseconds=1)
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
