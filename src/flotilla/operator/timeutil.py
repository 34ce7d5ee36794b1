"""RFC 3339 times as Kubernetes writes them: `flotilla.resources.parse` is their home; these names stay for
the modules that import them from here."""

from __future__ import annotations

from flotilla.resources.parse import rfc3339, to_datetime as parse, to_unix

__all__ = ["parse", "rfc3339", "to_unix"]
