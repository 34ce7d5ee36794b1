"""Who may put metric samples and serving statistics into the controller, on either transport.

Two modes (`flotilla controller --ingest-auth`):

* `shared` (development, the command line's default): any token with the `ingest` (or `admin`) role may post
  samples for any node and statistics for any ServingDeployment. One leaked agent token can then taint any
  node; use it on a laptop, never on a fleet.
* `tokenreview` (production, the chart's default): an agent presents its projected ServiceAccount token (made
  for `--token-audience`); the API server's TokenReview says whose it is and, for a token bound to a pod on a
  node, which node. Samples are accepted only from the ServiceAccounts in `--agent-service-accounts`, and only
  for the node the token is bound to. Statistics for a ServingDeployment need `update` on
  `servingdeployments/stats` of that object (SubjectAccessReview). A tokens-file `admin` may do both; the
  tokens file's `ingest` role may do neither.

A refusal is a `Refusal` (HTTP status, the `reason` label of `flotilla_ingest_rejected_total`, a message that
names the reason and never the token); the glue counts it, logs it and answers it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from flotilla.controller.auth import Identity

SHARED, TOKENREVIEW = "shared", "tokenreview"
MODES = (SHARED, TOKENREVIEW)
DEFAULT_AUDIENCE = "flotilla-controller"
DEFAULT_AGENT_SERVICE_ACCOUNT = "flotilla-system/flotilla-agent"  # the chart's, for release `flotilla` there
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"  # put in a bound pod token's user.extra by the API server

UNAUTHENTICATED, FORBIDDEN, NODE_MISMATCH, NO_NODE_CLAIM = "unauthenticated", "forbidden", "node-mismatch", "no-node-claim"


@dataclass(frozen=True)
class Refusal:
    status: int
    reason: str
    message: str


@dataclass(frozen=True)
class StatsAccess:
    """The SubjectAccessReview question for posting one ServingDeployment's statistics."""

    namespace: str
    name: str
    group: str = "flotilla.dev"
    resource: str = "servingdeployments"
    subresource: str = "stats"
    verb: str = "update"


def service_account_user(namespace_name: str) -> str:
    """`ns/name` -> the username Kubernetes gives that ServiceAccount's tokens."""
    namespace, sep, name = namespace_name.strip().partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(f"ServiceAccount {namespace_name!r}: expected namespace/name")
    return f"system:serviceaccount:{namespace}:{name}"


UNAUTHENTICATED_REFUSAL = Refusal(401, UNAUTHENTICATED, "unknown or expired token")


@dataclass(frozen=True)
class IngestPolicy:
    mode: str = SHARED
    agent_service_accounts: frozenset[str] = frozenset({DEFAULT_AGENT_SERVICE_ACCOUNT})
    # SubjectAccessReview (tokenreview mode); may raise ReviewUnavailable.
    access_review: Callable[[Identity, StatsAccess], bool] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"ingest auth mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.mode == TOKENREVIEW and self.access_review is None:
            raise ValueError("ingest auth mode tokenreview needs a SubjectAccessReview (a Kubernetes API)")
        self.agent_users()  # a malformed ServiceAccount name fails at start-up, not at the first sample

    def agent_users(self) -> frozenset[str]:
        return frozenset(service_account_user(sa) for sa in self.agent_service_accounts)

    def samples(self, who: Identity, nodes: Iterable[str]) -> Refusal | None:
        """May `who` post samples about these nodes?"""
        if self.mode == SHARED or who.role == "admin":
            return None if who.may("ingest") else _role_needed("ingest", who)
        if not who.kubernetes:
            return Refusal(403, FORBIDDEN, "shared tokens may not post samples with --ingest-auth tokenreview: "
                                           "agents present their node-bound ServiceAccount token")
        if who.name not in self.agent_users():
            return Refusal(403, FORBIDDEN, f"{who.name} is not one of the agent ServiceAccounts "
                                           f"(--agent-service-accounts)")
        if who.node is None:
            return Refusal(403, NO_NODE_CLAIM, f"the token of {who.name} is not bound to a pod on a node: agents "
                                               "present a projected ServiceAccount token")
        others = sorted(set(nodes) - {who.node})
        if others:
            shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
            return Refusal(403, NODE_MISMATCH, f"samples for node {shown} refused: the token is bound to node "
                                               f"{who.node}, an agent speaks only for its own node")
        return None

    def stats(self, who: Identity, namespace: str, name: str) -> Refusal | None:
        """May `who` post statistics for ServingDeployment namespace/name? (may raise ReviewUnavailable)"""
        if self.mode == SHARED or who.role == "admin":
            return None if who.may("ingest") else _role_needed("ingest", who)
        if not who.kubernetes:
            return Refusal(403, FORBIDDEN, "shared tokens may not post serving statistics with --ingest-auth "
                                           "tokenreview: use a ServiceAccount token allowed to update "
                                           "servingdeployments/stats")
        assert self.access_review is not None
        access = StatsAccess(namespace, name)
        if not self.access_review(who, access):
            return Refusal(403, FORBIDDEN, f"{who.name} may not {access.verb} {access.resource}/{access.subresource} "
                                           f"of {namespace}/{name} ({access.group})")
        return None


def _role_needed(role: str, who: Identity) -> Refusal:
    return Refusal(403, FORBIDDEN, f"this route needs the {role!r} role; token {who.name!r} has {who.role!r}")
