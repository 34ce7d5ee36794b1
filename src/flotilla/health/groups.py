"""A job's peer groups, inferred from its machines' own healthy behaviour where the job declares no roles.

A pipeline-parallel job that does not say which stage each machine runs still shows it: the first stage
reads the data (more CPU, less traffic received), the last computes the loss (longer steps, less traffic
sent), the middle stages look alike. Compared as one group, every first- and last-stage machine would be an
outlier. `PeerGroups` learns the groups while the job runs well:

* each machine's *profile* is the median, over the last `window` evaluations in which it was healthy (no
  active decision), of each compared metric that work shapes (load, traffic, heat; not the links or lanes up,
  which are the same hardware on every machine of a job) and of its ranks' log step time;
* on each feature the profiles are sorted and split wherever two neighbours differ by more than `gap` of the
  feature's scale (the metric's own floor and relative floor, as the peer detector uses; 3 % for step time):
  roles differ by a level, machines of one role by their own small offsets, so only role levels leave gaps;
* the groups are the machines equal on every feature's split. They are computed every `every` evaluations
  once `learn_after` healthy evaluations are in, and fixed when two computations in a row agree (or, should
  they never agree, at the `give_up`-th); from then on they never change while the job keeps its machines:
  a machine that turns suspect later cannot move a group, nor leave its own.

A machine with too few healthy evaluations when the groups are fixed (it was found faulty before) forms a
group of its own and is judged against its own history. Until the groups are fixed, no machine of the job is
compared with another (hard signals and liveness are judged as always).
"""

from __future__ import annotations

import numpy as np

from flotilla.health.metrics import COMPARED
from flotilla.health.window import nanmedian0

# What a role changes is the work: load, traffic, heat, step time. How many links or lanes a machine has up,
# or whether it is held down by heat, is no role's doing (all machines of a job have the same hardware): a
# difference there is a fault, never a group.
NOT_ROLES = frozenset({"nvlink_active", "pcie_link_width", "pcie_link_gen", "throttle_thermal"})
_FEATURES = np.array([m.name not in NOT_ROLES for m in COMPARED] + [True])
_FLOOR = np.array([m.floor for m in COMPARED] + [0.03])
_REL_FLOOR = np.array([m.rel_floor for m in COMPARED] + [0.0])


class PeerGroups:
    def __init__(self, nodes: tuple[str, ...], *, window: int = 60, learn_after: int = 10, every: int = 5,
                 gap: float = 3.0, give_up: int = 8) -> None:
        self.nodes = nodes
        self.window, self.learn_after, self.every, self.gap, self.give_up = window, learn_after, every, gap, give_up
        self._rows = np.full((window, len(nodes), len(_FLOOR)), np.nan)
        self._next = 0
        self._healthy_rows = 0
        self._checks = 0
        self._last: tuple[int, ...] | None = None
        self.labels: tuple[str, ...] | None = None   # per node, once known

    @property
    def known(self) -> bool:
        return self.labels is not None

    def observe(self, values: np.ndarray, node_steps: np.ndarray, healthy: np.ndarray) -> None:
        """One evaluation: `values` (nodes, compared metrics), `node_steps` (nodes,) the median log step time of
        each machine's ranks (NaN = none), `healthy` the machines with no active decision."""
        if self.known:
            return
        row = np.concatenate([values, node_steps[:, None]], axis=1)
        row[~healthy] = np.nan   # a suspect machine teaches nothing
        self._rows[self._next] = row
        self._next = (self._next + 1) % self.window
        self._healthy_rows += 1
        if self._healthy_rows < self.learn_after or self._healthy_rows % self.every:
            return
        partition = self.partition()
        self._checks += 1
        if partition == self._last or self._checks >= self.give_up:
            names = sorted(set(partition) - {-1})
            count = len(names)
            self.labels = tuple(f"auto{names.index(p)}/{count}" if p >= 0 else f"alone:{self.nodes[i]}"
                                for i, p in enumerate(partition))
        self._last = partition

    def partition(self) -> tuple[int, ...]:
        """Each machine's group as a small integer (-1: too little healthy history to place it)."""
        with np.errstate(all="ignore"):
            seen = np.isfinite(self._rows).any(axis=2).sum(axis=0)
            profile = nanmedian0(self._rows)
        placed = seen >= max(3, self.learn_after // 2)
        keys: list[list[int]] = [[] for _ in self.nodes]
        for f in np.flatnonzero(_FEATURES):
            column = profile[:, f]
            ok = placed & np.isfinite(column)
            if ok.sum() < 2 or (placed & ~ok).any():   # a feature some machines lack splits nothing
                continue
            scale = max(_FLOOR[f], _REL_FLOOR[f] * abs(float(np.median(column[ok]))))
            order = np.flatnonzero(ok)[np.argsort(column[ok])]
            cut = np.concatenate([[0], np.cumsum(np.diff(column[order]) > self.gap * scale)])
            for i, c in zip(order, cut):
                keys[i].append(int(c))
        out: list[int] = []
        seen_keys: dict[tuple[int, ...], int] = {}
        for i, key in enumerate(keys):
            if not placed[i]:
                out.append(-1)
            else:
                out.append(seen_keys.setdefault(tuple(key), len(seen_keys)))
        return tuple(out)

