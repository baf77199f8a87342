"""Face crops for the face CNN: a frame and a face -> the network's (1, 88, 88) float32 input.

The one place that defines what the network sees (enrolment, the guard, the detector benchmark and
the int8 calibration and quality sets of tracker.model.convert.calibration call it). Two
definitions, named so that enrolments record theirs:
- `aligned` (CROP_ALIGNED), for a detection with landmarks (YuNet, BlazeFace): the similarity
  transform (rotation, scale, shift) that best maps the eyes, nose tip and mouth centre onto
  TEMPLATE puts the eyes level at a fixed distance and position; so the same face at another size,
  position or small tilt gives nearly the same crop (four points rather than the eyes alone: one
  detector's eye points lag a tilt that its nose and mouth follow).
  Large faces are first shrunk by area averaging (bilinear warping alone would alias);
- `box` (CROP_BOX), for a bare box (Haar, or an aligned chip taken whole): a square centred on the
  box centre, of side max(w, h) * (1 + 2 * CROP_MARGIN) (a little context around the detector's
  box, so small box jitter changes the crop little), resized with area averaging when shrinking,
  bilinear when enlarging.
Both: parts outside the frame are filled by replicating the edge pixels (no black bars for faces
at the edge), and
- the image: (H, W) grey, (H, W, 1) or (H, W, 3) BGR uint8, the frames the face detectors take
  (tracker.detect.windowed.frame_planes); another number of channels is an InputError (a BGRA
  image's channel 0, once taken as its grey, is its blue);
- grey: OpenCV's BGR -> grey (ITU-R BT.601 luma);
- normalisation: pixel / 255, so values are in [0, 1]. The face CNN has no mean file and its
  prototxt no transform; [0, 1] keeps inputs of the order of magnitude He-initialised weights expect.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from tracker.errors import InputError
from tracker.types import Box, Detection, Point

CROP_SIZE = 88  # the network's input side (docs/ARCHITECTURE.md, section 1)
CROP_MARGIN = 0.1  # box crops: context added on every side, as a fraction of the box's larger side
CROP_BOX = "box-v1"  # the definitions' names, recorded with every enrolment
CROP_ALIGNED = "aligned-v1"
# Aligned crops: where the eyes, the nose tip and the mouth's centre go in the crop, as fractions of
# its side. Measured with YuNet and BlazeFace on dlib's 150 px face chips (../shared/testdata/faces/
# dlib/johns: eyes 0.30/0.66-0.67 across and 0.30-0.31 down, nose 0.47-0.50 x 0.51-0.53, mouth 0.47-0.50
# x 0.66-0.71) and made symmetric, so an aligned crop is framed like those chips: brows to chin.
TEMPLATE = np.array([[0.32, 0.305], [0.68, 0.305], [0.50, 0.52], [0.50, 0.685]]) * CROP_SIZE
_SCALE = np.float32(1.0 / 255.0)


def crop_definition(landmarks: bool) -> str:
    """The name of the crop a detector's faces get: CROP_ALIGNED with landmarks, else CROP_BOX."""
    return CROP_ALIGNED if landmarks else CROP_BOX


def _square(image: np.ndarray, cx: float, cy: float, side: int, grey: bool = False) -> tuple[np.ndarray, int, int]:
    """(the side x side square centred near (cx, cy), its top-left x0, y0 in image pixels); the
    centre is clamped into the frame (so at least one frame pixel is inside) and what falls
    outside the frame is edge-replicated; a view of `image` when the square is inside it.
    `grey`: the square in grey, converted before the edges are replicated (the same pixels, and
    the replicated copy a third the size: a large face's square ran to 150 MB in BGR)."""
    h, w = image.shape[:2]
    cx, cy = min(max(cx, 0.5), w - 0.5), min(max(cy, 0.5), h - 0.5)
    x0, y0 = int(np.floor(cx - side / 2.0 + 0.5)), int(np.floor(cy - side / 2.0 + 0.5))
    return _cut(image, x0, y0, side, grey), x0, y0


def square_region(image: np.ndarray, box: Box, margin: float = CROP_MARGIN, grey: bool = False) -> np.ndarray:
    """The square around `box` (see module docstring) cut from `image` ((H, W) or (H, W, C)),
    edge-replicated where it leaves the frame; same dtype and channels; a view of `image` when the
    square is inside it. Its side is at least 1 pixel; a box centred outside the frame is treated
    as centred on the nearest frame pixel. `grey`: as `_square`'s."""
    side = max(1, int(round(max(box.w, box.h) * (1.0 + 2.0 * margin))))
    return _square(image, box.x + box.w / 2.0, box.y + box.h / 2.0, side, grey)[0]


def _cut(image: np.ndarray, x0: int, y0: int, side: int, grey: bool = False) -> np.ndarray:
    h, w = image.shape[:2]
    x1, y1 = x0 + side, y0 + side
    inside = image[max(y0, 0):min(y1, h), max(x0, 0):min(x1, w)]
    if grey:
        inside = _grey(inside)
    top, left = max(0, -y0), max(0, -x0)
    bottom, right = max(0, y1 - h), max(0, x1 - w)
    if top or left or bottom or right:
        return cv2.copyMakeBorder(inside, top, bottom, left, right, cv2.BORDER_REPLICATE)
    return inside


def _grey(region: np.ndarray) -> np.ndarray:
    """`region` of an image of the module docstring's kinds as (h, w) grey; InputError for other channels."""
    if region.ndim == 2:
        return region
    if region.shape[2] == 3:
        return cv2.cvtColor(region, cv2.COLOR_BGR2GRAY)
    if region.shape[2] == 1:
        return region[:, :, 0]
    raise InputError(f"face crop: an image of {region.shape[2]} channels; expected (H, W) grey or (H, W, 3) BGR uint8, "
                     "as the face detectors take")


