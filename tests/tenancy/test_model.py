"""Queue validation, table-driven: each bad queue set is refused with the queue and the field named."""

from __future__ import annotations

import pytest

from flotilla.tenancy import RESOURCE_GPU, QueueProblem, QueueSpec, Quota, queue_for, validate_queues


def q(name: str, nominal: int = 4, parent: str | None = None, namespaces: tuple[str, ...] = (),
      borrowing: int | None = None, lending: int | None = None, weight: float = 1.0) -> QueueSpec:
    return QueueSpec(name, {RESOURCE_GPU: Quota(nominal, borrowing, lending)}, weight, parent, namespaces)


GPU = f"spec.quotas[{RESOURCE_GPU}]"

CASES = [
    ("sound tree", [q("dept", 8), q("a", 4, "dept"), q("b", 4, "dept"), q("c", 2)], None, []),
    ("unknown parent", [q("a", parent="nope")], None, [("a", "spec.parent", "parent queue 'nope' does not exist")]),
    ("own parent", [q("a", parent="a")], None, [("a", "spec.parent", "cannot be its own parent")]),
    ("cycle of two", [q("a", parent="b"), q("b", parent="a")], None,
     [("a", "spec.parent", "cycle: a -> b -> a")]),
    ("cycle of three", [q("a", 1, parent="c"), q("b", 1, parent="a"), q("c", 1, parent="b")], None,
     [("a", "spec.parent", "cycle: a -> c -> b -> a")]),
    ("children over the parent", [q("dept", 6), q("a", 4, "dept"), q("b", 4, "dept")], None,
     [("dept", f"{GPU}.nominal", "the children's nominal (8: a, b) exceeds the parent's (6)")]),
    ("negative nominal", [q("a", -1)], None, [("a", f"{GPU}.nominal", "nominal must be >= 0, got -1")]),
    ("negative borrowing limit", [q("a", borrowing=-2)], None,
     [("a", f"{GPU}.borrowingLimit", "borrowingLimit must be >= 0, got -2")]),
    ("negative lending limit", [q("a", lending=-1)], None,
     [("a", f"{GPU}.lendingLimit", "lendingLimit must be >= 0, got -1")]),
    ("lending above nominal", [q("a", 4, lending=5)], None,
     [("a", f"{GPU}.lendingLimit", "lendingLimit (5) must be <= nominal (4)")]),
    ("namespace claimed twice", [q("a", namespaces=("ml", "x")), q("b", namespaces=("ml",))], None,
     [("b", "spec.namespaces[0]", "namespace 'ml' is already served by queue 'a'")]),
    ("defined twice", [q("a"), q("a")], None, [("a", "metadata.name", "defined twice")]),
    ("weight zero", [q("a", weight=0)], None, [("a", "spec.weight", "weight must be > 0")]),
    ("roots over the cluster", [q("a", 6), q("b", 6)], {RESOURCE_GPU: 8},
     [("a", f"{GPU}.nominal", "root queues' nominal (12) exceeds the cluster's"), ("b", f"{GPU}.nominal", "(12)")]),
    ("roots within the cluster", [q("a", 6), q("b", 2), q("c", 5, "a")], {RESOURCE_GPU: 8}, []),
]


@pytest.mark.parametrize("queues, cluster, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_validate_queues(queues: list[QueueSpec], cluster: dict[str, int] | None,
                         expected: list[tuple[str, str, str]]) -> None:
    problems = validate_queues(queues, cluster)
    assert len(problems) == len(expected), problems
    for queue, field, words in expected:
        assert any(p.queue == queue and p.field == field and words in p.message for p in problems), (
            queue, field, words, problems)
    assert all(isinstance(p, QueueProblem) for p in problems)


@pytest.mark.parametrize("namespace, requested, expected", [
    ("ml", None, "a"), ("ml", "b", "b"), ("web", None, "b"), ("other", None, None), ("other", "", None)])
def test_queue_for(namespace: str, requested: str | None, expected: str | None) -> None:
    queues = [q("a", namespaces=("ml",)), q("b", namespaces=("web",))]
    assert queue_for(namespace, requested, queues) == expected
