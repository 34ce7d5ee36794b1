"""The chaos suite, controller side (e2e/chaos/controller_cases.py): the metrics pipeline failing, the
controller restarted with a backlog, agent clocks skewed, a real fault as the control, forged samples and
serving statistics, and the REST API fuzzed from its OpenAPI schema. Each case is one test."""

from __future__ import annotations

import pytest

from e2e.chaos.controller_cases import CASES
from e2e.chaos.outcome import COUNTERS


@pytest.mark.parametrize("case", list(CASES))
def test_chaos(case, log_dir):
    outcome = CASES[case](log_dir)
    counted = ", ".join(f"{c}={getattr(outcome, c)}" for c in COUNTERS if getattr(outcome, c))
    assert outcome.ok(), f"{case} ({outcome.seconds:.0f} s){': ' + counted if counted else ''}: {outcome.details}"
