"""The taint budget: how many nodes, and GPUs, the controller may take out of service in a sliding window.

A detector that goes wrong (a forged sample, a driver update that trips every
node, a bug) must not be able to drain the fleet. Like the eviction rate limits
of Kubernetes' node lifecycle controller, the budget bounds what one incident can
do: within `window` seconds at most `fraction` of the cluster's nodes (at least
`min_nodes`) and at most `domain_fraction` of one topology domain's nodes (at
least one) may be tainted. A decision beyond the budget is reported, not acted on.

GPUs are counted as well (where the caller says how many the cluster has): within the window at most
`gpu_fraction` of the cluster's GPUs (at least `min_gpus`) may leave service, whether a whole node takes its
GPUs with it or a device-local fault takes one (`flotilla.health.scope`). A device taken out counts its GPUs
only, not a node; the same GPU again, or a GPU of a node already taken out whole, costs nothing.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True, slots=True)
class TaintBudgetConfig:
    fraction: float = 0.10         # of all nodes, cluster-wide
    domain_fraction: float = 0.50  # of one topology domain's nodes
    window: float = 600.0          # seconds
    min_nodes: int = 1             # cluster-wide, whatever the fraction gives
    gpu_fraction: float = 0.10     # of all GPUs, cluster-wide (where the caller gives the cluster's GPU count)
    min_gpus: int = 1              # cluster-wide, whatever the GPU fraction gives

    def __post_init__(self) -> None:
        for name in ("fraction", "domain_fraction", "gpu_fraction"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"taint budget field {name!r} must be in (0, 1]")
        if not self.window > 0:
            raise ValueError("taint budget field 'window' must be positive")
        for name in ("min_nodes", "min_gpus"):
            if getattr(self, name) < 0:
                raise ValueError(f"taint budget field {name!r} must not be negative")


class TaintBudget:
    def __init__(self, config: TaintBudgetConfig | None = None) -> None:
        self.config = config or TaintBudgetConfig()
        # (time, node, domain, GPUs taken: None = the whole node, node's GPU count), oldest first
        self._spent: deque[tuple[float, str, str, frozenset[int] | None, int]] = deque()

    def check(self, now: float, node: str, domain: str, nodes: int, domain_nodes: int, *,
              gpus: Iterable[int] | None = None, node_gpus: int = 0, cluster_gpus: int = 0) -> str | None:
        """None when taking `node` out (or only its `gpus`, a device-local fault) fits the budget, else why not
        (for logs and the decision history). `node_gpus`: the node's GPUs, `cluster_gpus`: the cluster's (0: GPUs
        are not counted)."""
        cfg = self.config
        self._expire(now)
        whole = [e for e in self._spent if e[3] is None]
        if any(e[1] == node for e in whole):
            return None   # the node is out already (e.g. a lasting fault replacing a transient one): costs nothing
        taken = self._gpus_out(node)
        new = (node_gpus - len(taken)) if gpus is None else len(set(gpus) - taken)
        if gpus is not None and new == 0:
            return None   # the same GPUs again
        if gpus is None:
            cluster_limit = max(cfg.min_nodes, math.floor(cfg.fraction * nodes))
            if len(whole) >= cluster_limit:
                return (f"taint budget: {len(whole)} of {nodes} nodes already taken out in the last "
                        f"{cfg.window:g} s (cluster-wide limit {cluster_limit})")
            in_domain = sum(1 for e in whole if e[2] == domain)
            domain_limit = max(1, math.floor(cfg.domain_fraction * domain_nodes))
            if in_domain >= domain_limit:
                return (f"taint budget: {in_domain} of {domain_nodes} nodes of domain {domain} already taken out "
                        f"in the last {cfg.window:g} s (domain limit {domain_limit})")
        if cluster_gpus > 0:
            out = sum(e[4] if e[3] is None else len(e[3]) for e in self._spent)
            gpu_limit = max(cfg.min_gpus, math.floor(cfg.gpu_fraction * cluster_gpus))
            if out + new > gpu_limit:
                return (f"taint budget: {out} of {cluster_gpus} GPUs already taken out in the last {cfg.window:g} s;"
                        f" {new} more would pass the cluster-wide limit {gpu_limit}")
        return None

    def spend(self, now: float, node: str, domain: str, *, gpus: Iterable[int] | None = None,
              node_gpus: int = 0) -> None:
        """Record taking `node` out (or only its `gpus`)."""
        taken = self._gpus_out(node)
        if gpus is None:
            self._spent.append((now, node, domain, None, max(0, node_gpus - len(taken))))
        else:
            new = frozenset(gpus) - taken
            if new:
                self._spent.append((now, node, domain, new, len(new)))

    def _expire(self, now: float) -> None:
        while self._spent and self._spent[0][0] <= now - self.config.window:
            self._spent.popleft()

    def _gpus_out(self, node: str) -> frozenset[int]:
        return frozenset(g for e in self._spent if e[1] == node and e[3] is not None for g in e[3])
