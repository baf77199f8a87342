"""Face detection: a small pluggable interface and the default detector, OpenCV's Haar cascade.

`FaceDetector.detect(image, regions=None) -> list[Detection]`:
- image: a `Frame` (its `luma` plane is used when the source provides one, e.g. the Pi camera's
  low-resolution stream) or an image, BGR (H, W, 3) or grey (H, W) uint8;
- regions: None searches the whole frame; a sequence of boxes (full-frame pixels, e.g. the motion
  gate's moving regions) searches only around them; an empty sequence searches nothing;
- returns boxes in full-frame pixels (of `frame.image`, or of the image given), each with a score
  (larger is surer; for Haar, the number of merged neighbour windows).

`HaarDetector` runs `haarcascade_frontalface_default.xml` from the opencv wheel's own data
(`cv2.data.haarcascades`) on a grey copy of the frame resized to `detect_width` pixels wide (down to
save time; up, e.g. x2, to find faces smaller than the cascade's 24-pixel window), with the usual
`scale_factor` / `min_neighbors`; faces smaller than `min_face_px` full-frame pixels are not searched.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import cv2
import numpy as np

from tracker.errors import ModelError
from tracker.types import Box, Detection, Frame

HAAR_CASCADE = "haarcascade_frontalface_default.xml"
# A moving blob is grown by this fraction of its larger side on every side before searching it,
# since only part of a face may have changed (e.g. its leading edge, or the middle of a face
# whose uniform cheeks hide the motion).
_ROI_GROWTH = 0.5
# When the regions to search cover more than this fraction of the frame, search the whole frame:
# one pass is cheaper than several overlapping ones.
_ROI_MAX_FRACTION = 0.6


@runtime_checkable
class FaceDetector(Protocol):
    """Anything that finds faces; see the module docstring for the contract."""

    def detect(self, image: Frame | np.ndarray, regions: Sequence[Box] | None = None) -> list[Detection]:
        ...


def default_cascade_path() -> Path:
    """The frontal-face cascade shipped inside the opencv wheel."""
    return Path(cv2.data.haarcascades) / HAAR_CASCADE


class HaarDetector:
    """OpenCV Haar cascade face detector (see module docstring). One instance per thread."""

    def __init__(self, detect_width: int = 640, scale_factor: float = 1.1, min_neighbors: int = 5,
                 min_face_px: int = 24, cascade: Path | None = None) -> None:
        path = Path(cascade) if cascade is not None else default_cascade_path()
        try:
            self._cascade = cv2.CascadeClassifier(str(path))
            loaded = not self._cascade.empty()
        except (cv2.error, SystemError):  # a file that is not a cascade makes the constructor throw
            loaded = False
        if not loaded:
            raise ModelError(f"face detector: cannot load Haar cascade {str(path)!r}; expected the XML that "
                             "opencv-python(-headless) < 5 ships in cv2.data.haarcascades")
        self.detect_width = detect_width
        self.scale_factor = scale_factor
        self.min_neighbors = min_neighbors
        self.min_face_px = min_face_px

    @classmethod
    def from_config(cls, config) -> HaarDetector:
        """From a `tracker.config.DetectConfig`."""
        return cls(config.detect_width, config.scale_factor, config.min_neighbors, config.min_face_px)

    def detect(self, image: Frame | np.ndarray, regions: Sequence[Box] | None = None) -> list[Detection]:
        full = image.image if isinstance(image, Frame) else image
        full_h, full_w = full.shape[:2]
        luma = getattr(image, "luma", None)
        grey = self._detect_image(luma if luma is not None else full)
        det_h, det_w = grey.shape
        sx, sy = full_w / det_w, full_h / det_h  # detection pixels -> full-frame pixels
        min_px = max(1, round(self.min_face_px / sx))
        if regions is None:
            windows = [(0, 0, det_w, det_h)]
        else:
            windows = _search_windows(regions, 1 / sx, 1 / sy, det_w, det_h, min_px)
        found = []
        for x0, y0, x1, y1 in windows:
            if x1 - x0 < min_px or y1 - y0 < min_px:
                continue
            rects, neighbours = self._cascade.detectMultiScale2(
                grey[y0:y1, x0:x1], scaleFactor=self.scale_factor, minNeighbors=self.min_neighbors,
                minSize=(min_px, min_px))
            for (x, y, w, h), n in zip(np.asarray(rects).reshape(-1, 4), np.asarray(neighbours).reshape(-1)):
                found.append(Detection(Box(float((x + x0) * sx), float((y + y0) * sy), float(w * sx), float(h * sy)),
                                       float(n)))
        return found

    def _detect_image(self, image: np.ndarray) -> np.ndarray:
        """`image` as grey uint8, `detect_width` pixels wide."""
        h, w = image.shape[:2]
        size = (self.detect_width, max(1, round(h * self.detect_width / w)))
        if size[0] == w:
            return image if image.ndim == 2 else cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)
        if size[0] < w:  # shrink first: the colour conversion then touches fewer pixels
            small = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
            return small if small.ndim == 2 else cv2.cvtColor(small, cv2.COLOR_BGR2GRAY)
        grey = image if image.ndim == 2 else cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)
        return cv2.resize(grey, size, interpolation=cv2.INTER_LINEAR)


def _search_windows(regions: Sequence[Box], kx: float, ky: float, width: int, height: int,
                    min_px: int) -> list[tuple[int, int, int, int]]:
    """Regions (full-frame boxes) -> grown, merged windows (x0, y0, x1, y1) in detection pixels;
    the whole image when they cover most of it."""
    boxes = []
    for r in regions:
        x0, y0, x1, y1 = r.x * kx, r.y * ky, (r.x + r.w) * kx, (r.y + r.h) * ky
        grow = max(_ROI_GROWTH * max(x1 - x0, y1 - y0), min_px / 2)
        boxes.append([max(0.0, x0 - grow), max(0.0, y0 - grow), min(float(width), x1 + grow), min(float(height), y1 + grow)])
    merged = True
    while merged:  # merge until no two windows overlap (a face on a seam would be missed)
        merged = False
        for i in range(len(boxes)):
            for j in range(i + 1, len(boxes)):
                a, b = boxes[i], boxes[j]
                if a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]:
                    boxes[i] = [min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3])]
                    del boxes[j]
                    merged = True
                    break
            if merged:
                break
    windows = [(int(x0), int(y0), int(np.ceil(x1)), int(np.ceil(y1))) for x0, y0, x1, y1 in boxes]
    if sum((x1 - x0) * (y1 - y0) for x0, y0, x1, y1 in windows) > _ROI_MAX_FRACTION * width * height:
        return [(0, 0, width, height)]
    return windows
