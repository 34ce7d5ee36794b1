"""Peer groups inferred from healthy behaviour: levels part roles, offsets do not; fixed once stable; a suspect
machine teaches nothing."""

import numpy as np

from flotilla.health.groups import PeerGroups
from flotilla.health.metrics import COMPARED_INDEX, COMPARED

CPU, NET_RX, UTIL, LINKS = (COMPARED_INDEX[m] for m in ("cpu_util", "net_rx", "gpu_util", "nvlink_active"))


def rows(rng, n: int, stage_of, links=None):
    v = np.full((n, len(COMPARED)), np.nan)
    v[:, UTIL] = 95 + rng.normal(0, 1.5, n) + rng.normal(0, 1, n)          # per-machine offsets, no levels
    v[:, CPU] = np.where(stage_of == 0, 48.0, 30.0) + rng.normal(0, 3, n)
    v[:, NET_RX] = np.where(stage_of == 0, 1250.0, 2500.0) * rng.normal(1, 0.04, n)
    v[:, LINKS] = 18.0 if links is None else links
    steps = np.log(np.where(stage_of == 3, 1.12, 1.0)) + rng.normal(0, 0.02, n)
    return v, steps


def learn(groups: PeerGroups, rng, stage_of, healthy, evaluations: int, links=None) -> None:
    for _ in range(evaluations):
        v, s = rows(rng, len(stage_of), stage_of, links)
        groups.observe(v, s, healthy)


def test_a_four_stage_pipeline_parts_into_first_middle_and_last_once_two_computations_agree():
    rng = np.random.default_rng(1)
    stage_of = np.arange(12) % 4
    g = PeerGroups(tuple(f"n{i}" for i in range(12)))
    learn(g, rng, stage_of, np.ones(12, dtype=bool), 14)
    assert not g.known                                  # first computation at 10, the second at 15
    learn(g, rng, stage_of, np.ones(12, dtype=bool), 1)
    assert g.known
    by_stage = {s: {g.labels[i] for i in range(12) if stage_of[i] == s} for s in range(4)}
    assert all(len(v) == 1 for v in by_stage.values())
    assert by_stage[1] == by_stage[2] and len(by_stage[0] | by_stage[1] | by_stage[3]) == 3


def test_a_data_parallel_job_is_one_group_and_links_up_never_part_machines():
    rng = np.random.default_rng(2)
    links = np.array([18.0] * 7 + [12.0])                # a machine with links down is a fault, not a role
    g = PeerGroups(tuple(f"n{i}" for i in range(8)))
    learn(g, rng, np.full(8, 1), np.ones(8, dtype=bool), 15, links)
    assert g.known and set(g.labels) == {"auto0/1"}


def test_a_machine_suspect_from_the_start_teaches_nothing_and_stands_alone():
    rng = np.random.default_rng(3)
    healthy = np.ones(8, dtype=bool)
    healthy[5] = False
    g = PeerGroups(tuple(f"n{i}" for i in range(8)))
    learn(g, rng, np.arange(8) % 2, healthy, 15)
    assert g.known and g.labels[5] == "alone:n5"
    assert len({g.labels[i] for i in (0, 2, 4, 6)}) == 1 and len({g.labels[i] for i in (1, 3, 7)}) == 1
    fixed = g.labels
    learn(g, rng, np.zeros(8, dtype=int), np.ones(8, dtype=bool), 30)   # behaviour changes later: groups stay
    assert g.labels == fixed
