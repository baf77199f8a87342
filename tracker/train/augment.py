"""Augmentation of 88x88 grey face crops for the Pi camera's grey stream.

`augment(crops, rng)`: crops (N, 88, 88) uint8 -> (N, 1, 88, 88) float32 in [0, 1], the network's
input layout (`tracker.crops`). Each crop gets, independently and with the probabilities below:
a horizontal flip; a small similarity warp (rotation up to ROTATE_DEG, scale by up to SCALE, shift
up to SHIFT_PX; edges replicated, as the guard's crops are at a frame's edge); brightness and
contrast; a Gaussian blur (a face slightly out of focus or moving); Gaussian sensor noise; JPEG
re-encoding at a low quality (the snapshots and MJPEG streams a camera gives). The ranges are those
of a fixed camera over a door: the detector's alignment already removes most pose and scale change.
"""

from __future__ import annotations

import cv2
import numpy as np

from tracker.crops import CROP_SIZE

ROTATE_DEG = 8.0
SCALE = 0.08
SHIFT_PX = 3.0
P_BLUR, P_NOISE, P_JPEG = 0.25, 0.3, 0.3


def _one(crop: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    image = crop[:, ::-1] if rng.random() < 0.5 else crop
    angle = rng.uniform(-ROTATE_DEG, ROTATE_DEG)
    scale = 1.0 + rng.uniform(-SCALE, SCALE)
    m = np.asarray(cv2.getRotationMatrix2D((CROP_SIZE / 2.0, CROP_SIZE / 2.0), angle, scale), np.float64)
    m[:, 2] += rng.uniform(-SHIFT_PX, SHIFT_PX, size=2)
    image = cv2.warpAffine(np.ascontiguousarray(image), m, (CROP_SIZE, CROP_SIZE), flags=cv2.INTER_LINEAR,
                           borderMode=cv2.BORDER_REPLICATE)
    if rng.random() < P_BLUR:
        image = cv2.GaussianBlur(image, (0, 0), rng.uniform(0.5, 1.3))
    if rng.random() < P_JPEG:
        ok, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, int(rng.integers(30, 80))])
        decoded = cv2.imdecode(encoded, cv2.IMREAD_GRAYSCALE) if ok else None
        if decoded is not None:
            image = decoded
    out = image.astype(np.float32) * np.float32(1.0 / 255.0)
    contrast, brightness = rng.uniform(0.7, 1.3), rng.uniform(-0.15, 0.15)
    out = (out - out.mean()) * contrast + out.mean() + brightness
    if rng.random() < P_NOISE:
        out += rng.normal(0.0, rng.uniform(0.005, 0.03), out.shape).astype(np.float32)
    return np.clip(out, 0.0, 1.0)


def augment(crops: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """See the module docstring."""
    out = np.empty((len(crops), 1, CROP_SIZE, CROP_SIZE), np.float32)
    for i, crop in enumerate(crops):
        out[i, 0] = _one(crop, rng)
    return out
