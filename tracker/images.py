"""The largest image the guard decodes, and reading an image file within it.

OpenCV decodes whatever size a file's header declares, up to 2**30 pixels (3 GB of BGR): a few-kB
PNG can declare 16,000 x 16,000 pixels (a decompression bomb: one in a photo folder took the guard
to 1.7 GB). OpenCV reads its own bound, OPENCV_IO_MAX_IMAGE_PIXELS, once, when it is loaded:
`bound_image_decoding` sets it to MAX_PIXELS before anything imports cv2 (first thing in
`tracker.cli.main`; a value in the environment wins), so every decoder of the process (a photo
folder, enrolment, identification, evaluation, training, uploads) refuses a larger image rather
than allocate it. `read_image` reads one file, and `decode_image` a file's bytes, as `cv2.imread`
decodes a file, with a refused image, as a damaged one, read as None (OpenCV raises for a size over
its bound); so is a JPEG cut short (an interrupted copy or upload), which imdecode refuses and
imread would decode with grey rows.
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
# Bytes of an image file worth reading: MAX_PIXELS of 8-bit colour take 72 MB however they are
# stored (BMP, uncompressed TIFF), so a larger file is no image the guard decodes (a 400 MB one read
# whole took a photo folder's guard past 500 MB).
MAX_FILE_BYTES = 4 * MAX_PIXELS


def bound_image_decoding() -> None:
    """Set OPENCV_IO_MAX_IMAGE_PIXELS to MAX_PIXELS unless the environment sets it. Takes effect in
    this process only if cv2 has not been imported yet; child processes inherit it either way."""
    os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(MAX_PIXELS))


def read_image(path: Path, flags: int | None = None) -> np.ndarray | None:
    """The image at `path` decoded as `cv2.imread(path, flags)` would (default: BGR; EXIF
    orientation applied), or None if it is not a regular file of at most MAX_FILE_BYTES, cannot be
    read or decoded, is larger than OpenCV's bound (see the module docstring) or is a JPEG cut
    short. The bytes are read here and decoded by `cv2.imdecode`: imread crashed the process
    (SIGSEGV) on a name that is not UTF-8, a FIFO's open waited for a writer for ever, and imread
    decodes a JPEG cut short with grey rows."""
    import numpy as np  # here: this module is imported before numpy and cv2 may load (bound_image_decoding)

    from tracker.files import read_regular_file

    try:
        data = read_regular_file(path, MAX_FILE_BYTES)
    except (OSError, ValueError):  # ValueError: a NUL in the name
        return None
    return decode_image(np.frombuffer(data, np.uint8), flags)


def decode_image(data: np.ndarray, flags: int | None = None) -> np.ndarray | None:
    """`data`, an image file's bytes (uint8), decoded as `cv2.imread` reads a file with `flags`
    (default: BGR), or None (damaged, a JPEG cut short, over OpenCV's bound, not an image)."""
    import cv2

    try:
        return cv2.imdecode(data, cv2.IMREAD_COLOR if flags is None else flags) if data.size else None
    except cv2.error:
        return None
