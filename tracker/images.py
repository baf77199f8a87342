"""The largest image the guard decodes, and reading an image file within it.

OpenCV decodes whatever size a file's header declares, up to 2**30 pixels (3 GB of BGR): a few-kB
PNG can declare 16,000 x 16,000 pixels (a decompression bomb: one in a photo folder took the guard
to 1.7 GB). OpenCV reads its own bound, OPENCV_IO_MAX_IMAGE_PIXELS, once, when it is loaded:
`bound_image_decoding` sets it to MAX_PIXELS before anything imports cv2 (first thing in
`tracker.cli.main`; a value in the environment wins), so every decoder of the process (a photo
folder, enrolment, identification, evaluation, training, uploads) refuses a larger image rather
than allocate it. `read_image` reads one file as `cv2.imread` does, and `decode_image` a file's
bytes, with a refused image, as a damaged one, read as None (OpenCV raises for a size over its
bound).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy and cv2 load only when an image is read (see bound_image_decoding)
    import numpy as np

# A face needs far fewer; a 24-megapixel photo decodes to 72 MB of BGR, within the guard's budget on
# a 1 GB Pi (a phone's 48-megapixel mode gives a clear refusal: send a smaller one).
MAX_PIXELS = 24_000_000
TOO_LARGE_OR_DAMAGED = f"damaged, not an image, or over {MAX_PIXELS // 1_000_000} megapixels"


def bound_image_decoding() -> None:
    """Set OPENCV_IO_MAX_IMAGE_PIXELS to MAX_PIXELS unless the environment sets it. Takes effect in
    this process only if cv2 has not been imported yet; child processes inherit it either way."""
    os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(MAX_PIXELS))


def read_image(path: Path, flags: int | None = None) -> np.ndarray | None:
    """The image at `path` as `cv2.imread(path, flags)` decodes it (default: BGR), or None if it
    cannot be read or decoded, or is larger than OpenCV's bound (see the module docstring)."""
    import cv2  # here: this module is imported before cv2 may be loaded (bound_image_decoding)

    try:
        return cv2.imread(str(path), cv2.IMREAD_COLOR if flags is None else flags)
    except cv2.error:
        return None


def decode_image(data: np.ndarray) -> np.ndarray | None:
    """`data`, an image file's bytes (uint8), decoded to BGR as `read_image` reads a file, or None."""
    import cv2

    try:
        return cv2.imdecode(data, cv2.IMREAD_COLOR) if data.size else None
    except cv2.error:
        return None
