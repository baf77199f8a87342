"""Uploaded photos, checked before anything decodes them.

`check_image(data)` accepts a JPEG or a PNG by its signature and reads its width and height from
its header (PNG's IHDR, JPEG's start-of-frame marker), refusing more than MAX_PIXELS: a few-kB file
can declare a picture that takes gigabytes once decoded (a decompression bomb); and a JPEG of more
than images.MAX_JPEG_SCANS scans, each of which costs a pass over the whole image to decode. Only
then is it handed to OpenCV. A refusal is an InputError whose text says what is wrong with which file.
"""

from __future__ import annotations

import re

from tracker.errors import InputError
from tracker.images import MAX_PIXELS, declared_size

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_filename(name: str, index: int) -> str:
    """A file name for an upload: `index`, then the sender's name reduced to [A-Za-z0-9._-] (at
    most 60 characters), so that it can name no other directory and two uploads never collide."""
    stem = _UNSAFE.sub("_", name.rsplit("/", 1)[-1].rsplit("\\", 1)[-1]).strip("._")[:60]
    return f"{index:02d}-{stem or 'photo'}"


def check_image(data: bytes, name: str) -> tuple[str, int, int]:
    """("jpeg" | "png", width, height) of an upload, or InputError (see the module docstring)."""
    try:
        kind, width, height = declared_size(data)
    except ValueError as err:
        raise InputError(f"{name}: {err}") from None
    if width < 1 or height < 1:
        raise InputError(f"{name}: a {kind} of {width}x{height} pixels; expected a photo")
    if width * height > MAX_PIXELS:
        raise InputError(f"{name}: {width}x{height} pixels is too large; expected at most {MAX_PIXELS // 1_000_000} "
                         "megapixels")
    return kind, width, height
