"""Compact, topology-aware placement of a job's GPUs onto nodes."""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Mapping

from flotilla.allocation.snapshot import NodeState


def free_gpus(nodes: Iterable[NodeState], held: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Free GPUs per schedulable node once the given placements are taken out."""
    free = {n.name: n.usable_gpus for n in nodes if n.usable_gpus > 0}
    for placement in held:
        for node, g in placement.items():
            if node in free:
                free[node] -= g
    return {k: v for k, v in free.items() if v > 0}


def domains(nodes: Iterable[NodeState]) -> dict[str, str]:
    """Each node's topology domain, by name: compute once and pass to `place` for many jobs."""
    return {n.name: n.domain for n in nodes}


def place(gpus: int, unit: int, free: Mapping[str, int], nodes: Iterable[NodeState],
          domain_of: Mapping[str, str] | None = None) -> dict[str, int] | None:
    """Place `gpus` GPUs in whole workers of `unit` GPUs, or None if they do not fit.

    Best fit first: the single node whose free GPUs fit the job most tightly
    (least fragmentation). Otherwise, the topology domain with the most free
    GPUs that can hold the whole job, filled node by node from the fullest;
    only if no domain can, across domains. A worker never spans nodes.
    """
    if gpus <= 0:
        return {}
    if gpus % unit:
        raise ValueError(f"{gpus} GPUs is not a whole number of {unit}-GPU workers")
    if domain_of is None:
        domain_of = domains(nodes)
    slots = {node: (f // unit) * unit for node, f in free.items() if f >= unit and node in domain_of}
    if sum(slots.values()) < gpus:
        return None
    fitting = [node for node, s in slots.items() if s >= gpus]
    if fitting:
        best = min(fitting, key=lambda node: (slots[node], node))
        return {best: gpus}

    by_domain: dict[str, list[str]] = defaultdict(list)
    for node in slots:
        by_domain[domain_of[node]].append(node)
    domain_free = {d: sum(slots[n] for n in ns) for d, ns in by_domain.items()}
    holding = [d for d, f in domain_free.items() if f >= gpus]
    if holding:
        candidates = by_domain[min(holding, key=lambda d: (domain_free[d], d))]
    else:
        candidates = list(slots)
    placement: dict[str, int] = {}
    left = gpus
    for node in sorted(candidates, key=lambda n: (-slots[n], n)):
        take = min(slots[node], left)
        if take:
            placement[node] = take
            left -= take
        if not left:
            return placement
    return None


def shrink_in_place(placement: Mapping[str, int], gpus: int, unit: int) -> dict[str, int]:
    """Keep `gpus` of a placement, giving back whole `unit`-GPU workers from the nodes where it holds the fewest."""
    kept = dict(placement)
    extra = sum(kept.values()) - gpus
    for node in sorted(kept, key=lambda n: (kept[n], n)):
        if extra <= 0:
            break
        give = min(extra, kept[node]) // unit * unit
        kept[node] -= give
        extra -= give
    return {n: g for n, g in kept.items() if g}
