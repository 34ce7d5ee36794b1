"""Counters become rates in the agent: first sample, resets, gaps, repeated scrapes."""

import pytest

from flotilla.agent.rates import CounterRates


def test_first_sample_gives_no_rate_then_the_increase_per_second():
    rates = CounterRates()
    assert rates.rate("errors", 10.0, 100.0) is None
    assert rates.rate("errors", 12.0, 106.0) == 3.0
    assert rates.rate("errors", 13.0, 106.0) == 0.0


def test_series_are_kept_apart_by_key():
    rates = CounterRates()
    rates.rate(("replay", 0), 1.0, 5.0)
    assert rates.rate(("replay", 1), 2.0, 50.0) is None
    assert rates.rate(("replay", 0), 2.0, 7.0) == 2.0


def test_a_counter_that_goes_down_was_reset_and_counted_up_from_zero():
    rates = CounterRates()
    rates.rate("errors", 0.0, 1000.0)
    assert rates.rate("errors", 2.0, 8.0) == 4.0      # driver reload: 8 new errors in 2 s, never a negative rate
    assert rates.rate("errors", 3.0, 9.0) == 1.0


def test_a_gap_longer_than_max_gap_restarts_the_series():
    rates = CounterRates(max_gap=30.0)
    rates.rate("errors", 0.0, 0.0)
    assert rates.rate("errors", 100.0, 500.0) is None   # 70 s silent: no average over the silence
    assert rates.rate("errors", 101.0, 503.0) == 3.0
    assert rates.rate("errors", 131.0, 533.0) == 1.0     # exactly max_gap still counts


def test_a_repeated_or_older_sample_gives_no_rate_and_keeps_the_last():
    rates = CounterRates()
    rates.rate("errors", 5.0, 10.0)
    assert rates.rate("errors", 5.0, 10.0) is None
    assert rates.rate("errors", 4.0, 2.0) is None
    assert rates.rate("errors", 6.0, 12.0) == 2.0


def test_max_gap_must_be_positive():
    with pytest.raises(ValueError, match="max_gap"):
        CounterRates(max_gap=0)
