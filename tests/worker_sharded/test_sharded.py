"""A sharded state written by N ranks is read back exactly by M ranks."""

import numpy as np
import pytest

from flotilla.worker.sharded import load, read_manifest, save, shard_bounds, split


def global_state():
    rng = np.random.default_rng(0)
    return {"weights": rng.standard_normal((37, 3)), "counts": np.arange(10, dtype=np.int32),
            "tiny": np.array([7.5])}


@pytest.mark.parametrize("n, m", [(1, 3), (3, 1), (4, 6), (6, 4), (5, 5), (2, 7), (8, 3)])
def test_round_trip_from_n_to_m_ranks(tmp_path, n, m):
    state = global_state()
    shapes = {k: v.shape for k, v in state.items()}
    for rank in range(n):
        save(tmp_path, split(state, n, rank), rank=rank, world_size=n, step=120, global_shapes=shapes)
    assert read_manifest(tmp_path).world_size == n
    loaded = [load(tmp_path, rank=rank, world_size=m) for rank in range(m)]
    assert {step for step, _ in loaded} == {120}
    for name, full in state.items():
        for rank, (_, shards) in enumerate(loaded):
            np.testing.assert_array_equal(shards[name], split(state, m, rank)[name])
            assert shards[name].dtype == full.dtype
        np.testing.assert_array_equal(np.concatenate([s[name] for _, s in loaded]), full)


@pytest.mark.parametrize("length, world, expected", [
    (10, 3, [(0, 4), (4, 7), (7, 10)]),
    (2, 4, [(0, 1), (1, 2), (2, 2), (2, 2)]),
])
def test_shard_bounds(length, world, expected):
    assert [shard_bounds(length, world, r) for r in range(world)] == expected


def test_save_refuses_a_shard_of_the_wrong_shape(tmp_path):
    with pytest.raises(ValueError, match="shard 'w' has shape"):
        save(tmp_path, {"w": np.zeros((3, 2))}, rank=0, world_size=2, step=1, global_shapes={"w": (10, 2)})
