"""The GPU budgets of queues: nominal first, then idle GPUs by weight within limits, down a tree; and what a
borrower keeps when nobody needs its GPUs back."""

from __future__ import annotations

import pytest

from flotilla.tenancy.shares import Claim, scaled, settle, split, split_tree


@pytest.mark.parametrize("capacity, claims, expected", [
    (16, [Claim("a", 8, 16), Claim("b", 8, 0)], {"a": 16, "b": 0}),  # an idle queue lends all
    (16, [Claim("a", 8, 16), Claim("b", 8, 2, lending_limit=3)], {"a": 11, "b": 2}),  # lends 3 of its 6 unused
    (16, [Claim("a", 8, 16, borrowing_limit=2), Claim("b", 8, 0)], {"a": 10, "b": 0}),
    (10, [Claim("a", 8, 16), Claim("b", 8, 16)], {"a": 5, "b": 5}),  # a lost node: nominals scaled together
    (24, [Claim("a", 4, 16, weight=3.0), Claim("b", 4, 16), Claim("c", 16, 0)], {"a": 16, "b": 8, "c": 0}),
    (16, [Claim("a", 8, 3), Claim("b", 8, 3)], {"a": 3, "b": 3}),  # nobody takes more than it wants
], ids=["lend-all", "lending-limit", "borrowing-limit", "lost-node", "weights", "demand"])
def test_split(capacity: int, claims: list[Claim], expected: dict[str, int]) -> None:
    assert split(capacity, claims) == expected


def test_split_tree_a_parent_bounds_its_children() -> None:
    claims = [Claim("p", 12, 0, borrowing_limit=0), Claim("a", 6, 20), Claim("b", 6, 0), Claim("c", 4, 0)]
    got = split_tree(24, claims, {"a": "p", "b": "p"})
    assert got == {"p": 0, "a": 12, "b": 0, "c": 0}  # b's idle share within p; nothing past p's nominal
    claims[0] = Claim("p", 12, 0)
    assert split_tree(24, claims, {"a": "p", "b": "p"})["a"] == 20


def test_scaled_keeps_the_total() -> None:
    assert scaled({"a": 8, "b": 8, "c": 8}, 16) == {"a": 6, "b": 5, "c": 5}
    assert scaled({"a": 3}, 16) == {"a": 3}


def test_settle_takes_back_only_what_a_floor_needs() -> None:
    # a holds 16, its budget is 8; b's budget 8 but it needs only 4 (its floor): a gives back 4.
    assert settle({"a": 8, "b": 8}, {"a": 16}, {"a": 8, "b": 4}, 16) == {"a": 12, "b": 4}
    # nobody needs a's borrowed GPUs: it keeps them.
    assert settle({"a": 8, "b": 8}, {"a": 16}, {"a": 8, "b": 0}, 16) == {"a": 16, "b": 0}
