"""The largest image the guard decodes, and reading an image file within it; FFmpeg kept quiet.

OpenCV decodes whatever size a file's header declares, up to 2**30 pixels (3 GB of BGR): a few-kB
PNG can declare 16,000 x 16,000 pixels (a decompression bomb: one in a photo folder took the guard
to 1.7 GB). OpenCV reads its own bound, OPENCV_IO_MAX_IMAGE_PIXELS, once, when it is loaded:
`set_opencv_environment` sets it to MAX_PIXELS before anything imports cv2 (second thing in
`tracker.cli.main`; a value in the environment wins), so every decoder of the process (a photo
folder, enrolment, identification, evaluation, training, uploads) refuses a larger image rather
than allocate it. `read_image` reads one file (`read_photo`: one to find faces in, at a fraction
of its size, with the factor back to its pixels), and `decode_image` a file's bytes, as `cv2.imread`
decodes a file, with a refused image, as a damaged one, read as None (OpenCV raises for a size over
its bound); so is a JPEG cut short (an interrupted copy or upload), which imdecode refuses and
imread would decode with grey rows. A JPEG's time to decode grows with its scans as well as its
pixels (a progressive one is decoded one scan at a time, each a pass over the whole image): one of
more than MAX_JPEG_SCANS is refused too, by `declared_size`, before anything decodes it.
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy and cv2 load only when an image is read (see set_opencv_environment)
    import numpy as np

# A face needs far fewer; a 24-megapixel photo decodes to 72 MB of BGR, within the guard's budget on
# a 1 GB Pi (a phone's 48-megapixel mode gives a clear refusal: send a smaller one).
MAX_PIXELS = 24_000_000
# libjpeg decodes a progressive JPEG one scan at a time, each a pass over the whole image's blocks,
# and the number of scans is the file's to choose: one scan of a 24-megapixel frame repeated 10,000
# times, a 514 kB file, took 31 s to decode (past the guard's watchdog). A camera's or a phone's
# progressive JPEG has about 10 (libjpeg's own progression: 10 in colour, 6 in grey); libjpeg-turbo's
# djpeg has -maxscans for the same reason. 100 of them added 0.6 s to a 24-megapixel photo's decoding
# on a desktop's core (a few times that on a Pi).
MAX_JPEG_SCANS = 100
# Marker segments a JPEG may have before its end, scans and the tables between them included: a
# photo's have tens (a phone's extended XMP, in segments of 64 kB, a hundred or so); the bound keeps
# the walk over them (declared_size) short however small they are.
MAX_JPEG_SEGMENTS = 1000
TOO_LARGE_OR_DAMAGED = (f"damaged, not an image, over {MAX_PIXELS // 1_000_000} megapixels, or a JPEG of over "
                        f"{MAX_JPEG_SCANS} scans")
# Bytes of an image file worth reading: MAX_PIXELS of 8-bit colour take 72 MB however they are
# stored (BMP, uncompressed TIFF), so a larger file is no image the guard decodes (a 400 MB one read
# whole took a photo folder's guard past 500 MB).
MAX_FILE_BYTES = 4 * MAX_PIXELS
# The file types taken as images wherever a folder is searched for them (enrolment, identification,
# a photo folder source, calibration, training, the scene's faces): ones OpenCV's imread decodes.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".pgm", ".ppm", ".pnm")


# a JPEG decoded at 1/2, 1/4 or 1/8 of its size (read_image's `reduced`) keeps at least this many
# pixels along its longer side: a face in it stays well above the crop's 88 pixels
REDUCED_MIN_SIDE = 1600
_PNG = b"\x89PNG\r\n\x1a\n"
_JPEG = b"\xff\xd8"  # start of image
# The next JPEG marker: 0xFF and a code that is none of 0x00 (a 0xFF byte of a scan's entropy-coded
# data), a restart marker 0xD0-0xD7 (within a scan's data) or 0xFF (fill before a marker). Anything
# else between segments is skipped, as libjpeg skips it.
_NEXT_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")
_SOS, _EOI = 0xDA, 0xD9  # start of scan, end of image
# JPEG start-of-frame markers (baseline, progressive, lossless, arithmetic; not DHT 0xC4, JPG 0xC8, DAC 0xCC)
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def set_opencv_environment() -> None:
    """Set OPENCV_IO_MAX_IMAGE_PIXELS to MAX_PIXELS, and OPENCV_FFMPEG_LOGLEVEL to FFmpeg's quiet
    (-8), each unless the environment sets it. Takes effect in this process only if cv2 has not been
    imported yet; child processes inherit it either way. FFmpeg's own lines (a corrupt video's "moov
    atom not found") went to stderr before the one-line error the project prints for the same fault;
    OPENCV_FFMPEG_LOGLEVEL=16 in the environment shows them again."""
    os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(MAX_PIXELS))
    os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")


def read_image(path: Path, flags: int | None = None, reduced: bool = False) -> np.ndarray | None:
    """The image at `path` decoded as `cv2.imread(path, flags)` would (default: BGR; EXIF
    orientation applied), or None if it is not a regular file of at most MAX_FILE_BYTES, cannot be
    read or decoded, is larger than OpenCV's bound (see the module docstring) or is a JPEG cut
    short. The bytes are read here and decoded by `cv2.imdecode`: imread crashed the process
    (SIGSEGV) on a name that is not UTF-8, a FIFO's open waited for a writer for ever, and imread
    decodes a JPEG cut short with grey rows. `reduced` (photos to find a face in): a JPEG whose
    longer side is at least twice REDUCED_MIN_SIDE is decoded at 1/2, 1/4 or 1/8 of its size (by
    libjpeg's scaled DCT), the most that keeps REDUCED_MIN_SIDE: a baseline 24-megapixel photo took
    72 MB of BGR (a progressive one still takes its coefficients, about as much), and uploads of
    them the guard past its memory bound. The bound holds on the size the file declares."""
    found = _read(path, flags, reduced)
    return None if found is None else found[0]


def unreadable_reason(path: Path) -> str:
    """Why `read_image(path)` or `read_photo(path)` gave None, in words for a message: the file
    system's reason when the file cannot be opened (a link to a file that does not exist, no
    permission, a folder, not a regular file), its size when over MAX_FILE_BYTES, otherwise
    TOO_LARGE_OR_DAMAGED (its bytes did not decode within the bounds). Asked only after a read
    failed, so a readable photo costs nothing more; a file changed in between gets its new reason."""
    from tracker.files import open_regular_file

    try:
        with open_regular_file(path) as file:
            size = os.fstat(file.fileno()).st_size
    except ValueError:  # a NUL in the name
        return "a name with a NUL byte in it"
    except OSError as error:
        if path.is_symlink() and not path.exists():
            return "a link to a file that does not exist"
        return f"cannot be opened: {error.strerror or error}"
    if size > MAX_FILE_BYTES:
        return f"larger than any image it decodes ({MAX_FILE_BYTES // 1_000_000} MB)"
    return TOO_LARGE_OR_DAMAGED


def read_photo(path: Path) -> tuple[np.ndarray, float] | None:
    """A photo to find faces in, as `read_image(path, reduced=True)` decodes it (BGR), and the
    factor (>= 1) from its pixels to the photo's own (boxes found in it times the factor are in
    the photo's pixels; EXIF orientation applied to both); None as read_image."""
    found = _read(path, None, True)
    if found is None:
        return None
    image, header = found
    if header is None:  # not a JPEG or PNG: decoded whole
        return image, 1.0
    _, width, height = header
    return image, max(width, height) / max(image.shape[:2])


