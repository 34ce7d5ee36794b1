"""One sick GPU costs one GPU: which faults take a device out, which the node; the budget counts GPUs."""

import pytest

from flotilla.health.budget import TaintBudget, TaintBudgetConfig
from flotilla.health.decision import HealthDecision
from flotilla.health.scope import fault_scope


def fault(reason: str, **evidence) -> HealthDecision:
    return HealthDecision(10.0, "n1", "fault", reason, {"metric": "x", "window": 1, "score": 1.0, **evidence})


@pytest.mark.parametrize("decision, scope, gpus", [
    (fault("xid-79", gpu=3), "device", (3,)),                       # fell off the bus
    (fault("xid-48", gpu=0), "device", (0,)),                       # double-bit ECC
    (fault("ecc-uncorrectable", gpu=5), "device", (5,)),
    (fault("gpu-lost", gpus=[2]), "device", (2,)),                  # by the count drop or its silence
    (fault("xid-74", gpu=1), "node", tuple(range(8))),              # NVLink: what GPUs share
    (fault("xid-79"), "node", tuple(range(8))),                     # which GPU is not known
    (fault("heartbeat-lost"), "node", tuple(range(8))),
    (fault("outlier:net_rx"), "node", tuple(range(8))),
    (HealthDecision(10.0, "n1", "straggler", "slow-rank", {"gpus": [1]}), "node", tuple(range(8))),
])
def test_device_local_faults_take_their_gpu_and_the_rest_the_node(decision, scope, gpus):
    s = fault_scope(decision, 8)
    assert (s.scope, s.gpus) == (scope, gpus) and s.why


def test_many_gpus_out_on_one_node_escalate_to_the_node():
    assert fault_scope(fault("xid-79", gpu=3), 8, already_out=[0, 1, 2]).scope == "device"   # 4 of 8
    s = fault_scope(fault("xid-79", gpu=4), 8, already_out=[0, 1, 2, 3])                     # 5 of 8
    assert s.scope == "node" and "5 of 8" in s.why


def test_a_gpu_the_node_does_not_have_is_a_clear_error():
    with pytest.raises(ValueError, match="GPU 9 but node n1 has 8"):
        fault_scope(fault("xid-79", gpu=9), 8)
    with pytest.raises(ValueError, match="gpus_on_node"):
        fault_scope(fault("xid-79", gpu=0), 0)


def test_the_budget_counts_gpus_and_a_device_is_not_a_node():
    budget = TaintBudget(TaintBudgetConfig(fraction=0.5, gpu_fraction=0.05))   # 64 GPUs: 3 may go
    kw = {"node_gpus": 8, "cluster_gpus": 64}
    for node, gpu in (("a", 0), ("b", 1), ("c", 2)):
        assert budget.check(0.0, node, "r", 8, 8, gpus=[gpu], **kw) is None
        budget.spend(0.0, node, "r", gpus=[gpu], node_gpus=8)
    assert budget.check(1.0, "a", "r", 8, 8, gpus=[0], **kw) is None               # the same GPU again: free
    refused = budget.check(1.0, "d", "r", 8, 8, gpus=[0], **kw)
    assert refused and "3 of 64 GPUs" in refused and "limit 3" in refused
    # a whole node costs its GPUs too (less those of it already out): 8 - 1 = 7 more than the 3 allowed
    assert "GPUs" in budget.check(1.0, "a", "r", 8, 8, **kw)
    assert budget.check(601.0, "d", "r", 8, 8, gpus=[0], **kw) is None              # the window moved on
    roomy = TaintBudget(TaintBudgetConfig(fraction=0.5, gpu_fraction=0.25))          # 16 GPUs may go
    roomy.spend(0.0, "a", "r", gpus=[0, 1], node_gpus=8)
    assert roomy.check(0.0, "b", "r", 8, 8, **kw) is None                             # 2 + 8 <= 16
    roomy.spend(0.0, "b", "r", node_gpus=8)
    assert "10 of 64 GPUs" in roomy.check(0.0, "c", "r", 8, 8, **kw)                  # 10 + 8 > 16
    assert roomy.check(0.0, "a", "r", 8, 8, **kw) is None                             # 10 + 6 <= 16


def test_without_a_gpu_count_the_budget_counts_nodes_as_before():
    budget = TaintBudget(TaintBudgetConfig(fraction=0.25))
    assert budget.check(0.0, "a", "r", 8, 8) is None
    budget.spend(0.0, "a", "r")
    assert budget.check(0.0, "b", "r", 8, 8) is None
    budget.spend(0.0, "b", "r")
    assert "2 of 8 nodes" in budget.check(0.0, "c", "r", 8, 8)
    assert budget.check(0.0, "a", "r", 8, 8) is None
