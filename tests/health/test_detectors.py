"""The peer-group outlier and straggler detectors on small hand-built cases."""

import numpy as np
import pytest

from flotilla.health.metrics import COMPARED, COMPARED_INDEX
from flotilla.health.peers import PeerOutlierDetector
from flotilla.health.straggler import StragglerDetector
from flotilla.health.window import RollingMedian, nanmedian0

K = len(COMPARED)
UTIL = COMPARED_INDEX["gpu_util"]


def healthy_row(n: int, rng: np.random.Generator, util: float = 95.0) -> np.ndarray:
    row = np.full((n, K), 100.0) + rng.normal(0, 0.5, (n, K))
    row[:, UTIL] = util + rng.normal(0, 1.0, n)
    return row


def run(rows: list[np.ndarray], window: int = 4, continuity: int = 3) -> list[tuple[int, int]]:
    """(evaluation index, machine) of every finding."""
    det = PeerOutlierDetector(rows[0].shape[0], window=window, continuity=continuity, threshold=3.0, clip=8.0)
    peers = np.ones(rows[0].shape[0], dtype=bool)
    return [(t, f.member) for t, row in enumerate(rows) for f in det.update(row, peers)]


def test_rolling_median_skips_missing_cells_and_forgets_old_rows():
    rm = RollingMedian(3, (2,), skip_missing=True)
    assert np.allclose(rm.push(np.array([1.0, np.nan])), [1.0, np.nan], equal_nan=True)
    assert np.allclose(rm.push(np.array([3.0, 4.0])), [2.0, 4.0])
    assert np.allclose(rm.push(np.array([100.0, 6.0])), [3.0, 5.0])
    assert np.allclose(rm.push(np.array([5.0, 8.0])), [5.0, 6.0])   # the 1.0 has left the window


def test_machine_that_stays_low_is_confirmed_after_the_continuity_window():
    rng = np.random.default_rng(1)
    rows = [healthy_row(6, rng) for _ in range(12)]
    for row in rows[4:]:
        row[2, UTIL] = 40.0          # z = -55/scale, clipped to 8 in the bad direction
    findings = run(rows)
    # window 4 at clip 8: the median passes 3 once half the window is bad (t=5); 3 in a row -> t=7
    assert findings[0] == (7, 2)
    assert {m for _, m in findings} == {2}


def test_load_shift_on_every_machine_is_not_flagged():
    rng = np.random.default_rng(2)
    rows = [healthy_row(8, rng, util=95.0 if t < 10 else 30.0) for t in range(30)]
    assert run(rows) == []


def test_one_sample_spike_is_not_enough():
    rng = np.random.default_rng(3)
    rows = [healthy_row(6, rng) for _ in range(20)]
    rows[8][1, UTIL] = 0.0
    assert run(rows) == []


def test_finding_carries_the_metric_value_and_peer_median():
    rng = np.random.default_rng(4)
    rows = [healthy_row(5, rng) for _ in range(8)]
    for row in rows:
        row[0, COMPARED_INDEX["temperature"]] = 130.0
    det = PeerOutlierDetector(5, window=2, continuity=2, threshold=3.0, clip=8.0)
    out = [f for row in rows for f in det.update(row, np.ones(5, dtype=bool))]
    assert out and out[0].metric == "temperature" and out[0].value == 130.0
    # 30 C above the peers, in units of the temperature floor (5 C): the scale when the peers agree closely
    assert 99 < out[0].peer_median < 101 and out[0].score == pytest.approx(30 / 5, abs=0.1)


def test_too_few_peers_decide_nothing():
    det = PeerOutlierDetector(3, window=1, continuity=1, threshold=3.0, clip=8.0)
    values = np.full((3, K), 100.0)
    values[0, UTIL] = 0.0
    assert det.update(values, np.array([True, True, False])) == []
    assert [f.member for f in det.update(values, np.ones(3, dtype=bool))] == [0]


def cusum(groups, shift=0.05, threshold=12.0, window=60):
    return StragglerDetector(groups, shift=shift, threshold=threshold, window=window, min_sigma=0.005)