def _read(path: Path, flags: int | None, reduced: bool) -> tuple[np.ndarray, tuple[str, int, int] | None] | None:
    """(the image as read_image decodes it, the file's `declared_size` or None for neither a JPEG
    nor a PNG), or None. The header is walked once: for a JPEG, that is a pass over the whole file."""
    from tracker.files import read_regular_file

    try:
        data = read_regular_file(path, MAX_FILE_BYTES)
    except (OSError, ValueError):  # ValueError: a NUL in the name
        return None
    try:
        header = _header(data)
    except ValueError:  # a JPEG or PNG refused before decoding (damaged, too many scans)
        return None
    if reduced:
        flags = _reduced_flags(header, flags)
        if flags is None:
            return None
    image = _decode(data, flags)
    return None if image is None else (image, header)


def _header(data: bytes) -> tuple[str, int, int] | None:
    """`declared_size(data)` (ValueError as it says), or None for a file that is neither a JPEG
    nor a PNG (a BMP, a TIFF: OpenCV's own bound holds for them)."""
    if not data.startswith((_PNG, _JPEG)):
        return None
    return declared_size(data)


def _reduced_flags(header: tuple[str, int, int] | None, flags: int | None) -> int | None:
    """imdecode's flags (`flags`: as read_image's) for a file whose `declared_size` is `header`
    (None: neither a JPEG nor a PNG), decoded as `read_image(reduced=True)` says; None for a JPEG
    or PNG that declares more than MAX_PIXELS (OpenCV checks its bound against the reduced size,
    and a progressive JPEG holds its whole image's coefficients at any scale)."""
    import cv2

    flags = cv2.IMREAD_COLOR if flags is None else flags
    if header is None:
        return flags
    kind, width, height = header
    if width * height > MAX_PIXELS:
        return None
    factor = 1
    while kind == "jpeg" and factor < 8 and max(width, height) // (2 * factor) >= REDUCED_MIN_SIDE:
        factor *= 2
    if factor == 1:
        return flags
    grey = flags == cv2.IMREAD_GRAYSCALE
    return {(2, False): cv2.IMREAD_REDUCED_COLOR_2, (4, False): cv2.IMREAD_REDUCED_COLOR_4,
            (8, False): cv2.IMREAD_REDUCED_COLOR_8, (2, True): cv2.IMREAD_REDUCED_GRAYSCALE_2,
            (4, True): cv2.IMREAD_REDUCED_GRAYSCALE_4, (8, True): cv2.IMREAD_REDUCED_GRAYSCALE_8}[factor, grey]


