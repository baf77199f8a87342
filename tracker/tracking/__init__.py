"""Multi-object tracking of boxes (SORT-style) and its MOTChallenge evaluation.

- `kalman`:   constant-velocity Kalman filter on a box (state u, v, s, r, du, dv, ds).
- `assign`:   IoU (+ optional embedding) cost and Hungarian assignment with IoU gating.
- `sort`:     `Tracker`, the per-frame state machine tentative -> confirmed -> lost -> ended.
- `mot`, `metrics`, `evaluate`, `noisy`: MOTChallenge files, CLEAR-MOT/IDF1, `tracker eval-mot`,
  and gt-derived noisy detections for evaluating the tracker without a detector.

Everything here except `mot` (files), `evaluate` (the command) and `noisy`'s command is pure: no
I/O, no clock, no globals.
"""

from tracker.tracking.sort import Tracker, TrackState, TrackView

__all__ = ["Tracker", "TrackState", "TrackView"]
