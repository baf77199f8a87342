"""OpenCV VideoCapture sources: a camera (index, /dev/videoN or /dev/v4l/by-id/...), a network
stream, a video file.

- Camera (V4L2): live. Absent or unplugged -> SourceUnavailable, so the capture thread retries.
  The requested width/height/fps are asked of the driver (it may pick the nearest mode it has).
- Network stream (rtsp://, http(s)://, ...; FFmpeg): live, with open and read timeouts so a dead
  stream fails (and is reopened) instead of blocking forever.
- Video file (FFmpeg): offline. Missing, not a video, or without a frame that decodes -> InputError
  naming the file; the end of the file ends the run. The first frame is decoded at open() so a
  corrupt file is reported at once rather than as an empty run. A frame that does not decode (a
  damaged recording) is skipped, not taken as the end: up to MAX_UNDECODABLE_RUN of them in a row;
  a run that reaches the frame count the file's header declares ends it (FFmpeg reads the end of a
  file as a frame that does not decode, so only a frame that decodes after them shows them damaged;
  past a count that understated the frames, only that bound ends the file). Each run
  of them is a warning naming the file and its frames (counted from 0), the first
  DAMAGED_RUNS_NAMED of them; the rest are counted when the file is closed. A file that ends before
  its declared count (cut short, or its rest undecodable) is a warning saying where. (The count is
  the container's; Matroska and WebM declare none and FFmpeg estimates it from the duration and
  frame rate, exact for a constant rate, as OpenCV writes them.)
`live=True` forces the live behaviour on any uri (a file then plays again after it ends).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import NoReturn

import numpy as np

from tracker.errors import InputError
from tracker.images import MAX_PIXELS
from tracker.sources.base import SourceBase, SourceUnavailable
from tracker.types import Frame

log = logging.getLogger(__name__)

# A video file's frames that do not decode, in a row, past which the rest of the file is taken as
# missing: a few seconds of a camera's recording (a failed read at the end of a file costs
# microseconds, so a file whose header declares no frame count is not held up at its end).
MAX_UNDECODABLE_RUN = 100
DAMAGED_RUNS_NAMED = 5  # runs of undecodable frames named one by one; the rest are counted at close()

_STREAM = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
# a camera: its index, /dev/videoN, or udev's stable names for it (/dev/v4l/by-id/..., by-path/...),
# which keep naming the same camera whatever order the cameras were plugged in
_DEVICE = re.compile(r"^(?:\d+|/dev/video\d+|/dev/v4l/by-(?:id|path)/[^/\s]+)$")
# The network protocols of FFmpeg's that cameras stream over: another scheme is a typo ("rstp://"),
# which would otherwise be retried for ever as a stream that is down.
STREAM_SCHEMES = ("rtsp", "rtsps", "rtmp", "rtmps", "http", "https", "rtp", "udp", "tcp", "srt")
STREAM_TIMEOUT_MS = 5000


def redacted(uri: str) -> str:
    """`uri` with its secrets as ***: the password of its user information (rtsp://user:***@host/...)
    and the values of query parameters named like one (?user=admin&password=***, pwd, token, key,
    auth, secret, signature): a source's description is in every log line and in systemd's STATUS,
    which any local user reads. Read from the text, not by urllib, which leaves a URL it cannot
    split (an unclosed IPv6 bracket) whole: everything before the last @ counts as user
    information, so a password holding /, ? or @ is hidden whole too (and a path or query holding
    an @ after a port may be hidden with it)."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return uri
    userinfo, at, after = rest.rpartition("@")
    if at and ":" in userinfo:
        rest = f"{userinfo.partition(':')[0]}:***@{after}"
    return f"{scheme}://" + _SECRET_PARAMETER.sub(r"\1***", rest)


# a query parameter whose value is a secret: its name holds one of these words
_SECRET_PARAMETER = re.compile(r"([?&;][^=&;#]*(?:pass|pwd|token|key|auth|secret|sig|cred)[^=&;#]*=)[^&;#]*", re.IGNORECASE)


def classify(uri: str) -> str:
    """'camera', 'stream' or 'file' for a source uri; InputError for a stream of another scheme
    than STREAM_SCHEMES."""
    if _DEVICE.match(uri):
        return "camera"
    stream = _STREAM.match(uri)
    if stream:
        if stream.group(1).lower() not in STREAM_SCHEMES:
            raise InputError(f"source {redacted(uri)!r}: unknown stream scheme {stream.group(1)!r}; expected one of "
                             f"{', '.join(STREAM_SCHEMES)}")
        return "stream"
    return "file"


class OpenCVSource(SourceBase):
    """See module docstring. width/height/fps are requests for cameras only (None: driver default)."""

    def __init__(self, uri: str, *, width: int | None = None, height: int | None = None,
                 fps: float | None = None, live: bool | None = None) -> None:
        super().__init__()
        try:
            uri.encode("utf-8")
        except UnicodeEncodeError:  # OpenCV crashed the process (SIGSEGV) on such a name
            raise InputError(f"source {redacted(uri)!r}: the name is not valid UTF-8, which OpenCV cannot open; "
                             "expected a UTF-8 name (rename the file)") from None
        self.uri = uri
        self.kind = classify(uri)
        self.live = self.kind != "file" if live is None else live
        self.request = (width, height, fps)
        what = {"camera": "camera", "stream": "stream", "file": "video file"}[self.kind]
        self.description = f"{what} {redacted(uri)!r}"
        self._cap = None
        self._first: tuple[np.ndarray, float | None] | None = None  # (image, media_s) decoded at open(), returned by the first read()
        # a video file's reading: the frames its header declares (None: unknown), the frames passed
        # (decoded or skipped), and the undecodable ones skipped and their runs, since it was opened
        self._declared: int | None = None
        self._position = 0
        self._skipped = 0
        self._damaged_runs = 0

    def open(self) -> None:
        import cv2

        self.close()
        # OpenCV logs its own warning for every failed open; our error line says it better.
        level = cv2.utils.logging.getLogLevel()
        cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_ERROR)
        try:
            self._open(cv2)
        finally:
            cv2.utils.logging.setLogLevel(level)

    def _open(self, cv2) -> None:
        if self.kind == "camera":
            device = f"/dev/video{self.uri}" if self.uri.isdecimal() else self.uri
            if not os.path.exists(device):
                raise SourceUnavailable(f"{self.description}: {device} does not exist (camera absent or unplugged?)")
            cap = cv2.VideoCapture(device, cv2.CAP_V4L2)
            width, height, fps = self.request
            if cap.isOpened():
                if width:
                    cap.set(cv2.CAP_PROP_FRAME_WIDTH, width)
                if height:
                    cap.set(cv2.CAP_PROP_FRAME_HEIGHT, height)
                if fps:
                    cap.set(cv2.CAP_PROP_FPS, fps)
                cap.set(cv2.CAP_PROP_BUFFERSIZE, 1)  # newest frame, not a driver queue of stale ones
        elif self.kind == "stream":
            cap = cv2.VideoCapture(self.uri, cv2.CAP_FFMPEG, [
                cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, STREAM_TIMEOUT_MS, cv2.CAP_PROP_READ_TIMEOUT_MSEC, STREAM_TIMEOUT_MS])
        else:
            path = Path(self.uri)
            if not _exists(path):  # a folder or a file meant: neither is there
                self._fail(f"source {redacted(self.uri)!r}: no such file or folder; expected a video file, an image "
                           "folder, a camera (0 or /dev/video0) or an rtsp/http URL")
            if not _is_file(path):
                self._fail(f"{self.description}: not a regular file; expected a video file, a camera (0 or "
                           "/dev/video0) or an rtsp/http URL")
            cap = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
        if not cap.isOpened():
            cap.release()
            self._fail(f"{self.description}: OpenCV cannot open it; expected "
                       + ("a readable V4L2 camera" if self.kind == "camera" else
                          "a reachable stream" if self.kind == "stream" else "a video file FFmpeg can decode"))
        # what it says before its first frame is decoded (an 8000 x 8000 image file took 700 MB), and
        # what it decodes (a stream may say 0 x 0 until then)
        self._check_size(cap, int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)))
        if self.kind == "file":
            declared = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
            self._declared, self._position = (declared if declared > 0 else None), 0
            image = self._read_file(cap)
        else:
            ok, image = cap.read()
            image = image if ok else None
        if image is None:
            cap.release()
            self._fail(f"{self.description}: opened but no frame could be decoded; expected "
                       + ("a video file with at least one readable frame (corrupt or truncated?)"
                          if self.kind == "file" else "frames from a working device"))
        self._check_size(cap, image.shape[1], image.shape[0])
        self._cap, self._first = cap, (image, self._media_s(cap))

    def _check_size(self, cap, width: int, height: int) -> None:
        """Release `cap` and raise InputError if frames of width x height are over MAX_PIXELS: the
        source's settings, not a failure that retrying a live one would mend."""
        if width * height > MAX_PIXELS:
            cap.release()
            raise InputError(f"{self.description}: frames of {width}x{height} are over {MAX_PIXELS // 1_000_000} "
                             "megapixels; expected smaller frames (the guard detects faces a few hundred pixels wide)")

    def read(self) -> Frame | None:
        if self._cap is None:
            raise SourceUnavailable(f"{self.description}: read before open")
        if self._first is not None:
            (image, media_s), self._first = self._first, None
            return self._frame(image, media_s=media_s)
        if self.kind == "file":
            image = self._read_file(self._cap)
            if image is None and self._declared is not None and self._position < self._declared:
                log.warning("%s: ended at frame %d of the %d its header declares (cut short, or the rest does not "
                            "decode)", self.description, self._position, self._declared)
        else:
            ok, image = self._cap.read()
            image = image if ok else None
        if image is None:
            if self.live:
                raise SourceUnavailable(f"{self.description}: no frame (unplugged, or the stream dropped?)")
            return None  # end of the file
        return self._frame(image, media_s=self._media_s(self._cap))

    def _read_file(self, cap) -> np.ndarray | None:
        """The next frame of a video file that decodes, past a run of at most MAX_UNDECODABLE_RUN
        that do not (nor past the declared count); None at the end. self._position moves past both.
        A read is always tried: the declared count only ends a run of failures that reaches it, as a
        header that understates the frames (an estimate) must not cut off the ones past it."""
        failed = 0
        while True:
            ok, image = cap.read()
            if ok and image is not None:
                if failed:
                    self._skipped_damaged(failed)
                self._position += failed + 1
                return image
            failed += 1
            # past a count that understated the frames, only the bound on a run ends the file
            if failed >= MAX_UNDECODABLE_RUN or (
                    self._declared is not None and self._position < self._declared <= self._position + failed):
                return None

    def _skipped_damaged(self, count: int) -> None:
        """Note a run of `count` undecodable frames from self._position, skipped; warn of the first
        DAMAGED_RUNS_NAMED runs (a badly damaged file would otherwise write a line per frame)."""
        self._skipped += count
        self._damaged_runs += 1
        if self._damaged_runs <= DAMAGED_RUNS_NAMED:
            frames = (f"frame {self._position} does" if count == 1
                      else f"frames {self._position}-{self._position + count - 1} do")
            more = "; further ones are counted when the file is closed" if self._damaged_runs == DAMAGED_RUNS_NAMED else ""
            log.warning("%s: %s not decode (damaged?); skipped%s", self.description, frames, more)

    def _media_s(self, cap) -> float | None:
        """The position of the frame just read in a video file, seconds (its presentation time as
        FFmpeg decodes it); None for cameras and streams, which have no position to find again."""
        if self.kind != "file":
            return None
        import cv2

        return max(0.0, float(cap.get(cv2.CAP_PROP_POS_MSEC)) / 1000.0)

    def close(self) -> None:
        if self._damaged_runs > DAMAGED_RUNS_NAMED:
            log.warning("%s: %d undecodable frame(s) skipped in all, in %d runs (the first %d named above)",
                        self.description, self._skipped, self._damaged_runs, DAMAGED_RUNS_NAMED)
        self._skipped = self._damaged_runs = 0
        if self._cap is not None:
            self._cap.release()
            self._cap = None
        self._first = None

    def _fail(self, message: str) -> NoReturn:
        """A failure: worth retrying for a live source, the user's mistake for a file."""
        raise SourceUnavailable(message) if self.live else InputError(message)


def _exists(path: Path) -> bool:
    """path.exists(), False for a name the OS cannot look up."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _is_file(path: Path) -> bool:
    """path.is_file(), False for a name the OS cannot look up (too long, a NUL in it), as for
    one that does not exist."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False
