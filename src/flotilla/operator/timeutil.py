"""RFC 3339 times as Kubernetes writes them."""

from __future__ import annotations

from datetime import datetime, timezone


def parse(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def to_unix(value: str) -> float:
    return parse(value).timestamp()


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
