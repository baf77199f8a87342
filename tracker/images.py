"""The largest image the guard decodes, and reading an image file within it.

OpenCV decodes whatever size a file's header declares, up to 2**30 pixels (3 GB of BGR): a few-kB
PNG can declare 16,000 x 16,000 pixels (a decompression bomb: one in a photo folder took the guard
to 1.7 GB). OpenCV reads its own bound, OPENCV_IO_MAX_IMAGE_PIXELS, once, when it is loaded:
`bound_image_decoding` sets it to MAX_PIXELS before anything imports cv2 (first thing in
`tracker.cli.main`; a value in the environment wins), so every decoder of the process (a photo
folder, enrolment, identification, evaluation, training, uploads) refuses a larger image rather
than allocate it. `read_image` reads one file as `cv2.imread` does, and `decode_image` a file's
bytes, with a refused image, as a damaged one, read as None (OpenCV raises for a size over its
bound); so is a JPEG cut short (`jpeg_cut_short`), which imread would decode with grey rows.
"""

from __future__ import annotations

import mmap
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
    """The image at `path` as `cv2.imread(path, flags)` decodes it (default: BGR), or None if it
    cannot be read or decoded, is larger than OpenCV's bound (see the module docstring) or is a
    JPEG that ends before its image does (`jpeg_cut_short`)."""
    import cv2  # here: this module is imported before cv2 may be loaded (bound_image_decoding)

    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            if jpeg_cut_short(data):
                return None
    except (OSError, ValueError):  # unreadable, or empty (mmap's ValueError): imread says None too
        return None
    try:
        return cv2.imread(str(path), cv2.IMREAD_COLOR if flags is None else flags)
    except cv2.error:
        return None


def decode_image(data: np.ndarray) -> np.ndarray | None:
    """`data`, an image file's bytes (uint8), decoded to BGR as `read_image` reads a file, or None."""
    import cv2

    try:  # (a JPEG cut short is None here: imdecode, unlike imread, refuses one)
        return cv2.imdecode(data, cv2.IMREAD_COLOR) if data.size else None
    except cv2.error:
        return None


def jpeg_cut_short(data: bytes | mmap.mmap) -> bool:
    """Whether `data` is a JPEG file (it starts with the SOI marker FF D8) that ends before its
    image does: no EOI marker (FF D9) after the start of its first scan (SOS, FF DA). libjpeg
    decodes such a file anyway, the missing rows grey, with only a warning on stderr (an
    interrupted copy or upload would be enrolled half grey). The marker segments before the scan
    are skipped by their lengths, so the markers of an EXIF thumbnail (inside APP1) do not count;
    inside a scan FF is always followed by 00 or a restart marker, so FF D9 there is the EOI."""
    if data[:2] != b"\xff\xd8":
        return False
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return True  # a marker must be here: the file is damaged
        marker = data[at + 1]
        if marker == 0xFF:  # a fill byte before a marker
            at += 1
        elif marker == 0xDA:
            return data.find(b"\xff\xd9", at) < 0
        elif 0xD0 <= marker <= 0xD7 or marker == 0x01:  # markers without a length
            at += 2
        else:
            at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    return True
