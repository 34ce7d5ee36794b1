"""A sharded NumPy training state that survives a change of world size.

Each named array is split along its first axis into contiguous, near-equal
shards, one per rank. At a checkpoint every rank writes its shards to
`<dir>/rank-<r>-of-<n>.npz`; rank 0 also writes `<dir>/manifest.json` (step,
world size, global shapes and dtypes) once its own shard is down. A restarted
worker with any world size reads the manifest and assembles its new shard from
the old files that overlap it (load-time resharding, as PyTorch DCP does).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

MANIFEST = "manifest.json"


def shard_bounds(length: int, world_size: int, rank: int) -> tuple[int, int]:
    """[start, stop) of `rank`'s rows: the first length % world_size ranks get one extra row."""
    if world_size <= 0 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of size {world_size}")
    base, extra = divmod(length, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def split(arrays: Mapping[str, np.ndarray], world_size: int, rank: int) -> dict[str, np.ndarray]:
    """`rank`'s shard of each global array."""
    out = {}
    for name, a in arrays.items():
        start, stop = shard_bounds(len(a), world_size, rank)
        out[name] = a[start:stop]
    return out


@dataclass(frozen=True)
class Manifest:
    step: int
    world_size: int
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, str]


def _shard_file(directory: Path, rank: int, world_size: int) -> Path:
    return directory / f"rank-{rank}-of-{world_size}.npz"


def save(directory: str | Path, shards: Mapping[str, np.ndarray], *, rank: int, world_size: int, step: int,
         global_shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Write this rank's shards (atomically); rank 0 also writes the manifest."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name, shape in global_shapes.items():
        start, stop = shard_bounds(shape[0], world_size, rank)
        got = shards[name].shape
        if got != (stop - start, *shape[1:]):
            raise ValueError(f"rank {rank}/{world_size}: shard {name!r} has shape {got}, "
                             f"expected {(stop - start, *shape[1:])}")
    target = _shard_file(directory, rank, world_size)
    tmp = target.with_suffix(".tmp.npz")
    # Any: numpy's stub reads a ** mapping as possibly holding its `allow_pickle` flag.
    arrays: dict[str, Any] = {name: shards[name] for name in global_shapes}
    np.savez(tmp, **arrays)
    os.replace(tmp, target)
    if rank == 0:
        manifest = {"step": step, "world_size": world_size,
                    "shapes": {n: list(s) for n, s in global_shapes.items()},
                    "dtypes": {n: str(shards[n].dtype) for n in global_shapes}}
        tmp_manifest = directory / (MANIFEST + ".tmp")
        tmp_manifest.write_text(json.dumps(manifest))
        os.replace(tmp_manifest, directory / MANIFEST)


def read_manifest(directory: str | Path) -> Manifest:
    data = json.loads((Path(directory) / MANIFEST).read_text())
    return Manifest(step=int(data["step"]), world_size=int(data["world_size"]),
                    shapes={n: tuple(s) for n, s in data["shapes"].items()}, dtypes=dict(data["dtypes"]))


def load(directory: str | Path, *, rank: int, world_size: int) -> tuple[int, dict[str, np.ndarray]]:
    """The checkpoint's step and `rank`'s shards for a world of `world_size`, whatever size wrote it."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    old_world = manifest.world_size
    out: dict[str, np.ndarray] = {}
    opened: dict[int, np.lib.npyio.NpzFile] = {}
    try:
        for name, shape in manifest.shapes.items():
            start, stop = shard_bounds(shape[0], world_size, rank)
            pieces = []
            for old_rank in range(old_world):
                o_start, o_stop = shard_bounds(shape[0], old_world, old_rank)
                lo, hi = max(start, o_start), min(stop, o_stop)
                if lo >= hi:
                    continue
                if old_rank not in opened:
                    opened[old_rank] = np.load(_shard_file(directory, old_rank, old_world))
                pieces.append(opened[old_rank][name][lo - o_start : hi - o_start])
            empty = np.empty((0, *shape[1:]), dtype=manifest.dtypes[name])
            out[name] = np.concatenate(pieces) if pieces else empty
    finally:
        for f in opened.values():
            f.close()
    return manifest.step, out
