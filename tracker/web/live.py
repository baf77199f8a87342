"""The live view's frames: handed over by the guard's thread, drawn and encoded for the viewers.

The guard calls `wants_frame(t_ns)` every frame: False (one comparison) unless someone watches and
1/fps has passed since the last frame it handed over; then `offer(image, tracks, t_ns)` stores a
reference to the frame (sources make a new array per frame and nothing writes to it afterwards) and
the tracks to draw. So the guard neither copies, draws nor encodes anything, and nothing at all
while nobody watches. `jpeg()` (the web server's threads) draws the boxes, ids, identities and
confidences on a copy scaled to at most `width` pixels and encodes it once per frame, whatever the
number of viewers. Memory: one frame and one JPEG.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import cv2
import numpy as np

from tracker.identity import UNKNOWN
from tracker.types import Box

JPEG_QUALITY = 75
_KNOWN, _STRANGER, _TENTATIVE = (60, 200, 60), (0, 140, 255), (160, 160, 160)  # BGR


@dataclass(frozen=True)
class TrackMark:
    """One track as drawn: its box in frame pixels, id, and identity (UNKNOWN) with confidence."""

    track_id: int
    box: Box
    identity: str
    confidence: float
    confirmed: bool


class LiveFeed:
    def __init__(self, fps: float, width: int, max_viewers: int):
        self.interval_ns = int(1e9 / fps)
        self.width = width
        self.max_viewers = max_viewers
        self._lock = threading.Lock()
        self._encoding = threading.Lock()  # one encoder at a time: a second viewer waits and reuses it
        self._viewers = 0
        self._last_ns: int | None = None
        self._frame: tuple[np.ndarray, tuple[TrackMark, ...]] | None = None
        self.seq = 0  # bumped with every frame offered
        self._encoded: tuple[int, bytes] | None = None

    # -- the guard's side ------------------------------------------------------------------------

    def wants_frame(self, t_ns: int) -> bool:
        return self._viewers > 0 and (self._last_ns is None or t_ns - self._last_ns >= self.interval_ns)

    def offer(self, image: np.ndarray, tracks: tuple[TrackMark, ...], t_ns: int) -> None:
        """image: the frame, BGR (H, W, 3) uint8, not written to afterwards; tracks: in its pixels."""
        with self._lock:
            if not self._viewers:  # the last viewer left since wants_frame: hold nothing
                return
            self._frame = (image, tracks)
            self._last_ns = t_ns
            self.seq += 1

    # -- the viewers' side -----------------------------------------------------------------------

    def join(self) -> bool:
        """Count a new viewer in; False if max_viewers already watch."""
        with self._lock:
            if self._viewers >= self.max_viewers:
                return False
            self._viewers += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self._viewers -= 1
            if not self._viewers:
                self._frame, self._encoded, self._last_ns = None, None, None  # hold no frame while unwatched

    @property
    def viewers(self) -> int:
        return self._viewers

    def jpeg(self) -> tuple[int, bytes] | None:
        """(seq, JPEG) of the latest frame, drawn and encoded at most once per frame; None before
        the first frame."""
        with self._encoding:
            with self._lock:
                if self._frame is None:
                    return None
                if self._encoded is not None and self._encoded[0] == self.seq:
                    return self._encoded
                seq, (image, tracks) = self.seq, self._frame
            jpeg = render(image, tracks, self.width)  # outside _lock: the guard's offer never waits on it
            with self._lock:
                self._encoded = (seq, jpeg)
            return seq, jpeg


def render(image: np.ndarray, tracks: tuple[TrackMark, ...], width: int) -> bytes:
    """The frame scaled to at most `width` pixels wide with each track's box and label, as a JPEG."""
    scale = min(1.0, width / image.shape[1])
    canvas = (cv2.resize(image, (round(image.shape[1] * scale), round(image.shape[0] * scale)),
                         interpolation=cv2.INTER_AREA) if scale < 1.0 else image.copy())
    for mark in tracks:
        colour = _TENTATIVE if not mark.confirmed else _STRANGER if mark.identity == UNKNOWN else _KNOWN
        x, y = round(mark.box.x * scale), round(mark.box.y * scale)
        w, h = round(mark.box.w * scale), round(mark.box.h * scale)
        cv2.rectangle(canvas, (x, y), (x + w, y + h), colour, 2)
        label = f"#{mark.track_id} {mark.identity}" + (f" {mark.confidence:.2f}" if mark.identity != UNKNOWN else "")
        (tw, th), base = cv2.getTextSize(label, cv2.FONT_HERSHEY_SIMPLEX, 0.5, 1)
        top = max(0, y - th - base - 4)
        cv2.rectangle(canvas, (x, top), (x + tw + 6, top + th + base + 4), colour, cv2.FILLED)
        cv2.putText(canvas, label, (x + 3, top + th + 2), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 0, 0), 1, cv2.LINE_AA)
    ok, encoded = cv2.imencode(".jpg", canvas, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
    if not ok:
        raise RuntimeError("cv2.imencode failed on a live frame")
    return encoded.tobytes()
