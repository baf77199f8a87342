"""A folder of images as an offline source, in natural name order (img2 before img10).

Files whose suffix is not an image type are skipped with a warning line naming each of the first
SKIPS_NAMED and one counting the rest; image files that do not decode are skipped with a warning
line each naming the file and the reason. A folder without any file of an image type, or
whose image files all fail to decode, is an InputError. Each frame has its image's own size.
"""

from __future__ import annotations

import errno
import logging
import re
from pathlib import Path

from tracker.errors import InputError
from tracker.files import read_regular_file
from tracker.images import IMAGE_SUFFIXES, MAX_FILE_BYTES, TOO_LARGE_OR_DAMAGED, decode_image
from tracker.sources.base import SourceBase
from tracker.types import Frame

log = logging.getLogger(__name__)

SKIPS_NAMED = 10  # files that are not images named one by one; the rest are counted


def _natural_key(path: Path) -> list:
    # isdecimal, as \d and int() take: "²" is a digit to isdigit(), and int() refused it
    return [int(part) if part.isdecimal() else part.lower() for part in re.split(r"(\d+)", path.name)]


class FolderSource(SourceBase):
    live = False

    def __init__(self, folder: str | Path) -> None:
        super().__init__()
        self.folder = Path(folder)
        self.description = f"image folder {str(self.folder)!r}"
        self._files: list[Path] = []
        self._next = 0

    def open(self) -> None:
        try:
            if not self.folder.is_dir():
                hint = " (a video file is source.kind opencv)" if self.folder.is_file() else ""
                raise InputError(f"{self.description}: not a directory; expected a folder of images{hint}")
            files = sorted((p for p in self.folder.iterdir() if p.is_file()), key=_natural_key)
        except (OSError, ValueError) as err:  # no permission, a name too long, a NUL in it
            raise InputError(f"{self.description}: cannot read it ({getattr(err, 'strerror', None) or err}); "
                             "expected a readable folder of images") from None
        self._files = [path for path in files if path.suffix.lower() in IMAGE_SUFFIXES]
        others = [path for path in files if path.suffix.lower() not in IMAGE_SUFFIXES]
        for path in others[:SKIPS_NAMED]:
            log.warning("%s: skipping %r: not an image file (suffix %r; expected one of %s)",
                        self.description, path.name, path.suffix, " ".join(IMAGE_SUFFIXES))
        if len(others) > SKIPS_NAMED:  # a wrong folder's thousand lines would flood the journal
            log.warning("%s: skipping %d more files that are not image files", self.description,
                        len(others) - SKIPS_NAMED)
        if not self._files:
            raise InputError(f"{self.description}: no image files in it; expected files ending in "
                             + ", ".join(IMAGE_SUFFIXES))
        self._next = 0

    def read(self) -> Frame | None:
        while self._next < len(self._files):
            path = self._files[self._next]
            self._next += 1
            try:
                data = read_regular_file(path, MAX_FILE_BYTES)  # (bounded also for a file still growing)
            except OSError as err:
                if err.errno == errno.EFBIG:
                    log.warning("%s: skipping %r: larger than any image it decodes (%d MB); expected a photo",
                                self.description, path.name, MAX_FILE_BYTES // 1_000_000)
                else:
                    log.warning("%s: skipping %r: cannot read it (%s)", self.description, path.name, err.strerror)
                continue
            image = decode_image(data)
            if image is None:
                log.warning("%s: skipping %r: not a decodable image (%s)", self.description, path.name,
                            TOO_LARGE_OR_DAMAGED)
                continue
            return self._frame(image)
        if self._seq == 0:
            raise InputError(f"{self.description}: none of its {len(self._files)} image file(s) could be decoded; "
                             "expected at least one readable image")
        return None
