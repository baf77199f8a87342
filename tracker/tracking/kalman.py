"""A constant-velocity Kalman filter on one box, as described in the SORT paper.

Bewley et al., "Simple Online and Realtime Tracking" (ICIP 2016), section 3.2: each target's state
is

    x = [u, v, s, r, du, dv, ds]

with (u, v) the box centre in pixels, s its scale (area, px^2) and r its aspect ratio (w / h). The
centre and the scale move at constant velocity (du, dv in px/frame, ds in px^2/frame); the aspect
ratio is modelled as constant. A detection observes [u, v, s, r] directly.

The noise model is this project's own choice: every standard deviation but the aspect ratio's
(absolute: r has no unit) is proportional to the box (its side sqrt(s) for positions and their
velocities, its area s for the scale and its velocity), so a face 40 px wide and one 300 px wide
are filtered alike. The covariances are recomputed from the
current estimate at each step. Time is counted in frames: the filter has no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracker.types import Box

# Smallest area (px^2) and aspect ratio the filter will report: a box must keep w, h > 0 (Box's
# contract) even when a shrinking track's predicted area would cross zero. No larger than the
# boxes eval-mot reads (tracking.mot: sides from MIN_SIDE 1e-3 to MAX_PIXELS 1e6, so areas from
# 1e-6 and aspects from 1e-9): with 1e-2 and 1e-3, a 0.05 px box came out 0.1 px (IoU 0.25 with
# itself: a new track every frame) and a 0.5 x 2,000 one as 1 x 1,000.
_MIN_AREA = 1e-6
_MIN_ASPECT = 1e-9


@dataclass(frozen=True)
class KalmanNoise:
    """Standard deviations, as fractions of the box side sqrt(s) (positions and their velocities,
    px and px/frame) or of its area s (scale and scale velocity), or absolute (aspect ratio).

    measure_*:  detector noise on one observation.
    process_*:  how much the true state may drift per frame beyond constant velocity.
    initial_*:  uncertainty of the (unobserved, zero) velocities of a newly born track.

    The defaults assume a detector whose boxes jitter by about a tenth of their size from frame to
    frame and targets (walking people, faces) whose velocity changes slowly; they were chosen
    with gt-derived noisy detections of TUD-Campus/TUD-Stadtmitte (seeds 0..3), where doubling
    `measure_pos` or halving `process_vel` from a first guess removed most identity switches.
    """

    measure_pos: float = 0.10
    measure_scale: float = 0.10
    measure_aspect: float = 0.05
    process_pos: float = 0.02
    process_scale: float = 0.02
    process_aspect: float = 0.01
    process_vel: float = 0.01
    process_scale_vel: float = 0.01
    initial_vel: float = 0.5
    initial_scale_vel: float = 0.2


DEFAULT_NOISE = KalmanNoise()

# Transition: u += du, v += dv, s += ds; r and the velocities persist.
_F = np.eye(7)
_F[0, 4] = _F[1, 5] = _F[2, 6] = 1.0
# Observation: the first four state components.
_H = np.eye(4, 7)


def _advanced(x: np.ndarray) -> np.ndarray:
    """State `x` one frame on under constant velocity (a new array)."""
    x = x.copy()
    # A shrinking box must not be extrapolated through zero area: stop its scale velocity.
    if x[2] + x[6] <= 0.0:
        x[6] = 0.0
    return _F @ x


def box_to_measurement(box: Box) -> np.ndarray:
    """[u, v, s, r] float64 (4,) of a box: centre px, area px^2, aspect w/h."""
    return np.array([box.x + box.w / 2.0, box.y + box.h / 2.0, box.w * box.h, box.w / box.h], dtype=np.float64)


def state_to_box(state: np.ndarray) -> Box:
    """The Box of a state (or measurement) vector whose first four entries are [u, v, s, r]."""
    u, v = float(state[0]), float(state[1])
    s = max(float(state[2]), _MIN_AREA)
    r = max(float(state[3]), _MIN_ASPECT)
    w = float(np.sqrt(s * r))
    h = s / w
    return Box(u - w / 2.0, v - h / 2.0, w, h)


class BoxKalman:
    """Kalman filter of one track's box. Call `predict()` once per frame, then `update(box)` if a
    detection was assigned to the track in that frame.

    State and covariance are float64; `state` is (7,), `covariance` (7, 7); both are copies.
    """

    def __init__(self, box: Box, noise: KalmanNoise = DEFAULT_NOISE):
        self._noise = noise
        z = box_to_measurement(box)
        self._x = np.concatenate([z, np.zeros(3)])
        side, area = self._side_area()
        n = noise
        self._P = np.diag(
            np.square(
                [
                    n.measure_pos * side,
                    n.measure_pos * side,
                    n.measure_scale * area,
                    n.measure_aspect,
                    n.initial_vel * side,
                    n.initial_vel * side,
                    n.initial_scale_vel * area,
                ]
            )
        )

    def _side_area(self) -> tuple[float, float]:
        area = max(float(self._x[2]), _MIN_AREA)
        return float(np.sqrt(area)), area

    @property
    def state(self) -> np.ndarray:
        return self._x.copy()

    @property
    def covariance(self) -> np.ndarray:
        return self._P.copy()

    @property
    def box(self) -> Box:
        """The current estimate (prior after `predict`, posterior after `update`)."""
        return state_to_box(self._x)

    def copy(self) -> BoxKalman:
        """An independent filter in the same state (to roll back to later)."""
        twin = BoxKalman.__new__(BoxKalman)
        twin._noise, twin._x, twin._P = self._noise, self._x.copy(), self._P.copy()
        return twin

    def peek(self) -> Box:
        """The box `predict()` would give, without changing the filter."""
        return state_to_box(_advanced(self._x))

    def predict(self) -> Box:
        """Advance one frame under constant velocity; returns the predicted box."""
        side, area = self._side_area()
        n = self._noise
        q = np.square(
            [
                n.process_pos * side,
                n.process_pos * side,
                n.process_scale * area,
                n.process_aspect,
                n.process_vel * side,
                n.process_vel * side,
                n.process_scale_vel * area,
            ]
        )
        self._x = _advanced(self._x)
        self._P = _F @ self._P @ _F.T + np.diag(q)
        return self.box

    def update(self, box: Box) -> Box:
        """Correct the estimate with an observed box; returns the posterior box."""
        z = box_to_measurement(box)
        side, area = self._side_area()
        n = self._noise
        R = np.diag(np.square([n.measure_pos * side, n.measure_pos * side, n.measure_scale * area, n.measure_aspect]))
        innovation = z - _H @ self._x
        S = _H @ self._P @ _H.T + R
        # K = P H^T S^-1, solved rather than inverted (S is symmetric positive definite).
        K = np.linalg.solve(S, _H @ self._P).T
        self._x = self._x + K @ innovation
        # Joseph form keeps P symmetric positive semi-definite despite rounding.
        I_KH = np.eye(7) - K @ _H
        self._P = I_KH @ self._P @ I_KH.T + K @ R @ K.T
        return self.box
