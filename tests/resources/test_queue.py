"""The typed parse of a Queue: its spec as the tenancy decision's QueueSpec; a malformed one names the field."""

import pytest

from flotilla.resources import queue
from flotilla.tenancy import Quota


def body(spec, name="team-a", **meta):
    return {"apiVersion": "flotilla.dev/v1alpha1", "kind": "Queue",
            "metadata": {"name": name, "uid": "u", "generation": 3, **meta}, "spec": spec}


def test_a_queue_reads_its_quotas_weight_parent_and_namespaces():
    q = queue.parse(body({"resources": [{"name": "nvidia.com/gpu", "nominal": 8, "borrowingLimit": 4,
                                         "lendingLimit": 2}],
                          "weight": 2.5, "parent": "dept", "namespaces": ["a", "a-dev"]}))
    assert (q.name, q.generation) == ("team-a", 3)
    assert q.spec.quotas == {"nvidia.com/gpu": Quota(8, 4, 2)}
    assert (q.spec.weight, q.spec.parent, q.spec.namespaces) == (2.5, "dept", ("a", "a-dev"))


def test_defaults():
    q = queue.parse(body({"resources": [{"name": "nvidia.com/gpu", "nominal": 0}]}))
    assert q.spec.quotas["nvidia.com/gpu"] == Quota(0, None, None)
    assert (q.spec.weight, q.spec.parent, q.spec.namespaces) == (1.0, None, ())


@pytest.mark.parametrize("spec, field", [
    ({"resources": {"nvidia.com/gpu": 8}}, r"spec\.resources must be a list"),
    ({"resources": [{"nominal": 8}]}, r"spec\.resources\[0\]\.name"),
    ({"resources": [{"name": "nvidia.com/gpu", "nominal": "8"}]}, r"spec\.resources\[0\]\.nominal"),
    ({"resources": [{"name": "g", "nominal": 1}, {"name": "g", "nominal": 2}]}, r"spec\.resources\[1\]\.name"),
    ({"resources": [], "parent": 3}, r"spec\.parent"),
    ({"resources": [], "namespaces": "a"}, r"spec\.namespaces"),
])
def test_a_malformed_queue_names_the_field(spec, field):
    with pytest.raises(ValueError, match=field):
        queue.parse(body(spec))


def test_tenancy_fields_are_named_as_the_crd_names_them():
    assert queue.crd_field("spec.quotas[nvidia.com/gpu].lendingLimit") == "spec.resources[nvidia.com/gpu].lendingLimit"
    assert queue.crd_field("spec.parent") == "spec.parent"
