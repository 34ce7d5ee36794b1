"""How many GPUs each queue may hold in one decision: its nominal share while it needs it, then what others do not
use, by weight, within each queue's borrowing and lending limits; a tree splits a parent's GPUs among its children
the same way. Pure arithmetic over GPU counts: placement and deadlines are the allocator's."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace
from typing import Mapping, Sequence


@dataclass(frozen=True)
class Claim:
    """One queue (or a parent's own jobs) in a split: what it is owed, wants, weighs, may borrow and lend."""

    name: str
    nominal: int
    demand: int
    weight: float = 1.0
    borrowing_limit: int | None = None
    lending_limit: int | None = None

    @property
    def cap(self) -> int:
        top = self.demand if self.borrowing_limit is None else min(self.demand, self.nominal + self.borrowing_limit)
        return max(0, top)


def scaled(amounts: Mapping[str, int], capacity: int) -> dict[str, int]:
    """`amounts` scaled down to sum to `capacity` (largest remainder; ties by name); as they are when they fit."""
    total = sum(amounts.values())
    if total <= capacity:
        return dict(amounts)
    capacity = max(0, capacity)
    exact = {k: v * capacity / total for k, v in amounts.items()}
    out = {k: int(x) for k, x in exact.items()}
    left = capacity - sum(out.values())
    for k in sorted(exact, key=lambda k: (-(exact[k] - out[k]), k))[:left]:
        out[k] += 1
    return out


def split(capacity: int, claims: Sequence[Claim]) -> dict[str, int]:
    """GPUs each claim may hold out of `capacity`.

    First its floor: its nominal as far as it wants it (all floors scaled down together when a lost node leaves
    too few for them). Then the idle GPUs, less the unused nominal that a lending limit keeps back, one at a time
    to the claim with the fewest GPUs above its floor per unit of weight, up to what it wants and may borrow.
    """
    floors = scaled({c.name: min(c.demand, c.nominal) for c in claims}, capacity)
    kept_back = sum(max(0, c.nominal - floors[c.name] - c.lending_limit)
                    for c in claims if c.lending_limit is not None)
    idle = capacity - sum(floors.values()) - kept_back
    out = dict(floors)
    heap = [(0.0, c.name, c) for c in claims if c.weight > 0 and out[c.name] < c.cap]
    heapq.heapify(heap)
    while idle > 0 and heap:
        _, name, c = heapq.heappop(heap)
        out[name] += 1
        idle -= 1
        if out[name] < c.cap:
            heapq.heappush(heap, ((out[name] - floors[name]) / c.weight, name, c))
    return out


def settle(budgets: Mapping[str, int], holdings: Mapping[str, int], floors: Mapping[str, int],
           capacity: int) -> dict[str, int]:
    """The budgets, except that a queue keeps what it holds above its budget unless another queue needs the GPUs
    to reach its floor (its nominal share, as far as it wants it): borrowed GPUs are taken back to give a queue
    its nominal, not to even out what idle GPUs were lent (that would resize running jobs back and forth)."""
    out = {q: max(b, holdings.get(q, 0)) for q, b in budgets.items()}
    over = sum(out.values()) - capacity
    # First trim growth beyond what a queue holds now that its floor does not need (it simply grows less).
    for q in sorted(out, key=lambda q: (-(out[q] - max(holdings.get(q, 0), floors.get(q, 0))), q)):
        if over <= 0:
            break
        cut = min(max(0, out[q] - max(holdings.get(q, 0), floors.get(q, 0))), over)
        out[q] -= cut
        over -= cut
    # Then take back borrowed GPUs, from the queues furthest above their floor first, down to their budgets.
    while over > 0:
        q = max(out, key=lambda q: (out[q] - max(budgets[q], floors.get(q, 0)), q))
        if out[q] <= max(budgets[q], floors.get(q, 0)):
            break
        out[q] -= 1
        over -= 1
    return out


def split_tree(capacity: int, claims: Sequence[Claim], parent: Mapping[str, str | None]) -> dict[str, int]:
    """`split` down a tree: the roots share `capacity`; each parent's GPUs are split among its children and its own
    jobs (owed the parent's nominal less its children's). Each claim's demand is its own jobs'; a subtree's is
    summed here. Returns the GPUs for each claim's own jobs."""
    by_name = {c.name: c for c in claims}
    children: dict[str | None, list[str]] = {}
    for c in claims:
        children.setdefault(parent.get(c.name), []).append(c.name)

    def subtree_demand(name: str) -> int:
        return by_name[name].demand + sum(subtree_demand(k) for k in children.get(name, ()))

    def whole(name: str) -> Claim:
        c = by_name[name]
        return replace(c, demand=subtree_demand(name))

    def level(amount: int, group: list[Claim]) -> dict[str, int]:
        out: dict[str, int] = {}
        for name, got in split(amount, group).items():
            kids = sorted(children.get(name, ()))
            if not kids or name not in by_name:
                out[name] = got
                continue
            own = by_name[name]
            own_nominal = max(0, own.nominal - sum(by_name[k].nominal for k in kids))
            below = level(got, [Claim(_OWN + name, own_nominal, own.demand), *(whole(k) for k in kids)])
            out[name] = below.pop(_OWN + name)
            out.update(below)
        return out

    return level(capacity, [whole(n) for n in sorted(children.get(None, []))])


_OWN = "\0own:"  # a parent's own jobs, as a claim beside its children (no queue name holds a NUL)
