"""Registry of allocation policies by name: `get(name).decide(snapshot)`."""

from __future__ import annotations

from typing import Callable

from flotilla.allocation.elastic import DeadlineElastic
from flotilla.allocation.elastic_baselines import EdfElastic, GoodputElastic
from flotilla.allocation.fifo import FifoGang
from flotilla.allocation.fixed_size import edf_fixed, las_fixed
from flotilla.allocation.snapshot import Allocator

# The first is Flotilla's own; the rest are baselines.
_FACTORIES: dict[str, Callable[[], Allocator]] = {
    DeadlineElastic.name: DeadlineElastic,
    FifoGang.name: FifoGang,
    "edf-fixed": edf_fixed,
    "least-attained-service": las_fixed,
    EdfElastic.name: EdfElastic,
    GoodputElastic.name: GoodputElastic,
}

DEFAULT = DeadlineElastic.name


def names() -> list[str]:
    return list(_FACTORIES)


def get(name: str) -> Allocator:
    try:
        return _FACTORIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(_FACTORIES)}") from None