def first_alarm(det, steps: int, times) -> dict[int, int]:
    """rank -> first step at which it was a straggler, over `steps` steps of `times(t)`."""
    found: dict[int, int] = {}
    peers = np.ones(len(det.groups), dtype=bool)
    for t in range(steps):
        for f in det.update(times(t), peers):
            found.setdefault(f.member, t)
    return found


@pytest.mark.parametrize("slow", [0.05, 0.10, 0.30])
def test_cusum_finds_a_steady_slowdown_given_enough_steps(slow):
    rng = np.random.default_rng(5)
    det = cusum([0] * 8)
    found = first_alarm(det, 400, lambda t: np.exp(rng.normal(0, 0.02, 8)) * np.where(
        (np.arange(8) == 3) & (t >= 100), 1.0 + slow, 1.0))
    assert set(found) == {3}
    # the sequential test needs fewer steps the larger the slowdown; 5 % under 2 % noise within a minute
    assert found[3] - 100 <= {0.05: 60, 0.10: 15, 0.30: 8}[slow]


def test_cusum_stays_quiet_on_noise_with_spikes():
    rng = np.random.default_rng(6)
    det = cusum([0] * 16)
    times = lambda t: np.exp(rng.normal(0, 0.03, 16)) * np.where(rng.random(16) < 0.01, 1.3, 1.0)  # noqa: E731
    assert first_alarm(det, 3000, times) == {}


def test_cusum_compares_within_the_role_group():
    rng = np.random.default_rng(7)
    # a 2-stage pipeline: the last stage's ranks compute 12 % longer; none of them is slow
    det = cusum([0, 1] * 6)
    assert first_alarm(det, 600, lambda t: np.exp(rng.normal(0, 0.02, 12)) * np.tile([1.0, 1.12], 6)) == {}
    # ... and with one group for everyone the whole last stage would look slow
    det = cusum([0] * 12)
    found = first_alarm(det, 600, lambda t: np.exp(rng.normal(0, 0.02, 12)) * np.tile([1.0, 1.12], 6))
    assert set(found) == {1, 3, 5, 7, 9, 11}


def test_all_ranks_slowing_down_together_is_no_straggler():
    det = cusum([0] * 6)
    rng = np.random.default_rng(8)
    assert first_alarm(det, 300, lambda t: np.exp(rng.normal(0, 0.01, 6)) * (1.0 if t < 100 else 2.0)) == {}


def test_a_rank_alone_in_its_role_is_watched_against_its_own_history():
    rng = np.random.default_rng(9)
    groups = [0, 0, 0, 0, 1]   # the last rank is the only one of its role (and 12 % slower by design)
    base = np.array([1.0, 1.0, 1.0, 1.0, 1.12])
    quiet = cusum(groups)
    assert first_alarm(quiet, 600, lambda t: base * np.exp(rng.normal(0, 0.02, 5)) * (1.3 if 200 <= t < 260 else 1)) == {}
    slow = cusum(groups)
    found = first_alarm(slow, 600, lambda t: base * np.exp(rng.normal(0, 0.02, 5)) * np.where(
        (np.arange(5) == 4) & (t >= 300), 1.10, 1.0))
    assert set(found) == {4} and found[4] - 300 <= 30


def test_missing_step_reports_do_not_count_as_slow():
    det = cusum([0] * 4)
    for _ in range(100):
        assert det.update(np.array([1.0, 1.0, 1.0, np.nan]), np.ones(4, dtype=bool)) == []


def test_nanmedian0_matches_numpy():
    rng = np.random.default_rng(6)
    for shape in [(5, 7), (6, 3, 4), (1, 4)]:
        a = rng.normal(size=shape)
        a[rng.random(shape) < 0.3] = np.nan
        a[:, 0] = np.nan
        with np.errstate(all="ignore"), pytest.warns(RuntimeWarning):
            expected = np.nanmedian(a, axis=0)
        assert np.allclose(nanmedian0(a), expected, equal_nan=True)