def similarity_to_template(landmarks: Sequence[Point]) -> np.ndarray:
    """The (2, 3) float64 similarity transform (rotation, uniform scale, shift) that maps the eyes,
    nose tip and mouth centre (the mean of the two corners) of `landmarks` (Detection order) onto
    TEMPLATE with the least squared error (closed form: Umeyama's, without reflection)."""
    p = np.asarray(landmarks, np.float64)
    src = np.stack([p[0], p[1], p[2], (p[3] + p[4]) / 2.0])
    mu_s, mu_d = src.mean(axis=0), TEMPLATE.mean(axis=0)
    s, d = src - mu_s, TEMPLATE - mu_d
    norm = max(float((s * s).sum()), 1e-9)
    a = float((s * d).sum()) / norm
    b = float((s[:, 0] * d[:, 1] - s[:, 1] * d[:, 0]).sum()) / norm
    m = np.array([[a, -b, 0.0], [b, a, 0.0]])
    m[:, 2] = mu_d - m[:, :2] @ mu_s
    return m


def _scale(m: np.ndarray) -> float:
    """Image pixels -> crop pixels of a similarity transform (2, 3)."""
    return max(float(np.hypot(m[0, 0], m[1, 0])), 1e-6)


def aligned_region_side(landmarks: Sequence[Point]) -> int:
    """The side (image pixels) of the square `aligned_face` samples for `landmarks`: one that holds
    the crop at any rotation. The detectors bound it (tracker.detect.windowed)."""
    return max(2, int(np.ceil(CROP_SIZE * 1.5 / _scale(similarity_to_template(landmarks)))))


def aligned_face(image: np.ndarray, landmarks: Sequence[Point]) -> np.ndarray:
    """The aligned 88 x 88 grey uint8 face of `landmarks` (five points in Detection order) in
    `image` (grey or BGR uint8: module docstring): `similarity_to_template` applied, edges replicated."""
    m = similarity_to_template(landmarks)
    scale = _scale(m)
    # Only the face's neighbourhood is ever sampled: a square that holds the crop at any rotation,
    # centred on the image point that lands on the crop's centre.
    centre = np.linalg.solve(m[:, :2], np.full(2, CROP_SIZE / 2.0) - m[:, 2])
    side = aligned_region_side(landmarks)
    region, x0, y0 = _square(image, float(centre[0]), float(centre[1]), side, grey=True)
    shrink = 1.0
    if scale < 1.0:  # area-average down to (about) crop scale first: a bilinear warp would alias
        target = max(2, round(side * scale))
        region = cv2.resize(region, (target, target), interpolation=cv2.INTER_AREA)
        shrink = target / side
    # A region pixel q is the image pixel q / shrink + (x0, y0).
    local = np.empty((2, 3))
    local[:, :2] = m[:, :2] / shrink
    local[:, 2] = m[:, :2] @ np.array([x0, y0], np.float64) + m[:, 2]
    return cv2.warpAffine(region, local, (CROP_SIZE, CROP_SIZE), flags=cv2.INTER_LINEAR,
                          borderMode=cv2.BORDER_REPLICATE)


def box_face(image: np.ndarray, box: Box, margin: float = CROP_MARGIN) -> np.ndarray:
    """The 88 x 88 grey uint8 box crop of `box` (see module docstring)."""
    region = square_region(image, box, margin, grey=True)
    shrink = region.shape[0] > CROP_SIZE
    return cv2.resize(region, (CROP_SIZE, CROP_SIZE), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)


def face_pixels(image: np.ndarray, face: Detection | Box, margin: float = CROP_MARGIN) -> np.ndarray:
    """The 88 x 88 grey uint8 crop of one face: aligned for a Detection with landmarks, the box
    crop (with `margin`) otherwise (`face_crop` before its scaling to [0, 1])."""
    if isinstance(face, Detection) and face.landmarks is not None:
        return aligned_face(image, face.landmarks)
    return box_face(image, face.box if isinstance(face, Detection) else face, margin)


def face_crop(image: np.ndarray, face: Detection | Box, margin: float = CROP_MARGIN,
              out: np.ndarray | None = None) -> np.ndarray:
    """The network input for one face: (1, 88, 88) float32 in [0, 1] (see module docstring):
    `face_pixels` / 255. `image` is BGR (H, W, 3) or grey (H, W) uint8 (module docstring: InputError
    for other channels); `out`, if given, is filled and returned."""
    small = face_pixels(image, face, margin)
    if out is None:
        out = np.empty((1, CROP_SIZE, CROP_SIZE), np.float32)
    np.multiply(small, _SCALE, out=out[0], casting="unsafe")
    return out


def network_input(pixels: np.ndarray) -> np.ndarray:
    """Face pixels (k, 88, 88) grey uint8 (`face_pixels` of k faces) -> the network input they make,
    (k, 1, 88, 88) C-contiguous float32 in [0, 1], as `face_crop` scales them. Kept faces are held
    as pixels, a quarter of the memory."""
    out = np.empty((len(pixels), 1, CROP_SIZE, CROP_SIZE), np.float32)
    np.multiply(pixels, _SCALE, out=out[:, 0], casting="unsafe")
    return out


def crop_batch(image: np.ndarray, faces: Sequence[Detection | Box], margin: float = CROP_MARGIN) -> np.ndarray:
    """All faces of one frame (see `face_crop`): (N, 1, 88, 88) C-contiguous float32 (N may be 0)."""
    batch = np.empty((len(faces), 1, CROP_SIZE, CROP_SIZE), np.float32)
    for i, face in enumerate(faces):
        face_crop(image, face, margin, out=batch[i])
    return batch
