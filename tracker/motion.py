"""The motion gate: is anything moving? Cheap enough to run on every frame (well under 1 ms).

Background subtraction at low resolution: the frame is reduced to a `downscale_width`-pixel-wide
grey image (at most `MAX_ASPECT` times that high, as `tracker.detection_scale` bounds the
detectors' frames: so at most 4 x downscale_width^2 pixels), lightly blurred (so sensor noise does
not count), and compared with a running-average background (`cv2.accumulateWeighted`,
`learning_rate` per frame). Pixels differing by more than `threshold` grey levels are "changed";
the frame is moving when the changed fraction of the image is at least `min_area_fraction`. A
running average rather than plain frame differencing keeps a person who stops walking "moving" for
a few seconds (until they fade into the background at `learning_rate`), so detection does not stop
the moment someone stands still.

The first frame the background calls still after one it called moving is also compared, by the
same rule, with that last moving frame: the guard carries that frame's faces over the still frames
that follow, so the first of them must look like it. One black or grey frame (a camera's glitch,
an exposure or IR switch) is moving and finds no face; the background takes in only
`learning_rate` of it, so the frames after it, the scene as before, were still against the
background, and carried "no face" for as long as nothing moved: a person standing in view was
declared gone ("left") and not seen again until they moved. Only that first still frame: compared
frame to frame, a still scene under flickering light (or a noisy luma plane) moved on most frames,
which the running average exists to avoid.

`update()` returns a `Motion` with the bounding boxes of the changed blobs in full-frame pixels, for
detection restricted to moving regions. The first frame (and the first after a change of frame
size) has no background yet and counts as moving over the whole frame, so detection runs on it.
A disabled gate reports every frame as moving over the whole frame.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from tracker.detection_scale import asked_scale
from tracker.types import Box, Frame


@dataclass(frozen=True)
class Motion:
    """The gate's verdict on one frame.

    moving:   run detection on this frame.
    regions:  bounding boxes of the changed areas in full-frame pixels (empty when not moving;
              the whole frame on a first frame or when the gate is disabled).
    fraction: fraction of the low-resolution image that changed, in [0, 1]: against the background,
              or, for the first still frame after a moving one that differs from it, against that one.
    """

    moving: bool
    regions: tuple[Box, ...]
    fraction: float


class MotionGate:
    """Stateful: call `update()` once per frame, in order. Not thread-safe (one pipeline owns it)."""

    def __init__(self, enabled: bool = True, downscale_width: int = 160, threshold: int = 18,
                 min_area_fraction: float = 0.002, learning_rate: float = 0.05) -> None:
        self.enabled = enabled
        self.downscale_width = downscale_width
        self.threshold = float(threshold)
        self.min_area_fraction = min_area_fraction
        self.learning_rate = learning_rate
        self._background: np.ndarray | None = None  # (h, w) float32 running average
        # (h, w) uint8: the last frame that moved against the background, until the first still frame
        # after it has been compared with it (see the module docstring); None meanwhile
        self._last_moving: np.ndarray | None = None
        self._key: tuple[int, ...] | None = None  # (full h, full w, small h, small w)
        self._kernel = np.ones((3, 3), np.uint8)

    @classmethod
    def from_config(cls, config) -> MotionGate:
        """From a `tracker.config.MotionConfig`."""
        return cls(config.enabled, config.downscale_width, config.threshold, config.min_area_fraction)

    def update(self, frame: Frame | np.ndarray) -> Motion:
        """Judge one frame: a `Frame` (its `luma` plane is used when it has one) or an image, BGR
        (H, W, 3) or grey (H, W) uint8. Regions are in that frame's (image's) pixels."""
        image = frame.image if isinstance(frame, Frame) else frame
        full_h, full_w = image.shape[:2]
        whole = (Box(0.0, 0.0, float(full_w), float(full_h)),)
        if not self.enabled:
            return Motion(True, whole, 1.0)
        small = self._small_grey(frame, image)
        key = (full_h, full_w) + small.shape
        if self._background is None or key != self._key:
            self._background = small.astype(np.float32)
            self._key = key
            self._last_moving = small
            return Motion(True, whole, 1.0)
        diff = cv2.absdiff(small.astype(np.float32), self._background)
        cv2.accumulateWeighted(small, self._background, self.learning_rate)
        mask, fraction = self._changed(diff)
        if mask is None:  # still against the background; if the first since a moving frame, also like it?
            last_moving, self._last_moving = self._last_moving, None
            if last_moving is None:
                return Motion(False, (), fraction)
            mask, since_moving = self._changed(cv2.absdiff(small, last_moving))
            if mask is None:
                return Motion(False, (), fraction)
            fraction = since_moving
        else:
            self._last_moving = small
        joined = cv2.dilate(mask, self._kernel)  # join the fragments of one moving thing
        count, _, stats, _ = cv2.connectedComponentsWithStats(joined, connectivity=8)
        sx, sy = full_w / small.shape[1], full_h / small.shape[0]
        regions = tuple(
            Box(float(x * sx), float(y * sy), float(w * sx), float(h * sy))
            for x, y, w, h, _area in stats[1:count]
        )
        return Motion(True, regions, fraction)

    def _changed(self, diff: np.ndarray) -> tuple[np.ndarray | None, float]:
        """(the uint8 mask of the pixels of `diff` (h, w) over the threshold, or None when they are
        fewer than min_area_fraction of it; their fraction)."""
        mask = (diff > self.threshold).view(np.uint8)
        changed = cv2.countNonZero(mask)
        fraction = changed / mask.size
        return (None if changed == 0 or fraction < self.min_area_fraction else mask), fraction

    def _small_grey(self, frame: Frame | np.ndarray, image: np.ndarray) -> np.ndarray:
        """The blurred grey image at downscale_width (from the camera's luma plane if it has one)."""
        luma = getattr(frame, "luma", None)
        source = luma if luma is not None else image
        h, w = source.shape[:2]
        # downscale_width wide, or less for a frame taller than MAX_ASPECT of that (as the detectors'
        # scale: a 160 x 150,000 strip from a photo folder was compared whole, 330 MB); never enlarged
        scale = min(1.0, asked_scale(w, h, self.downscale_width))
        width, height = max(1, round(w * scale)), max(1, round(h * scale))
        # Shrink first, then convert: cvtColor touches 16x fewer pixels. Bilinear rather than area
        # averaging (8x cheaper here, ~0.05 ms vs 0.4 ms at 640 -> 160): the blur below does the
        # smoothing that keeps sensor noise under the threshold.
        small = cv2.resize(source, (width, height), interpolation=cv2.INTER_LINEAR)
        if small.ndim == 3:
            small = cv2.cvtColor(small, cv2.COLOR_BGR2GRAY)
        return cv2.GaussianBlur(small, (5, 5), 0)
