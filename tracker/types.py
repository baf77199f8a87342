"""Frozen dataclasses that cross module boundaries (docs/ARCHITECTURE.md, section 5).

Conventions shared by every stage:
- images are numpy uint8 arrays in OpenCV's BGR channel order, shape (H, W, 3), row-major;
- boxes are in pixels of the full-resolution frame, origin at the top-left corner;
- times are integer nanoseconds of the monotonic clock (`time.monotonic_ns`), the only clock the
  core reads; wall-clock time appears only where an event leaves the process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np


@dataclass(frozen=True)
class Frame:
    """One captured image. `seq` counts frames from 0 per source run, without gaps at the source
    (gaps downstream mean drops); `t_ns` is the monotonic capture time; `media_s` is the frame's
    position in its video, seconds from the start (files and the synthetic scene; None for
    cameras, streams and photo folders), so that an event can be found in the recording."""

    seq: int
    t_ns: int
    image: np.ndarray  # (H, W, 3) uint8 BGR
    media_s: float | None = None


@dataclass(frozen=True)
class Box:
    """An axis-aligned box in pixels: top-left (x, y), width w, height h (floats, w, h > 0)."""

    x: float
    y: float
    w: float
    h: float


Point = tuple[float, float]


@dataclass(frozen=True)
class Detection:
    """A face found in a frame.

    score:     detector confidence, larger is surer (YuNet, BlazeFace: a probability in [0, 1];
               Haar: the number of merged neighbour windows).
    landmarks: None (the detector gives none, e.g. Haar) or five (x, y) points in full-frame
               pixels, in this order: right eye, left eye, nose tip, right mouth corner, left mouth
               corner, "right" meaning the person's right (the image's left for a face looking at
               the camera). BlazeFace gives the mouth's centre only: both corners are that point.
    """

    box: Box
    score: float = 1.0
    landmarks: tuple[Point, ...] | None = None  # five points, or None


@dataclass(frozen=True)
class Inference:
    """A backend's output for a batch of N inputs.

    probs:     (N, classes) float32, each row sums to 1 (the model's probability blob).
    embedding: (N, D) float32 (the model's embedding blob, e.g. fc1 after ReLU, D = 128).
    """

    probs: np.ndarray
    embedding: np.ndarray


EventKind = Literal["entered", "identified", "left"]


@dataclass(frozen=True)
class Event:
    """Something a person did in front of the camera, produced once per confirmed track change.

    id:         unique id (uuid4 hex), stable across retries so consumers can de-duplicate.
    kind:       entered (track confirmed), identified (voted identity known or changed), left.
    identity:   enrolled name, or "unknown".
    confidence: the identity's voted confidence in [0, 1].
    t_ns:       monotonic time of the frame that caused the event.
    wall_time:  the same instant as Unix seconds (UTC), for consumers outside the process.
    snapshot:   path of the JPEG of the track's best face, or None.
    seq:        the source's sequence number of the frame that caused the event (Frame.seq).
    media_s:    that frame's position in its video, seconds (Frame.media_s), or None.
    """

    id: str
    kind: EventKind
    track_id: int
    identity: str
    confidence: float
    box: Box
    t_ns: int
    wall_time: float
    snapshot: str | None = field(default=None)
    seq: int | None = None
    media_s: float | None = None
