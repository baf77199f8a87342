"""What the CNN detectors (YuNet, BlazeFace) share: frame checks, scaling to `detect_width`,
search windows, mapping back to full-frame pixels, and dropping impossible boxes.

A subclass implements `_detect_window(bgr) -> (N, 15) float32` for one BGR uint8 window at
detection scale: per face x, y, w, h (window pixels), five landmarks as x, y pairs in the order
of `tracker.types.Detection`, and a score in [0, 1].
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from tracker.crops import aligned_region_side
from tracker.detect.regions import search_windows
from tracker.detection_scale import MIN_WINDOW_PX, detection_scale
from tracker.errors import InputError
from tracker.types import Box, Detection, Frame

# The aligned crop's region of a face, in sides of its box: a real detector's landmarks ask for
# about 2 (at most 5.5 on dlib's photos at any score, YuNet and BlazeFace).
MAX_REGION_BOXES = 8


def frame_planes(image: Frame | np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(full image, luma plane or None) of a Frame or an image; InputError for an image that is
    not (H, W), (H, W, 1) or (H, W, 3) uint8 with H, W >= 1 (a programming error upstream)."""
    full = image.image if isinstance(image, Frame) else image
    luma = getattr(image, "luma", None)
    if not isinstance(full, np.ndarray) or full.dtype != np.uint8 or full.ndim not in (2, 3) \
            or (full.ndim == 3 and full.shape[2] not in (1, 3)) or full.size == 0:
        shape = getattr(full, "shape", None)
        raise InputError(f"face detector: bad frame of shape {shape} and dtype {getattr(full, 'dtype', None)}; "
                         "expected a non-empty (H, W) grey or (H, W, 3) BGR uint8 image")
    return full, luma


class WindowedDetector:
    """Base of the CNN detectors. detect_width: frames are scaled to this width before detection
    (pixels; e.g. 320 on a Pi 3; bounded as `tracker.detection_scale` says); score_threshold:
    smallest score kept, in [0, 1]."""

    name = "windowed"
    gives_landmarks = True

    def __init__(self, detect_width: int, score_threshold: float) -> None:
        self.detect_width = int(detect_width)
        self.score_threshold = float(score_threshold)

    def detect(self, image: Frame | np.ndarray, regions: Sequence[Box] | None = None) -> list[Detection]:
        full, luma = frame_planes(image)
        full_h, full_w = full.shape[:2]
        source = luma if luma is not None else full
        src_h, src_w = source.shape[:2]
        k = detection_scale(full_w, full_h, self.detect_width)  # frame -> detection pixels
        if full_h * k < MIN_WINDOW_PX or full_w * k < MIN_WINDOW_PX:
            return []  # smaller than the detector's minimum: nothing to find (refused for a camera's frames)
        if regions is None:
            windows = [(0, 0, full_w, full_h)]
        else:
            windows = search_windows(regions, full_w, full_h, min_side=MIN_WINDOW_PX / k)
        found: list[Detection] = []
        sx, sy = src_w / full_w, src_h / full_h  # full-frame pixels -> source pixels
        for x0, y0, x1, y1 in windows:
            # the window in source pixels, whole ones: the cut maps back from where it really is
            # (from the window's own corner, a luma plane's rounding shifted boxes by up to 3.5 px)
            cx0, cy0 = int(x0 * sx), int(y0 * sy)
            cx1, cy1 = max(cx0 + 1, round(x1 * sx)), max(cy0 + 1, round(y1 * sy))
            cut = source[cy0:cy1, cx0:cx1]
            x0, y0, x1, y1 = cx0 / sx, cy0 / sy, cx1 / sx, cy1 / sy
            size = (max(1, round((x1 - x0) * k)), max(1, round((y1 - y0) * k)))
            if size != (cut.shape[1], cut.shape[0]):
                shrink = size[0] < cut.shape[1]
                cut = cv2.resize(cut, size, interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
            if cut.ndim == 2 or cut.shape[2] == 1:
                cut = cv2.cvtColor(cut, cv2.COLOR_GRAY2BGR)
            rows = self._detect_window(np.ascontiguousarray(cut))
            # window pixels -> full-frame pixels
            kx, ky = (x1 - x0) / cut.shape[1], (y1 - y0) / cut.shape[0]
            found.extend(_to_detections(rows, kx, ky, x0, y0, full_w, full_h, self.score_threshold))
        return found

    def _detect_window(self, bgr: np.ndarray) -> np.ndarray:
        raise NotImplementedError


def _to_detections(rows: np.ndarray, kx: float, ky: float, x0: float, y0: float, width: int, height: int,
                   threshold: float) -> list[Detection]:
    """(N, 15) window rows -> Detections in full-frame pixels, dropping rows that are not finite,
    below the threshold, of no size, whose box is not mostly inside the frame, or whose landmarks
    could not be a face's (`_face_landmarks`)."""
    result = []
    for row in np.asarray(rows, np.float64).reshape(-1, 15):
        if not np.isfinite(row).all() or row[14] < threshold or row[2] <= 0 or row[3] <= 0:
            continue
        bx, by, bw, bh = x0 + row[0] * kx, y0 + row[1] * ky, row[2] * kx, row[3] * ky
        # A face may be cut by the frame edge, but a box mostly outside it is the model's garbage.
        ix = min(bx + bw, width) - max(bx, 0.0)
        iy = min(by + bh, height) - max(by, 0.0)
        if ix <= 0 or iy <= 0 or ix * iy < 0.5 * bw * bh:
            continue
        points = tuple((float(x0 + row[4 + 2 * i] * kx), float(y0 + row[5 + 2 * i] * ky)) for i in range(5))
        box = Box(float(bx), float(by), float(bw), float(bh))
        if _face_landmarks(points, box):
            result.append(Detection(box, float(row[14]), points))
    return result


def _face_landmarks(points: tuple[tuple[float, float], ...], box: Box) -> bool:
    """Whether five landmarks (full-frame pixels) could be those of the face in `box`: all within
    the box grown by half its larger side on every side (a face's lie inside its box:
    tests/detect/test_detectors.py), the eyes at least a pixel apart, and the aligned crop's region
    (tracker.crops.aligned_region_side) at most MAX_REGION_BOXES times the box's larger side. The
    aligned crop needs all three: coincident points have no similarity transform, points far
    apart ask for a region as large as their spread (3,000 px apart on a 320 x 240 frame: a 580 MB
    copy), and points inside the box that no face has (the mouth above the eyes) fit a transform of
    almost no scale, whose region was 17 PB."""
    slack = max(box.w, box.h) / 2.0
    inside = all(box.x - slack <= x <= box.x + box.w + slack and box.y - slack <= y <= box.y + box.h + slack
                 for x, y in points)
    (rx, ry), (lx, ly) = points[0], points[1]
    return (inside and float(np.hypot(lx - rx, ly - ry)) >= 1.0
            and aligned_region_side(points) <= MAX_REGION_BOXES * max(box.w, box.h))
