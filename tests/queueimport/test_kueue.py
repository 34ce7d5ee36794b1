"""Kueue ClusterQueues and Cohorts (v1beta2) -> Flotilla Queues: table tests of the pure translation, and the
`flotilla queues import -f` command."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flotilla.queueimport.kueue import queue_object, quantity, translate
from flotilla.tenancy import QueueSpec, Quota

GPU = "nvidia.com/gpu"


def cq(name, *flavors, cohort=None, weight=None, selector="absent", preemption=None, **spec):
    """A ClusterQueue; each flavor is (flavor name, {resource: nominalQuota or (nominal, borrowing, lending)})."""
    groups = [{"coveredResources": sorted({r for _, res in flavors for r in res}),
               "flavors": [{"name": f, "resources": [_resource(r, q) for r, q in res.items()]}
                           for f, res in flavors]}] if flavors else []
    body = {"resourceGroups": groups, **spec}
    if cohort:
        body["cohortName"] = cohort
    if weight is not None:
        body["fairSharing"] = {"weight": weight}
    if selector != "absent":
        body["namespaceSelector"] = selector
    if preemption:
        body["preemption"] = preemption
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name}, "spec": body}


def cohort(name, *flavors, parent=None, weight=None):
    c = cq(name, *flavors, weight=weight)
    c["kind"] = "Cohort"
    if parent:
        c["spec"]["parentName"] = parent
    return c


def _resource(name, q):
    if isinstance(q, tuple):
        out = {"name": name, "nominalQuota": q[0]}
        if q[1] is not None:
            out["borrowingLimit"] = q[1]
        if q[2] is not None:
            out["lendingLimit"] = q[2]
        return out
    return {"name": name, "nominalQuota": q}


def Q(name, nominal, borrowing=None, lending=None, *, weight=1.0, parent=None, namespaces=()):
    return QueueSpec(name, {GPU: Quota(nominal, borrowing, lending)}, weight, parent, tuple(namespaces))


CASES = [
    pytest.param(
        [cq("a", ("default", {GPU: 8, "cpu": 64}), cohort="org"), cq("b", ("default", {GPU: (4, 2, 1)}), cohort="org")],
        [Q("a", 8, parent="org"), Q("b", 4, 2, 1, parent="org"), Q("org", 12, 0, 0)],
        ["ClusterQueue a: spec.resourceGroups[0].flavors[default].resources[cpu]: no equivalent"],
        id="implicit-cohort-becomes-a-parent-holding-its-members"),
    pytest.param(
        [cq("solo", ("default", {GPU: "16"}))], [Q("solo", 16, 0, 0)], [], id="no-cohort-is-isolated"),
    pytest.param(
        [cohort("root", ("default", {GPU: 4})), cohort("dept", ("default", {GPU: (0, 6, None)}), parent="root",
                                                   weight="2"),
         cq("t1", ("default", {GPU: 8}), cohort="dept", weight="500m"), cq("t2", ("default", {GPU: 8}), cohort="dept")],
        [Q("dept", 16, 6, None, weight=2.0, parent="root"), Q("root", 20, 0, 0),
         Q("t1", 8, weight=0.5, parent="dept"), Q("t2", 8, parent="dept")],
        [], id="cohort-tree-nominal-is-own-plus-members"),
    pytest.param(
        [cq("a", ("a100", {GPU: 8}), ("h100", {GPU: (4, None, 2)}), cohort="org")],
        [Q("a", 12, parent="org"), Q("org", 12, 0, 0)],
        ["ClusterQueue a: spec.resourceGroups: nvidia.com/gpu in flavors a100, h100: no equivalent for flavors "
         "beyond one"], id="gpu-flavors-summed"),
    pytest.param(
        [cq("a", ("default", {GPU: 8}), selector={"matchLabels": {"kubernetes.io/metadata.name": "team-a"}}),
         cq("b", ("default", {GPU: 8}), selector={"matchExpressions": [
             {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["b2", "b1"]}]}),
         cq("c", ("default", {GPU: 8}), selector={}),
         cq("d", ("default", {GPU: 8}), selector={"matchLabels": {"team": "d"}})],
        [Q("a", 8, 0, 0, namespaces=["team-a"]), Q("b", 8, 0, 0, namespaces=["b1", "b2"]), Q("c", 8, 0, 0),
         Q("d", 8, 0, 0)],
        ["ClusterQueue c: spec.namespaceSelector: selects every namespace: no equivalent",
         "ClusterQueue d: spec.namespaceSelector: selects namespaces by labels: no equivalent offline"],
        id="namespace-selectors-by-name"),
    pytest.param(
        [cq("a", ("default", {GPU: 8}), cohort="org", weight="0", queueingStrategy="StrictFIFO",
            preemption={"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority",
                        "borrowWithinCohort": {"policy": "LowerPriority"}}),
         {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "lq"}}],
        [Q("a", 8, parent="org"), Q("org", 8, 0, 0)],
        ["LocalQueue lq: kind: not a ClusterQueue or Cohort; skipped",
         "ClusterQueue a: spec.fairSharing.weight: '0': no equivalent",
         "ClusterQueue a: spec.preemption.reclaimWithinCohort: Any: no equivalent",
         "ClusterQueue a: spec.preemption.withinClusterQueue: LowerPriority: no equivalent",
         "ClusterQueue a: spec.preemption.borrowWithinCohort: LowerPriority: no equivalent",
         "ClusterQueue a: spec.queueingStrategy: no equivalent"],
        id="what-has-no-equivalent"),
]


@pytest.mark.parametrize("objects, queues, notes", CASES)
def test_translate(objects, queues, notes):
    found = translate(objects)
    assert list(found.queues) == queues
    said = [str(n) for n in found.notes]
    assert len(said) == len(notes), said
    for line, start in zip(said, notes):
        assert line.startswith(start), (line, start)
    assert found.problems == ()


def test_selector_by_labels_maps_when_the_cluster_namespaces_are_known():
    objects = [cq("d", ("default", {GPU: 8}), selector={"matchLabels": {"team": "d"}, "matchExpressions": [
        {"key": "tier", "operator": "NotIn", "values": ["test"]}]})]
    labels = {"d-prod": {"team": "d"}, "d-test": {"team": "d", "tier": "test"}, "other": {"team": "e"}}
    found = translate(objects, labels)
    assert found.queues[0].namespaces == ("d-prod",) and found.notes == ()


def test_problems_are_reported_with_the_field():
    objects = [cohort("x", parent="y"), cohort("y", parent="x"),
               cq("a", ("default", {GPU: 4}), selector={"matchLabels": {"kubernetes.io/metadata.name": "ns"}}),
               cq("b", ("default", {GPU: 4}), selector={"matchLabels": {"kubernetes.io/metadata.name": "ns"}})]
    fields = {(p.queue, p.field) for p in translate(objects).problems}
    assert ("x", "spec.parent") in fields and ("b", "spec.namespaces[0]") in fields


@pytest.mark.parametrize("value, expected", [(8, 8), ("8", 8), ("2k", 2000), ("1.5", None), ("500m", None),
                                             (True, None)])
def test_quantity(value, expected):
    assert quantity(value) == expected


def test_queue_object():
    assert queue_object(Q("t1", 8, 2, None, weight=0.5, parent="dept", namespaces=["a"])) == {
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "Queue", "metadata": {"name": "t1"},
        "spec": {"resources": [{"name": GPU, "nominal": 8, "borrowingLimit": 2}], "weight": 0.5, "parent": "dept",
                 "namespaces": ["a"]}}


def run_cli(*args, stdin=None):
    root = Path(__file__).resolve().parents[2]
    return subprocess.run([sys.executable, "-m", "flotilla.cli", "queues", "import", *args], input=stdin,
                          capture_output=True, text=True, cwd=root, timeout=60)


def test_command_prints_queues_and_says_what_has_no_equivalent(tmp_path):
    path = tmp_path / "kueue.yaml"
    path.write_text(yaml.safe_dump_all([cq("a", ("default", {GPU: 8, "memory": "64Gi"}), cohort="org"),
                                        cq("b", ("default", {GPU: 8}), cohort="org")]))
    r = run_cli("-f", str(path))
    assert r.returncode == 0, r.stderr
    printed = list(yaml.safe_load_all(r.stdout))
    assert [q["metadata"]["name"] for q in printed] == ["a", "b", "org"]
    assert printed[2]["spec"] == {"resources": [{"name": GPU, "nominal": 16, "borrowingLimit": 0, "lendingLimit": 0}]}
    assert r.stderr.splitlines() == [
        "note: ClusterQueue a: spec.resourceGroups[0].flavors[default].resources[memory]: no equivalent "
        "(Queues hold nvidia.com/gpu only); left out"]


def test_command_refuses_queues_that_would_be_refused(tmp_path):
    r = run_cli("-f", "-", "--apply", stdin=yaml.safe_dump_all([cohort("x", parent="y"), cohort("y", parent="x")]))
    assert r.returncode == 1
    assert "refused: Queue x: spec.parent: the parents form a cycle" in r.stderr

