"""OpenCV's Haar cascade: the fallback detector that needs no model file (OpenCV < 5 only).

`HaarDetector` runs `haarcascade_frontalface_default.xml` from the opencv wheel's own data
(`cv2.data.haarcascades`) on a grey copy of the frame resized to `detect_width` pixels wide (down to
save time; up, e.g. x2, to find faces smaller than the cascade's 24-pixel window), with the usual
`scale_factor` / `min_neighbors`; faces smaller than `min_face_px` full-frame pixels are not searched.
Scores are the number of merged neighbour windows; there are no landmarks. The interface is
`tracker.detect.FaceDetector`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np

from tracker.detect.regions import search_windows
from tracker.detect.windowed import frame_planes
from tracker.detection_scale import MIN_WINDOW_PX, detection_scale
from tracker.errors import ModelError
from tracker.types import Box, Detection, Frame

HAAR_CASCADE = "haarcascade_frontalface_default.xml"
_EXPECTED = "expected the XML that opencv-python(-headless) < 5 ships in cv2.data.haarcascades"


def default_cascade_path() -> Path:
    """The frontal-face cascade shipped inside the opencv wheel."""
    return Path(cv2.data.haarcascades) / HAAR_CASCADE  # type: ignore[attr-defined]  # cv2's stubs lack cv2.data


def check_cascade(path: Path) -> Path:
    """`path` if it is a regular file this process can open for reading; ModelError otherwise,
    before OpenCV sees it (its CascadeClassifier prints an [ERROR] line of its own for a file it
    cannot open). For `HaarDetector` and `tracker --check-config` alike (a wheel without the
    cascades, OpenCV 5's, passed the check and failed the run)."""
    try:
        if path.is_file():
            with open(path, "rb"):
                return path
    except OSError:
        pass
    raise ModelError(f"face detector: Haar cascade {str(path)!r} is not a readable file; {_EXPECTED}")


class HaarDetector:
    """OpenCV Haar cascade face detector (see module docstring). One instance per thread."""

    name = "haar"
    gives_landmarks = False

    def __init__(self, detect_width: int = 640, scale_factor: float = 1.1, min_neighbors: int = 5,
                 min_face_px: int = 24, cascade: Path | None = None) -> None:
        path = check_cascade(Path(cascade) if cascade is not None else default_cascade_path())
        try:
            self._cascade = cv2.CascadeClassifier(str(path))
            loaded = not self._cascade.empty()
        except (cv2.error, SystemError):  # a file that is not a cascade makes the constructor throw
            loaded = False
        if not loaded:
            raise ModelError(f"face detector: cannot load Haar cascade {str(path)!r}; {_EXPECTED}")
        self.detect_width = detect_width
        self.scale_factor = scale_factor
        self.min_neighbors = min_neighbors
        self.min_face_px = min_face_px

    @classmethod
    def from_config(cls, config) -> HaarDetector:
        """From a `tracker.config.DetectConfig`."""
        return cls(config.detect_width, config.scale_factor, config.min_neighbors, config.min_face_px)

    def detect(self, image: Frame | np.ndarray, regions: Sequence[Box] | None = None) -> list[Detection]:
        full, luma = frame_planes(image)
        full_h, full_w = full.shape[:2]
        grey = self._detect_image(luma if luma is not None else full)
        det_h, det_w = grey.shape
        sx, sy = full_w / det_w, full_h / det_h  # detection pixels -> full-frame pixels
        min_px = max(1, round(self.min_face_px / sx))
        if regions is None:
            windows = [(0, 0, det_w, det_h)]
        else:
            scaled = [Box(r.x / sx, r.y / sy, r.w / sx, r.h / sy) for r in regions]
            windows = search_windows(scaled, det_w, det_h, min_side=max(MIN_WINDOW_PX, 2 * min_px))
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
        """`image` as grey uint8 at detection scale (`tracker.detection_scale`, as the CNN
        detectors: a 16 x 12,000 strip from a photo folder was blown up to 640 x 480,000, 438 MB)."""
        h, w = image.shape[:2]
        k = detection_scale(w, h, self.detect_width)
        size = (max(1, round(w * k)), max(1, round(h * k)))
        if image.ndim == 3 and image.shape[2] == 1:
            image = image[:, :, 0]
        if size[0] == w:
            return image if image.ndim == 2 else cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)
        if size[0] < w:  # shrink first: the colour conversion then touches fewer pixels
            small = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
            return small if small.ndim == 2 else cv2.cvtColor(small, cv2.COLOR_BGR2GRAY)
        grey = image if image.ndim == 2 else cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)
        return cv2.resize(grey, size, interpolation=cv2.INTER_LINEAR)

