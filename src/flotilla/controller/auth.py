"""Bearer-token authentication with roles.

Tokens file (plain file, or the key of a Kubernetes Secret mounted as a file),
one token per line, `#` starts a comment:

    <token>,<role>,<name>

role is `read` (GET routes and /metrics), `admin` (everything) or `ingest`
(only POST /v1/ingest, for node agents). name identifies the holder in the
audit trail; the token itself is never logged or stored. The file is re-read
when it changes, so a rotated Secret takes effect without a restart.

Tokens the file does not know go to the optional reviewer (a TokenReview, see
`flotilla.controller.kube.token_reviewer`), which answers with a Kubernetes
identity: username, groups and, for a token bound to a pod on a node, that node.
What an identity may ingest is decided by `flotilla.controller.ingest_auth`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROLES = ("read", "ingest", "admin")
NO_ROLE = "none"  # a Kubernetes identity that may use no route by role (what ingest_auth grants it, it may)


class ReviewUnavailable(Exception):
    """The API server could not say who a token belongs to (down, timed out, or refused the review): ask later."""


@dataclass(frozen=True)
class Identity:
    name: str
    role: str
    # Vouched for by the API server (TokenReview): name is the Kubernetes username.
    kubernetes: bool = False
    # The node a bound token names (TokenReview's extra NODE_NAME_EXTRA); None for any other token.
    node: str | None = None
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()  # TokenReview's user.extra, for SubjectAccessReviews

    def may(self, needed: str) -> bool:
        """admin may do everything; read may read; ingest may only ingest."""
        return self.role == "admin" or self.role == needed


def parse_tokens(text: str, source: str = "tokens file") -> list[tuple[bytes, Identity]]:
    """-> [(sha256 of token, identity)]; a bad line raises ValueError naming the line, never the token."""
    out: list[tuple[bytes, Identity]] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"{source} line {number}: expected '<token>,<role>,<name>'")
        token, role, name = parts
        if role not in ROLES:
            raise ValueError(f"{source} line {number}: role must be one of {', '.join(ROLES)}, got {role!r}")
        if len(token) < 16:
            raise ValueError(f"{source} line {number}: token must be at least 16 characters")
        out.append((hashlib.sha256(token.encode()).digest(), Identity(name, role)))
    return out


def create_tokens_file(path: Path) -> None:
    """Write a new tokens file with one random admin token, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("# <token>,<role: read|ingest|admin>,<name>\n")
        f.write(f"{secrets.token_urlsafe(32)},admin,admin\n")


class TokenAuthenticator:
    """Resolves a bearer token to an Identity, from the tokens file and optionally a TokenReview."""

    def __init__(self, path: Path | None, reviewer: Callable[[str], Identity | None] | None = None) -> None:
        self.path = path
        self.reviewer = reviewer
        self._lock = threading.Lock()
        self._mtime: float | None = None
        self._tokens: list[tuple[bytes, Identity]] = []
        if path is not None:
            self._reload()

    def _reload(self) -> None:
        assert self.path is not None
        mtime = self.path.stat().st_mtime
        if mtime == self._mtime:
            return
        with self._lock:
            self._tokens = parse_tokens(self.path.read_text(), str(self.path))
            self._mtime = mtime

    def identify(self, token: str) -> Identity | None:
        """-> the token's holder, None when nobody vouches for it; raises ReviewUnavailable (from the reviewer)."""
        if self.path is not None:
            try:
                self._reload()
            except (OSError, ValueError):
                pass  # keep the last good tokens while a Secret update is half-written
        digest = hashlib.sha256(token.encode()).digest()
        found: Identity | None = None
        for known, identity in self._tokens:  # no early exit: the time taken does not depend on which matched
            if hmac.compare_digest(known, digest):
                found = identity
        if found is None and self.reviewer is not None:
            found = self.reviewer(token)
        return found