def declared_size(data: bytes) -> tuple[str, int, int]:
    """("jpeg" | "png", width, height) as a JPEG's or a PNG's header declares them (PNG's IHDR,
    JPEG's first start-of-frame marker), before anything decodes it; ValueError saying what it is
    instead and what is expected, also for a JPEG of more than MAX_JPEG_SCANS scans or
    MAX_JPEG_SEGMENTS marker segments. A JPEG's marker segments are walked by their lengths (an
    EXIF thumbnail's own markers are not the photo's) up to its end of image, a scan's
    entropy-coded data skipped to the next marker: at most MAX_JPEG_SEGMENTS steps, each a search
    in C, over bytes in memory (a few ms for 8 MB). A JPEG cut short or damaged after its frame
    header still gives its size: decoding it fails."""
    if data.startswith(_PNG):
        if len(data) < 24 or data[12:16] != b"IHDR":
            raise ValueError("a damaged PNG (no header); expected a JPEG or PNG photo")
        width, height = struct.unpack(">II", data[16:24])
        return "png", width, height
    if not data.startswith(_JPEG):
        raise ValueError("not a JPEG or PNG image; expected a photo")
    size = None
    scans = segments = 0
    pos = len(_JPEG)
    while (found := _NEXT_MARKER.search(data, pos)) is not None:
        pos = found.start()
        marker = data[pos + 1]
        if marker == _EOI:
            break
        segments += 1
        if segments > MAX_JPEG_SEGMENTS:
            raise ValueError(f"a JPEG of more than {MAX_JPEG_SEGMENTS} marker segments; expected a photo (one has tens)")
        if marker in (0xD8, 0x01):  # no length field
            pos += 2
            continue
        if pos + 4 > len(data):
            break
        (length,) = struct.unpack_from(">H", data, pos + 2)
        if length < 2:
            break
        if marker in _SOF and size is None:
            if pos + 9 > len(data):
                break
            height, width = struct.unpack_from(">HH", data, pos + 5)
            size = width, height
        elif marker == _SOS:
            if size is None:  # a scan before the frame header: libjpeg refuses it too
                break
            scans += 1
            if scans > MAX_JPEG_SCANS:
                raise ValueError(f"a JPEG of more than {MAX_JPEG_SCANS} scans (each decoded over the whole image); "
                                 "expected a photo (a camera's has about 10)")
        pos += 2 + length
    if size is None:
        raise ValueError("a damaged JPEG (no frame header); expected a JPEG or PNG photo")
    return "jpeg", *size


def decode_image(data: bytes, flags: int | None = None) -> np.ndarray | None:
    """`data`, an image file's bytes, decoded as `cv2.imread` reads a file with `flags` (default:
    BGR), or None (damaged, a JPEG cut short, a JPEG or PNG that declared_size refuses, over
    OpenCV's bound, not an image). The header is checked as `_read` checks it."""
    try:
        _header(data)  # (a JPEG's scans: OpenCV's bound is on pixels only)
    except ValueError:
        return None
    return _decode(data, flags)


def _decode(data: bytes, flags: int | None) -> np.ndarray | None:
    """`decode_image` once the header is checked."""
    import cv2
    import numpy as np  # here: this module is imported before numpy and cv2 may load (set_opencv_environment)

    if not data:
        return None
    try:
        return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR if flags is None else flags)
    except cv2.error:
        return None
