"""Chaos on the operator's side of the real control plane: kill -9 at each step of a reshard, kube-apiserver
and etcd restarted mid-run, deletions during a watch gap, a frozen leader, a job name reused.

The cases live in e2e/chaos/operator_cases.py (bench/chaos.py runs the same ones); each starts its own
operator(s) and simulated workers in a namespace of its own. The ones that restart kube-apiserver or etcd
need the cluster from e2e/cluster.sh with the same FLOTILLA_STATE (not kind).
"""

from __future__ import annotations

import pytest

from e2e.chaos.operator_cases import CASES


@pytest.mark.parametrize("name", list(CASES))
def test_chaos(name, log_dir):
    outcome = CASES[name](log_dir)
    print(outcome.row())
    assert outcome.ok(), outcome.details
