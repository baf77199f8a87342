"""The constant-velocity box Kalman filter (tracker/tracking/kalman.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tracker.tracking.kalman import BoxKalman, box_to_measurement, state_to_box
from tracker.types import Box


def _close(a: Box, b: Box, tol: float) -> bool:
    return all(abs(p - q) <= tol for p, q in zip((a.x, a.y, a.w, a.h), (b.x, b.y, b.w, b.h)))


def test_measurement_roundtrip():
    box = Box(12.5, -3.0, 40.0, 64.0)
    z = box_to_measurement(box)
    assert z.tolist() == pytest.approx([32.5, 29.0, 2560.0, 40.0 / 64.0])
    assert _close(state_to_box(z), box, 1e-9)


def test_constant_velocity_is_learned_and_predicted():
    kf = BoxKalman(Box(100, 200, 40, 60))
    for t in range(1, 8):
        kf.predict()
        kf.update(Box(100 + 3 * t, 200 - 2 * t, 40, 60))
    du, dv = kf.state[4:6]
    assert du == pytest.approx(3.0, abs=0.05) and dv == pytest.approx(-2.0, abs=0.05)
    # Five frames ahead without measurements: still on the line.
    for t in range(8, 13):
        predicted = kf.predict()
        assert _close(predicted, Box(100 + 3 * t, 200 - 2 * t, 40, 60), 0.5), (t, predicted)


def test_first_prediction_has_no_velocity():
    kf = BoxKalman(Box(10, 20, 30, 40))
    assert _close(kf.predict(), Box(10, 20, 30, 40), 1e-9)


def test_growing_box_scale_velocity():
    # A face coming towards the camera, its area growing at a constant 120 px^2/frame (the
    # model's own assumption: s moves at constant velocity) around a fixed centre.
    def box(t):
        side = float(np.sqrt(1600 + 120 * t))
        return Box(200 - side / 2, 150 - side / 2, side, side)

    kf = BoxKalman(box(0))
    for t in range(1, 12):
        kf.predict()
        kf.update(box(t))
    assert kf.state[6] == pytest.approx(120, rel=0.05)
    for t in range(12, 15):
        assert _close(kf.predict(), box(t), 0.3)


def test_noisy_measurements_are_smoothed():
    rng = np.random.default_rng(7)
    kf = BoxKalman(Box(50, 50, 40, 40))
    raw_err, filt_err = [], []
    for t in range(1, 60):
        true = Box(50 + 4 * t, 50 + 1 * t, 40, 40)
        noisy = Box(true.x + rng.normal(0, 3), true.y + rng.normal(0, 3), 40, 40)
        kf.predict()
        post = kf.update(noisy)
        if t > 10:
            raw_err.append(np.hypot(noisy.x - true.x, noisy.y - true.y))
            filt_err.append(np.hypot(post.x - true.x, post.y - true.y))
    assert np.mean(filt_err) < 0.8 * np.mean(raw_err)


def test_shrinking_box_never_reaches_zero_area():
    """The scale velocity stops where the next step would cross zero area, so the box keeps the
    last positive area it had (135 px^2 here): without the stop it would be extrapolated through
    zero and reported at the 0.01 px^2 floor state_to_box clamps to."""
    kf = BoxKalman(Box(0, 0, 100, 100))
    for t in range(1, 6):
        kf.predict()
        kf.update(Box(0, 0, 100 - 15 * t, 100 - 15 * t))
    areas = []
    for _ in range(50):  # keep predicting with no measurement
        b = kf.predict()
        assert b.w > 0 and b.h > 0
        assert np.all(np.isfinite([b.x, b.y, b.w, b.h]))
        areas.append(b.w * b.h)
    assert areas == sorted(areas, reverse=True)  # it shrinks, then stays
    assert areas[-1] > 100.0 and areas[-40:] == pytest.approx([areas[-1]] * 40)


def test_peek_gives_the_box_predict_gives_for_a_shrinking_box():
    """peek applied the transition without predict's stop at zero area: a 0.1 px box where
    predict gave 11.6 px."""
    kf = BoxKalman(Box(0, 0, 100, 100))
    for t in range(1, 6):
        kf.predict()
        kf.update(Box(0, 0, 100 - 15 * t, 100 - 15 * t))
    for _ in range(4):
        peeked = kf.peek()
        assert kf.predict() == peeked


def test_covariance_stays_symmetric_positive_definite():
    rng = np.random.default_rng(1)
    kf = BoxKalman(Box(0, 0, 30, 50))
    for t in range(200):
        kf.predict()
        if t % 3:
            kf.update(Box(rng.normal(t, 2), rng.normal(0, 2), 30 + rng.normal(0, 1), 50 + rng.normal(0, 1)))
        P = kf.covariance
        assert np.allclose(P, P.T, rtol=1e-9, atol=1e-9)
        assert np.linalg.eigvalsh(P).min() > 0
