"""Layouts derived from ones already made (`_Ledger.refloored`, `elastic._trial_from`) decide exactly as
layouts made afresh.

* The invariant test's random worlds (arrivals, progress, completions, node losses, recalibrations) driven
  with both at every re-plan, every decision compared.
* A newcomer's trial made from the layout of all the newcomers (`_trial_from`) against `with_job`, on random
  ledgers shaped like the slow re-plans at scale (an admitted job's guarantee lost for good, newcomers
  waiting); and that this comparison catches a trial made from the wrong layout. (tests/allocation/
  test_elastic.py does the same for `refloored`.)
"""

from __future__ import annotations

import random

import test_invariant
from builders import job

from flotilla.allocation import elastic
from flotilla.allocation.elastic import DeadlineElastic, _Ledger

# With the guarantees lost for good left out of the ledger, only these of the first 240 worlds lay it out at
# the promised shares (`DeadlineElastic.decide`'s own `refloored`): a guarantee lost that another plan might keep.
SEEDS = tuple(range(40)) + (144, 150, 210)


def test_reused_layouts_decide_as_fresh_ones(monkeypatch):
    decide = DeadlineElastic.decide
    seen = {"decisions": 0, "differing": 0, "refloored": 0, "trials_reused": 0}

    def both(self, snapshot):
        fresh = DeadlineElastic()
        fresh.reuse_layouts = False
        slow = decide(fresh, snapshot)
        seen["decisions"] += 1
        seen["differing"] += decide(self, snapshot) != slow
        return slow  # the world moves on the slow path's decisions: both see the same snapshots

    def counted(name, f):
        def wrapper(*args, **kwargs):
            made = f(*args, **kwargs)
            seen[name] += made is not None
            return made
        return wrapper

    monkeypatch.setattr(DeadlineElastic, "decide", both)
    monkeypatch.setattr(_Ledger, "refloored", counted("refloored", _Ledger.refloored))
    monkeypatch.setattr(elastic, "_trial_from", counted("trials_reused", elastic._trial_from))
    for seed in SEEDS:
        test_invariant.test_only_a_node_loss_breaks_a_guarantee(seed)
    assert seen["differing"] == 0, seen
    # Both shortcuts are taken (refloored also by each trial reused), often enough to mean something.
    assert seen["refloored"] - seen["trials_reused"] >= 15 and seen["trials_reused"] >= 50, seen


def _trials(seed: int, trials: int = 30):
    """(made from the whole layout, made by with_job) for newcomers tried in turn on random ledgers."""
    rng = random.Random(seed)
    for _ in range(trials):
        admitted = [job(f"a{i}", rng.randint(50, 3000), rng.uniform(40, 900), max_gpus=8,
                        restore=rng.uniform(0, 20), done=rng.choice((0, 0, rng.randint(1, 40)))) for i in range(70)]
        admitted.append(job("hopeless", 10**6, 100.0, max_gpus=8))
        newcomers = [job(f"n{i}", rng.randint(50, 2000), rng.uniform(40, 900), max_gpus=8) for i in range(4)]
        held = {j.key: rng.choice((0, 0, 1, 2, 4)) for j in admitted}
        promised = {j.key: rng.choice((0, 1, 1, 2)) for j in admitted}
        whole = _Ledger.of(0.0, 24, admitted + newcomers, held)
        ledger = whole.without({j.key for j in newcomers}).refloored(promised)
        for k, newcomer in enumerate(newcomers):
            made = elastic._trial_from(whole, ledger, newcomer, newcomers[k + 1:])
            ledger = ledger.with_job(newcomer)
            if made is not None:
                yield made, ledger


def _same_ledger(a, b) -> bool:
    return (a.got == b.got and a.tight == b.tight and [j.key for j in a.order] == [j.key for j in b.order]
            and (a.profile.bounds == b.profile.bounds).all() and (a.profile._free == b.profile._free).all())


def test_a_trial_made_from_the_layout_of_all_newcomers_is_with_job():
    pairs = list(_trials(5))
    assert len(pairs) >= 20
    assert all(_same_ledger(made, plain) for made, plain in pairs)


def test_the_trial_comparison_fails_when_the_waiting_newcomers_are_left_in(monkeypatch):
    def with_the_waiting_ones(whole, ledger, job, later):
        return whole.refloored(ledger.floor)

    monkeypatch.setattr(elastic, "_trial_from", with_the_waiting_ones)
    assert any(not _same_ledger(made, plain) for made, plain in _trials(5))
