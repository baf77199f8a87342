"""The Raspberry Pi camera through picamera2 (libcamera). Live.

picamera2 is imported only in open(): it comes from Raspberry Pi OS's apt package
`python3-picamera2` (it needs the system's libcamera bindings), so the venv must be created with
`--system-site-packages`; pip's picamera2 is not used. Without it, open() raises an InputError that
says how to install it. This code cannot run on a machine without the camera stack; it is written
against picamera2's documented API (Raspberry Pi OS Bookworm) and untested here.

Streams: 'main' at width x height in format "RGB888" (picamera2's name for 24-bit pixels stored
B, G, R: OpenCV's BGR, no conversion) for crops and snapshots; and, when `luma_width` is smaller
than the main width, a 'lores' stream in YUV420 (the only lores format on the Pi 3's VC4 ISP) whose
Y plane is a free downscaled grey image for the motion gate and the detector: the ISP scales it, so
the CPU does not convert and shrink the full frame. Frames are `LumaFrame`s carrying that plane.

A failure to find, open or read the camera is SourceUnavailable: the capture thread retries with
back-off. Reads have a timeout so a stalled camera is detected: READ_TIMEOUT_S, or two frame times
when frames come slower than that (`source.fps` down to 0.01: one a 100 s).
"""

from __future__ import annotations

from tracker.errors import InputError
from tracker.sources.base import SourceBase, SourceUnavailable
from tracker.types import Frame

READ_TIMEOUT_S = 2.0  # at least; see read_timeout_s


def _even(value: float) -> int:
    return max(2, int(value) // 2 * 2)


class PiCameraSource(SourceBase):
    live = True

    def __init__(self, camera: int = 0, *, width: int = 640, height: int = 480, fps: float = 10.0,
                 luma_width: int | None = None) -> None:
        super().__init__()
        self.camera = camera
        self.size = (_even(width), _even(height))
        self.fps = fps
        self.luma_size = None
        if luma_width is not None and luma_width < self.size[0]:
            self.luma_size = (_even(luma_width), _even(luma_width * self.size[1] / self.size[0]))
        self.description = f"Pi camera {camera}"
        self._cam = None

    @property
    def read_timeout_s(self) -> float:
        """How long a read waits for a frame before the camera counts as stalled: READ_TIMEOUT_S, or
        two frame times at a slower rate (a fixed 2 s failed every read below 0.5 fps)."""
        return max(READ_TIMEOUT_S, 2 / self.fps)

    def library(self):
        """picamera2's Picamera2 class; InputError (exit 2: an install to mend, not a camera to wait
        for) if it cannot be imported. `tracker --check-config` asks for it too."""
        try:
            from picamera2 import Picamera2
        except ImportError as err:
            # scripts/setup makes the venv but installs no picamera2: the README's Pi steps apt-install it first
            raise InputError(f"{self.description}: picamera2 is not importable ({err}); expected apt's python3-picamera2 "
                             "(sudo apt install python3-picamera2) in a venv made with --system-site-packages "
                             "(scripts/setup --pi makes one; scripts/install-pi does both)") from None
        except ValueError as err:  # "numpy.dtype size changed": apt's simplejpeg, built for apt's numpy
            raise InputError(f"{self.description}: picamera2 is not importable ({err}); expected simplejpeg built "
                             "for the venv's numpy: pip install 'tracker[camera]' (scripts/setup --pi and "
                             "scripts/install-pi do)") from None
        return Picamera2

    def open(self) -> None:
        Picamera2 = self.library()  # noqa: N806 - the class, named as picamera2 names it
        self.close()
        try:
            if self.camera >= len(Picamera2.global_camera_info()):
                raise SourceUnavailable(f"{self.description}: no such camera (is the ribbon cable seated?)")
            cam = Picamera2(self.camera)
        except SourceUnavailable:
            raise
        except Exception as err:  # libcamera reports failures as RuntimeError and friends
            raise SourceUnavailable(f"{self.description}: cannot open ({err})") from None
        try:
            frame_us = int(1_000_000 / self.fps)
            config = cam.create_video_configuration(
                main={"size": self.size, "format": "RGB888"},
                lores={"size": self.luma_size, "format": "YUV420"} if self.luma_size else None,
                controls={"FrameDurationLimits": (frame_us, frame_us)},
                buffer_count=4,
                queue=False,  # every capture waits for a new frame instead of returning a queued one
            )
            cam.configure(config)
            cam.start()
            actual = cam.camera_configuration()  # the sizes the ISP chose
            size = tuple(actual["main"]["size"])
            luma_size = tuple(actual["lores"]["size"]) if self.luma_size else None
        except Exception as err:  # (a configuration without the streams asked for, too)
            cam.close()
            raise SourceUnavailable(f"{self.description}: cannot start at {self.size} ({type(err).__name__}: {err})") from None
        self.size, self.luma_size = size, luma_size
        self._cam = cam

    def read(self) -> Frame | None:
        if self._cam is None:
            raise SourceUnavailable(f"{self.description}: read before open")
        names = ["main", "lores"] if self.luma_size else ["main"]
        try:
            arrays, _metadata = self._cam.capture_arrays(names, wait=self.read_timeout_s)
        except Exception as err:  # TimeoutError or a libcamera error: treat the camera as gone
            raise SourceUnavailable(f"{self.description}: capture failed ({type(err).__name__}: {err})") from None
        # capture_arrays copies out of the camera's buffers. t_ns is stamped on return (in
        # SourceBase._frame) rather than taken from SensorTimestamp, whose clock is not necessarily
        # the monotonic clock the core reads.
        if self.luma_size:
            w, h = self.luma_size
            return self._frame(arrays[0], luma=arrays[1][:h, :w])
        return self._frame(arrays[0])

    def close(self) -> None:
        cam, self._cam = self._cam, None
        if cam is not None:
            try:
                cam.stop()
            finally:
                cam.close()
