"""bench/distserve_sweep.py: how the sweep finds the best layout the judge meets a rate with (the target the
planner's pick is measured against), and that its judge imports nothing of Flotilla. DistServe's simulator
is not needed: the judge's verdicts are stated per layout."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from distserve_judge import JudgeLayout  # noqa: E402
from distserve_sweep import layouts_with, search_best  # noqa: E402


def test_the_judge_imports_nothing_of_flotilla() -> None:
    tree = ast.parse((BENCH / "distserve_judge.py").read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert names and not [n for n in names if n.startswith("flotilla")], names


def test_every_layout_of_a_level_uses_exactly_its_gpus_once() -> None:
    for gpus in range(1, 9):
        lays = layouts_with(gpus)
        assert lays and all(lay.gpus == gpus for lay in lays) and len(set(lays)) == len(lays)
    assert JudgeLayout(1, 1, 2, 1) in layouts_with(3) and JudgeLayout(n_colocated=3, tp_colocated=1) in layouts_with(3)


PICK = JudgeLayout(1, 2, 2, 1)  # 4 GPUs
SEED_LUCKY = JudgeLayout(1, 1, 2, 1)  # 3 GPUs, met on the first seed only
TWO = JudgeLayout(1, 1, 1, 1)  # 2 GPUs


def _search(met_first: set[JudgeLayout], met_all: set[JudgeLayout], pick_met: bool = True,
            descend: bool = True) -> tuple[JudgeLayout | None, JudgeLayout | None, list[JudgeLayout]]:
    asked: list[JudgeLayout] = []

    def met(lay: JudgeLayout) -> bool:
        asked.append(lay)
        return lay in met_first

    best, robust = search_best(PICK, pick_met, PICK.gpus - 1, descend, layouts_with, met, lambda lay: lay in met_all)
    return best, robust, asked


def test_nothing_smaller_met_leaves_the_pick_as_best_after_one_level() -> None:
    best, robust, asked = _search(set(), set())
    assert best == PICK and robust == PICK
    assert {lay.gpus for lay in asked} == {3} and len(asked) == len(layouts_with(3))


def test_the_search_goes_down_while_a_level_is_met() -> None:
    best, robust, asked = _search({SEED_LUCKY, TWO}, {SEED_LUCKY, TWO})
    assert best == TWO and robust == TWO  # two GPUs fewer than the pick, not one
    assert {lay.gpus for lay in asked} == {3, 2, 1}


def test_a_layout_met_on_the_first_seed_only_is_the_best_but_not_the_robust_best() -> None:
    best, robust, _ = _search({SEED_LUCKY}, set())
    assert best == SEED_LUCKY and robust == PICK
    other = JudgeLayout(2, 1, 1, 1)  # 3 GPUs too, after SEED_LUCKY in the fixed order
    assert layouts_with(3).index(SEED_LUCKY) < layouts_with(3).index(other)
    best, robust, _ = _search({SEED_LUCKY, other}, {other})
    assert best == SEED_LUCKY and robust == other  # the level's search goes on past a seed-lucky best


def test_a_pick_the_judge_does_not_meet_has_no_robust_best_of_its_own() -> None:
    best, robust, _ = _search(set(), set(), pick_met=False)
    assert best is None and robust is None


def test_at_risk_rows_search_one_level_only() -> None:
    _, _, asked = _search({SEED_LUCKY, TWO}, {SEED_LUCKY, TWO}, descend=False)
    assert {lay.gpus for lay in asked} == {3}
