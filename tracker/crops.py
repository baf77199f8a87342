"""Face crops for the face CNN: a frame and a box -> the network's (1, 88, 88) float32 input.

The one place that defines what the network sees (enrolment and the guard both use it):
- geometry: a square centred on the box centre, of side max(w, h) * (1 + 2 * CROP_MARGIN) (a
  little context around the detector's box, so small box jitter changes the crop little); parts
  outside the frame are filled by replicating the edge pixels (no black bars for faces at the edge);
- grey: OpenCV's BGR -> grey (ITU-R BT.601 luma);
- resize to 88 x 88: area averaging when shrinking, bilinear when enlarging;
- normalisation: pixel / 255, so values are in [0, 1]. The face CNN has no mean file and its
  prototxt no transform; [0, 1] keeps inputs of the order of magnitude He-initialised weights expect.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from tracker.types import Box

CROP_SIZE = 88  # the network's input side (DESIGN.md section 1)
CROP_MARGIN = 0.1  # context added on every side, as a fraction of the box's larger side
_SCALE = np.float32(1.0 / 255.0)


def square_region(image: np.ndarray, box: Box, margin: float = CROP_MARGIN) -> np.ndarray:
    """The square around `box` (see module docstring) cut from `image` ((H, W) or (H, W, C)),
    edge-replicated where it leaves the frame; same dtype and channels; a view of `image` when the
    square is inside it. Its side is at least 1 pixel; a box centred outside the frame is treated
    as centred on the nearest frame pixel."""
    h, w = image.shape[:2]
    side = max(1, int(round(max(box.w, box.h) * (1.0 + 2.0 * margin))))
    # Keeping the centre inside the frame keeps at least one frame pixel inside the square.
    cx = min(max(box.x + box.w / 2.0, 0.5), w - 0.5)
    cy = min(max(box.y + box.h / 2.0, 0.5), h - 0.5)
    x0, y0 = int(np.floor(cx - side / 2.0 + 0.5)), int(np.floor(cy - side / 2.0 + 0.5))
    x1, y1 = x0 + side, y0 + side
    inside = image[max(y0, 0):min(y1, h), max(x0, 0):min(x1, w)]
    top, left = max(0, -y0), max(0, -x0)
    bottom, right = max(0, y1 - h), max(0, x1 - w)
    if top or left or bottom or right:
        return cv2.copyMakeBorder(inside, top, bottom, left, right, cv2.BORDER_REPLICATE)
    return inside


def face_crop(image: np.ndarray, box: Box, margin: float = CROP_MARGIN, out: np.ndarray | None = None) -> np.ndarray:
    """The network input for one face: (1, 88, 88) float32 in [0, 1] (see module docstring).
    `image` is BGR (H, W, 3) or grey (H, W) uint8; `out`, if given, is filled and returned."""
    region = square_region(image, box, margin)
    if region.ndim == 3:
        region = cv2.cvtColor(region, cv2.COLOR_BGR2GRAY)
    shrink = region.shape[0] > CROP_SIZE
    small = cv2.resize(region, (CROP_SIZE, CROP_SIZE), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
    if out is None:
        out = np.empty((1, CROP_SIZE, CROP_SIZE), np.float32)
    np.multiply(small, _SCALE, out=out[0], casting="unsafe")
    return out


def crop_batch(image: np.ndarray, boxes: Sequence[Box], margin: float = CROP_MARGIN) -> np.ndarray:
    """All faces of one frame: (N, 1, 88, 88) C-contiguous float32 (N may be 0)."""
    batch = np.empty((len(boxes), 1, CROP_SIZE, CROP_SIZE), np.float32)
    for i, box in enumerate(boxes):
        face_crop(image, box, margin, out=batch[i])
    return batch


def stack_crops(crops: Sequence[np.ndarray]) -> np.ndarray:
    """Crops of shape (1, 88, 88) (e.g. gathered across frames by the batcher) -> one
    (N, 1, 88, 88) C-contiguous float32 batch, the layout every backend takes."""
    batch = np.empty((len(crops), 1, CROP_SIZE, CROP_SIZE), np.float32)
    for i, crop in enumerate(crops):
        if crop.shape != (1, CROP_SIZE, CROP_SIZE):
            raise ValueError(f"crop {i} has shape {crop.shape}; expected (1, {CROP_SIZE}, {CROP_SIZE})")
        batch[i] = crop
    return batch
