"""Frame sources (docs/ARCHITECTURE.md, section 3) and the capture thread.

    make_source(config.source, spec=args.source, realtime=True, luma_width=config.detect.detect_width)
        -> Source   (synthetic | opencv | folder | picamera2; see each module)
    Capture(source, config.source.queue_size, max_frames=config.source.frames)  -> frames on a thread

Importing this package imports neither OpenCV's capture backends nor picamera2.
"""

from __future__ import annotations

from pathlib import Path

from tracker.errors import InputError
from tracker.sources.base import Backoff, Capture, CaptureStats, LumaFrame, Source, SourceUnavailable

__all__ = ["Backoff", "Capture", "CaptureStats", "LumaFrame", "Source", "SourceUnavailable", "make_source"]

_SPEC_HELP = ("expected 'synthetic', 'picamera2[:N]', a camera index or /dev/videoN, an rtsp/http URL, "
              "a video file or an image folder")
_URI_HELP = {"opencv": "a camera index or /dev/videoN, an rtsp/http URL or a video file", "folder": "a folder of images"}


def make_source(config, *, spec: str | None = None, realtime: bool = True, luma_width: int | None = None) -> Source:
    """The source described by `config` (a `tracker.config.SourceConfig`), or by `spec` (the CLI's
    --source text, which overrides config.kind and config.uri; size, fps, seed and frames still come
    from `config`).

    realtime: for the synthetic scene, pace frames at config.fps like a camera (True, the demo) or
        render them as fast as they are consumed (False, tests and benchmarks).
    luma_width: for the Pi camera, the width of the low-resolution luma stream (usually
        config.detect.detect_width); None for none.
    """
    kind, uri = config.kind, config.uri
    if spec is not None:
        kind, uri = _parse_spec(spec)
    if kind == "synthetic":
        from tracker.sources.synthetic import SyntheticSource

        return SyntheticSource(config.width, config.height, config.fps, config.seed,
                               frames=config.frames, realtime=realtime, faces_dir=config.faces_dir)
    if kind == "picamera2":
        try:
            camera = int(uri or 0)
        except ValueError:
            camera = -1
        if camera < 0:  # -1 would be Python's last camera, not a camera of that number
            raise InputError(f"source: picamera2 camera number {uri!r} is not a whole number >= 0; expected e.g. 0")
        from tracker.sources.picamera import PiCameraSource

        return PiCameraSource(camera, width=config.width, height=config.height, fps=config.fps, luma_width=luma_width)
    if not uri:  # (only the config's: --source is never empty)
        raise InputError(f"config: key 'source.uri': empty for source kind {kind!r}; expected {_URI_HELP[kind]}")
    if kind == "folder":
        from tracker.sources.folder import FolderSource

        return FolderSource(uri)
    from tracker.sources.opencv_source import OpenCVSource

    source = OpenCVSource(uri, width=config.width, height=config.height, fps=config.fps)  # (opens nothing yet)
    # (--source takes a folder for kind folder itself; "0" is camera 0 even beside a folder named 0)
    if source.kind == "file" and _is_folder(uri):
        raise InputError(f"config: key 'source.kind': 'opencv' with source.uri {uri!r}, a folder; expected source.kind "
                         f"folder for a folder of images (opencv takes {_URI_HELP['opencv']})")
    return source


def _parse_spec(spec: str) -> tuple[str, str]:
    """--source text -> (kind, uri)."""
    text = spec.strip()
    if not text:
        raise InputError(f"--source: empty; {_SPEC_HELP}")
    if text == "synthetic":
        return "synthetic", ""
    if text == "picamera2" or text.startswith("picamera2:"):
        return "picamera2", text.partition(":")[2]
    return ("folder" if _is_folder(text) else "opencv"), text


def _is_folder(uri: str) -> bool:
    """Whether `uri` names a folder; False for a name too long or with a NUL in it (the video
    file's check says so)."""
    try:
        return Path(uri).is_dir()
    except (OSError, ValueError):
        return False
