"""Representative inputs for int8: calibration sets (to choose quantisation ranges) and the fixed
quality set (to measure what int8 costs), both made from face images.

Source: a folder of face images (of the types in tracker.images.IMAGE_SUFFIXES, searched recursively). Default:
the real face chips of the synthetic scene (tracker.sources.synthetic.scene_chips: 4 people, read
from the shared test data); `tracker convert --calibration DIR` (or the
backend option `calibration`) takes the guard's own crops instead; of a folder of more images than
the set holds, evenly spaced ones by name are used (each person's subfolder gets its share). They
are decoded one at a time, at most KEPT_BYTES of them kept (a folder of camera photos costs that,
not the set's count of photos). Each image becomes inputs the
way tracker.crops makes the guard's: for the face CNN's grey 88 x 88 input, by tracker.crops itself
(a box crop of the window); for other models (LeNet) the same rule at their size: grey (BT.601),
resized with area averaging when shrinking, / 255 -> [0, 1].
Because a detector's box never sits exactly on a face, each sample is a deterministic random
variation of an image: a square window of 80-100% of the side, shifted by up to 8%, mirrored half
the time, gain 0.6-1.3 and offset +-0.15 (lighting), and sensor noise (sigma 0.01-0.03), clipped
to [0, 1]. Calibration and quality sets use different seeds, so the quality set is held out.

Everything is a pure function of (files' bytes, count, seed): the same inputs give the same array
and the same `set_id`, which keys the int8 cache entry. A set given as an array (tests, scripts)
is used as it is, keyed by its bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from tracker.crops import CROP_SIZE, box_face
from tracker.errors import InputError
from tracker.files import read_regular_file
from tracker.images import IMAGE_SUFFIXES, MAX_FILE_BYTES, read_image, unreadable_reason
from tracker.sources.synthetic import scene_chips
from tracker.types import Box

CALIBRATION_COUNT = 200
CALIBRATION_SEED = 1
QUALITY_COUNT = 200
QUALITY_SEED = 2
KEPT_BYTES = 32 << 20  # decoded images kept while a set is made (200 of the guard's crops: 1.5 MB)
_RECIPE = "v2"  # bump when the sampling below changes (it is part of the set id)


def image_files(folder: Path) -> list[Path]:
    """The images under `folder`, sorted; InputError if there are none."""
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()) \
        if folder.is_dir() else []
    if not files:
        raise InputError(f"calibration folder {str(folder)!r}: no images found; expected a "
                         f"folder with face images ({', '.join(IMAGE_SUFFIXES)})")
    return files


@dataclass(frozen=True)
class SampleSet:
    """A deterministic set of inputs: `set_id` names it (for cache keys) without making it;
    `make((C, H, W))` makes the (count, C, H, W) float32 array in [0, 1]."""

    set_id: str
    make: Callable[[tuple[int, int, int]], np.ndarray]


def sample_set(source: Path | np.ndarray | None = None, count: int = CALIBRATION_COUNT,
               seed: int = CALIBRATION_SEED) -> SampleSet:
    """Inputs from a folder of face images (default: the scene's chips; see the module docstring), or an
    array (N, C, H, W) used as it is (count and seed are then ignored). InputError for a folder
    without images, or one of the images the set uses that cannot be read."""
    if isinstance(source, np.ndarray):
        array = np.ascontiguousarray(source, np.float32)
        digest = hashlib.sha256(str(array.shape).encode() + array.tobytes()).hexdigest()[:16]

        def given(shape):
            if tuple(array.shape[1:]) != tuple(shape):
                raise InputError(f"calibration: samples have shape {array.shape[1:]}; the model "
                                 f"takes {tuple(shape)}")
            return array
        return SampleSet(f"array-{digest}", given)
    files = _spread(image_files(source) if source is not None else sorted(
        path for paths in scene_chips().values() for path in paths), count)
    hashed = hashlib.sha256()
    for path in files:
        try:  # as read_image reads it: regular files, bounded (a 4 GB file named .jpg was read whole)
            data = read_regular_file(path, MAX_FILE_BYTES)
        except OSError as err:  # (a PermissionError was a traceback, exit 1)
            raise InputError(f"calibration image {str(path)!r}: cannot read ({err.strerror or err}); expected an image "
                             "file this user can read") from None
        hashed.update(len(data).to_bytes(8, "little") + data)
    set_id = f"faces-{_RECIPE}-{hashed.hexdigest()[:16]}-n{count}-s{seed}"
    return SampleSet(set_id, lambda shape: _face_samples(files, shape, count, seed))


def _spread(files: list[Path], count: int) -> list[Path]:
    """At most `count` of `files` (sorted by name), evenly spaced: a folder of crops kept one
    subfolder per person gives every person a share, where the first `count` by name were the
    first people's only. Only these are read: a folder of thousands is not decoded whole."""
    if len(files) <= count:
        return files
    return [files[i * len(files) // count] for i in range(count)]


def _face_samples(files: list[Path], shape: tuple[int, int, int], count: int, seed: int) -> np.ndarray:
    """(count, C, H, W) float32: every file once, in order, then random picks among them. The
    decoded images are kept for those picks up to KEPT_BYTES in all and decoded again beyond it:
    all of them kept took count photos' worth (200 camera photos of 16 megapixels: 3.3 GB). Memory
    bought with time: a photo past the bound is decoded again at each pick (ten such photos for 200
    samples: 163 decodes instead of 10); a folder of the guard's crops is kept whole."""
    c, h, w = shape
    if c not in (1, 3):
        raise InputError(f"calibration: the model's input has {c} channels; expected 1 (grey) or 3 (BGR)")
    kept: dict[int, np.ndarray] = {}

    def decoded(k: int) -> np.ndarray:
        image = kept.get(k)
        if image is None:
            image = read_image(files[k], cv2.IMREAD_GRAYSCALE if c == 1 else cv2.IMREAD_COLOR)
            if image is None:
                raise InputError(f"calibration image {str(files[k])!r}: not a readable image "
                                 f"({unreadable_reason(files[k])}); expected a JPEG/PNG/BMP/PGM image")
            if sum(i.nbytes for i in kept.values()) + image.nbytes <= KEPT_BYTES:
                kept[k] = image
        return image

    rng = np.random.default_rng(seed)
    out = np.empty((count, c, h, w), np.float32)
    for i in range(count):  # every image once, then random picks
        image = decoded(i if i < len(files) else int(rng.integers(len(files))))
        out[i] = _sample(image, (h, w), rng).reshape(h, w, c).transpose(2, 0, 1)
        del image  # (not alive while the next one is decoded)
    return out


def _sample(image: np.ndarray, size: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """One varied view of `image` as (H, W[, 3]) float32 in [0, 1]."""
    ih, iw = image.shape[:2]
    side = max(1, int(round(min(ih, iw) * rng.uniform(0.8, 1.0))))
    cy = ih / 2 + rng.uniform(-0.08, 0.08) * side
    cx = iw / 2 + rng.uniform(-0.08, 0.08) * side
    y0 = int(np.clip(round(cy - side / 2), 0, ih - side))
    x0 = int(np.clip(round(cx - side / 2), 0, iw - side))
    flip = rng.random() < 0.5
    h, w = size
    if size == (CROP_SIZE, CROP_SIZE) and image.ndim == 2:  # the face CNN's input: the guard's crop
        if flip:  # of the mirrored image, at the mirrored window
            image, x0 = np.ascontiguousarray(image[:, ::-1]), iw - x0 - side
        x = box_face(image, Box(float(x0), float(y0), float(side), float(side)), margin=0.0)
        x = x.astype(np.float32) / 255.0
    else:
        window = image[y0:y0 + side, x0:x0 + side]
        window = window[:, ::-1] if flip else window
        interpolation = cv2.INTER_AREA if side > max(h, w) else cv2.INTER_LINEAR
        x = cv2.resize(np.ascontiguousarray(window), (w, h), interpolation=interpolation).astype(np.float32) / 255.0
    x = x * rng.uniform(0.6, 1.3) + rng.uniform(-0.15, 0.15)
    x = x + rng.standard_normal(x.shape, dtype=np.float32) * rng.uniform(0.01, 0.03)
    return np.clip(x, 0.0, 1.0)
