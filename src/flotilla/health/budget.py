"""The taint budget: how many nodes the controller may take out of service in a sliding window.

A detector that goes wrong (a forged sample, a driver update that trips every
node, a bug) must not be able to drain the fleet. Like the eviction rate limits
of Kubernetes' node lifecycle controller, the budget bounds what one incident can
do: within `window` seconds at most `fraction` of the cluster's nodes (at least
`min_nodes`) and at most `domain_fraction` of one topology domain's nodes (at
least one) may be tainted. A decision beyond the budget is reported, not acted on.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TaintBudgetConfig:
    fraction: float = 0.10         # of all nodes, cluster-wide
    domain_fraction: float = 0.50  # of one topology domain's nodes
    window: float = 600.0          # seconds
    min_nodes: int = 1             # cluster-wide, whatever the fraction gives

    def __post_init__(self) -> None:
        for name in ("fraction", "domain_fraction"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"taint budget field {name!r} must be in (0, 1]")
        if not self.window > 0:
            raise ValueError("taint budget field 'window' must be positive")
        if self.min_nodes < 0:
            raise ValueError("taint budget field 'min_nodes' must not be negative")


class TaintBudget:
    def __init__(self, config: TaintBudgetConfig | None = None) -> None:
        self.config = config or TaintBudgetConfig()
        self._spent: deque[tuple[float, str, str]] = deque()   # (time, node, domain), oldest first

    def check(self, now: float, node: str, domain: str, nodes: int, domain_nodes: int) -> str | None:
        """None when tainting `node` fits the budget, else why not (for logs and the decision history)."""
        cfg = self.config
        while self._spent and self._spent[0][0] <= now - cfg.window:
            self._spent.popleft()
        if any(n == node for _, n, _ in self._spent):
            return None   # the same node again (e.g. a lasting fault replacing a transient one) costs nothing
        cluster_limit = max(cfg.min_nodes, math.floor(cfg.fraction * nodes))
        if len(self._spent) >= cluster_limit:
            return (f"taint budget: {len(self._spent)} of {nodes} nodes already taken out in the last "
                    f"{cfg.window:g} s (cluster-wide limit {cluster_limit})")
        in_domain = sum(1 for _, _, d in self._spent if d == domain)
        domain_limit = max(1, math.floor(cfg.domain_fraction * domain_nodes))
        if in_domain >= domain_limit:
            return (f"taint budget: {in_domain} of {domain_nodes} nodes of domain {domain} already taken out "
                    f"in the last {cfg.window:g} s (domain limit {domain_limit})")
        return None

    def spend(self, now: float, node: str, domain: str) -> None:
        self._spent.append((now, node, domain))
