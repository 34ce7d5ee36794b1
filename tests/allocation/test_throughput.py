import pytest

from flotilla.allocation import ScalingCurve
from flotilla.allocation.throughput import calibrated, departs

CURVE = ScalingCurve.of({1: 2.0, 4: 6.0})


@pytest.mark.parametrize("gpus, measured, expected", [
    (4, 6.0, False),
    (4, 4.9, False),  # 18% slow: within 20%
    (4, 4.7, True),
    (4, 7.5, True),  # faster than promised also counts
    (2, 2.0, True),  # the curve says 3.33 at 2 GPUs
])
def test_departs(gpus, measured, expected):
    assert departs(CURVE, gpus, measured) is expected


def test_calibrated_scales_every_point_through_the_measurement():
    slow = calibrated(CURVE, 4, 3.0)
    assert slow.points == ((1, 1.0), (4, 3.0))
    assert not departs(slow, 4, 3.0)


def test_bad_measurement_is_refused():
    with pytest.raises(ValueError, match="measured > 0"):
        calibrated(CURVE, 4, 0.0)
