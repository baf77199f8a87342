"""Uploaded photos, checked before anything decodes them.

`check_image(data)` accepts a JPEG or a PNG by its signature and reads its width and height from
its header (PNG's IHDR, JPEG's start-of-frame marker), refusing more than MAX_PIXELS: a few-kB file
can declare a picture that takes gigabytes once decoded (a decompression bomb). Only then is it
handed to OpenCV. A refusal is an InputError whose text says what is wrong with which file.
"""

from __future__ import annotations

import re
import struct

from tracker.errors import InputError
from tracker.images import MAX_PIXELS

_PNG = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers (baseline, progressive, lossless, arithmetic; not DHT 0xC4, JPG 0xC8, DAC 0xCC)
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_filename(name: str, index: int) -> str:
    """A file name for an upload: `index`, then the sender's name reduced to [A-Za-z0-9._-] (at
    most 60 characters), so that it can name no other directory and two uploads never collide."""
    stem = _UNSAFE.sub("_", name.rsplit("/", 1)[-1].rsplit("\\", 1)[-1]).strip("._")[:60]
    return f"{index:02d}-{stem or 'photo'}"


def check_image(data: bytes, name: str) -> tuple[str, int, int]:
    """("jpeg" | "png", width, height) of an upload, or InputError (see the module docstring)."""
    if data.startswith(_PNG):
        if len(data) < 24 or data[12:16] != b"IHDR":
            raise InputError(f"{name}: a damaged PNG (no header); expected a JPEG or PNG photo")
        kind, (width, height) = "png", struct.unpack(">II", data[16:24])
    elif data.startswith(b"\xff\xd8\xff"):
        kind, (width, height) = "jpeg", _jpeg_size(data, name)
    else:
        raise InputError(f"{name}: not a JPEG or PNG image; expected a photo")
    if width < 1 or height < 1:
        raise InputError(f"{name}: a {kind} of {width}x{height} pixels; expected a photo")
    if width * height > MAX_PIXELS:
        raise InputError(f"{name}: {width}x{height} pixels is too large; expected at most {MAX_PIXELS // 1_000_000} "
                         "megapixels")
    return kind, width, height


def _jpeg_size(data: bytes, name: str) -> tuple[int, int]:
    """(width, height) from the first start-of-frame marker, walking the marker segments."""
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            break
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length field
            pos += 2
            continue
        (length,) = struct.unpack(">H", data[pos + 2:pos + 4])
        if marker in _SOF:
            if pos + 9 > len(data):
                break
            height, width = struct.unpack(">HH", data[pos + 5:pos + 9])
            return width, height
        if length < 2:
            break
        pos += 2 + length
    raise InputError(f"{name}: a damaged JPEG (no frame header); expected a JPEG or PNG photo")
