"""The Source protocol and the capture thread that runs a source into a bounded queue.

A source produces `Frame(seq, t_ns, image)`: `image` is (H, W, 3) uint8 BGR, `t_ns` the monotonic
time (`time.monotonic_ns`) at which the image was obtained, `seq` counts the frames the source has
produced since it was created, from 0, without gaps (a reopened source keeps counting, so any gap a
consumer sees is a drop). A source may return a `LumaFrame`, which also carries a low-resolution
luma plane of the same view (the Pi camera's 'lores' stream) that the motion gate and the detector
use instead of downscaling the full image.

`Capture` runs one source on its own thread:
- a bounded queue of `queue_size` frames and of `max_bytes` of pixels (a 24-megapixel photo of a
  folder is 72 MB: four of them would take a Pi 3's free memory; one frame is always let in, whatever
  its size); when the consumer is slower than the source, the OLDEST queued frame is dropped and
  counted (`Capture.dropped`), so the consumer always gets the newest picture and never waits
  behind stale ones. Offline sources (files, folders, the synthetic scene
  run as fast as possible) instead wait for room, so every frame is processed and runs are
  reproducible; `drop_oldest` overrides the choice.
- a live source that fails (cannot open, read error, camera unplugged) is closed and reopened with
  exponential back-off, one log line per attempt, forever, until `stop()`;
- an offline source that ends ends the run: `get()` returns None (the end-of-stream sentinel) once
  the queued frames are consumed; a fatal error (InputError: missing or corrupt file) is re-raised
  by `get()` in the consumer's thread.
- `stop()` returns within about a second, even if the source is stuck in a read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from tracker.errors import InputError
from tracker.types import Frame

log = logging.getLogger(__name__)

MAX_QUEUED_BYTES = 64 << 20  # of the capture queue's frames: ten 1080p BGR frames (as the batcher's bound)


@dataclass(frozen=True)
class LumaFrame(Frame):
    """A Frame that also carries `luma`: (h, w) uint8, the camera's own low-resolution Y plane of
    the same field of view as `image` (any size; consumers scale by image width / luma width)."""

    luma: np.ndarray | None = None


class SourceUnavailable(InputError):
    """A live source cannot deliver right now (absent, unplugged, stream down): the capture thread
    retries it. Its message names the source and what went wrong. Fatal (exit 2) only when a
    non-live source raises it."""


@runtime_checkable
class Source(Protocol):
    """What the capture thread drives. All methods are called from the capture thread only.

    description: names the source in log lines and errors, e.g. "camera /dev/video0".
    live:        True for cameras and network streams: failures are retried, the source never
                 ends by itself. False for files, folders and finite synthetic scenes.
    pace_fps:    if not None, the capture thread releases frames at this rate (a live-like
                 synthetic scene); None means as fast as the source delivers.
    """

    description: str
    live: bool
    pace_fps: float | None

    def open(self) -> None:
        """Acquire the device or file. Raises SourceUnavailable (retried for a live source) or
        InputError (fatal: the user named something that cannot work)."""

    def read(self) -> Frame | None:
        """The next frame; None when an offline source has no more. Raises SourceUnavailable when a
        live source fails (the capture thread closes and reopens it) or InputError (fatal)."""

    def close(self) -> None:
        """Release the device or file; idempotent, safe after a failed open."""


class SourceBase:
    """Common bookkeeping for the concrete sources: the frame counter and the BGR contract."""

    description = "source"
    live = False
    pace_fps: float | None = None

    def __init__(self) -> None:
        self._seq = 0

    def _frame(self, image: np.ndarray, luma: np.ndarray | None = None, media_s: float | None = None) -> Frame:
        """Wrap `image` as the next Frame, converting grey/BGRA to (H, W, 3) uint8 BGR; `media_s`
        is its position in its video, seconds (None: not a recording)."""
        image = as_bgr(image, self.description)
        t_ns = time.monotonic_ns()
        frame = (Frame(self._seq, t_ns, image, media_s) if luma is None
                 else LumaFrame(self._seq, t_ns, image, media_s, luma))
        self._seq += 1
        return frame

    def open(self) -> None:
        """Nothing to acquire by default."""

    def close(self) -> None:
        """Nothing to release by default."""


def as_bgr(image: np.ndarray, what: str) -> np.ndarray:
    """`image` as a C-contiguous (H, W, 3) uint8 BGR array (grey and BGRA converted)."""
    import cv2

    if image.dtype != np.uint8:
        raise SourceUnavailable(f"{what}: frame has dtype {image.dtype}; expected uint8")
    if image.ndim == 2:
        return cv2.cvtColor(image, cv2.COLOR_GRAY2BGR)
    if image.ndim == 3 and image.shape[2] == 4:
        return cv2.cvtColor(image, cv2.COLOR_BGRA2BGR)
    if image.ndim == 3 and image.shape[2] == 3:
        return np.ascontiguousarray(image)
    raise SourceUnavailable(f"{what}: frame has shape {image.shape}; expected (H, W) or (H, W, 3|4)")


@dataclass(frozen=True)
class Backoff:
    """Delays between reopen attempts: initial_s, doubled each failure, capped at max_s. The count
    of failures starts afresh only once the source has delivered for stable_s after a (re)open: a
    stream that drops after each frame or two would otherwise be reopened every initial_s forever."""

    initial_s: float = 0.5
    max_s: float = 10.0
    stable_s: float = 10.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait before reopen attempt number `attempt` (1 = first retry)."""
        return min(self.max_s, self.initial_s * 2.0 ** (attempt - 1))


@dataclass(frozen=True)
class CaptureStats:
    """Counters of one capture run (since its start, but for failures_since_frame)."""

    captured: int  # frames read from the source
    delivered: int  # frames handed to the consumer
    dropped: int  # frames discarded because the queue was full (oldest first)
    failures: int  # open or read failures of a live source
    reopens: int  # successful reopens after a failure
    failures_since_frame: int  # of those, since the source last gave a frame (queued or not yet taken)


class Capture:
    """Runs `source` on a daemon thread into a bounded queue; see the module docstring.

    Use:
        with Capture(source, queue_size=4) as capture:     # starts the thread
            for frame in capture:                          # ends at end of stream or stop()
                ...
        capture.dropped                                    # thread-safe drop counter

    max_frames: stop (as at end of stream) after the source has produced this many frames, the
        ones dropped from the queue included (config source.frames, --frames).
    max_bytes: the queue is also full when one more frame would take its images (and luma
        planes) past this many bytes; an empty queue takes any frame.
    drop_oldest: None picks by source.live or source.pace_fps (live-like sources drop,
        offline sources block the capture thread until there is room).
    """

    def __init__(
        self,
        source: Source,
        queue_size: int = 4,
        *,
        max_frames: int | None = None,
        max_bytes: int = MAX_QUEUED_BYTES,
        drop_oldest: bool | None = None,
        backoff: Backoff = Backoff(),
        stop_timeout_s: float = 0.9,
    ) -> None:
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        self.source = source
        self.queue_size = queue_size
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self._queued_bytes = 0
        self.drop_oldest = (source.live or source.pace_fps is not None) if drop_oldest is None else drop_oldest
        self.backoff = backoff
        self.stop_timeout_s = stop_timeout_s
        self._queue: deque[Frame] = deque()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._ended = False
        self._error: BaseException | None = None
        self._captured = self._delivered = self._dropped = self._failures = self._reopens = 0
        self._failures_since_frame = 0
        self._thread: threading.Thread | None = None

    # -- consumer side -------------------------------------------------------------------------

    def start(self) -> Capture:
        if self._thread is not None:
            raise RuntimeError("Capture.start() called twice")
        self._thread = threading.Thread(target=self._run, name=f"capture[{self.source.description}]", daemon=True)
        self._thread.start()
        return self

    def get(self, timeout: float | None = None) -> Frame | None:
        """The oldest queued frame; None at end of stream or after stop(). Blocks until a frame
        comes; raises TimeoutError if `timeout` seconds pass first, and re-raises a fatal source
        error (after the frames read before it)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._stop.is_set():
                    return None
                if self._queue:
                    frame = self._queue.popleft()
                    self._queued_bytes -= _frame_bytes(frame)
                    self._delivered += 1
                    self._cond.notify_all()  # a blocking producer may be waiting for room
                    return frame
                if self._ended:
                    if self._error is not None:
                        error, self._error = self._error, None
                        raise error
                    return None
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"no frame from {self.source.description} within {timeout} s")
                self._cond.wait(remaining)

    def __iter__(self) -> Iterator[Frame]:
        while (frame := self.get()) is not None:
            yield frame

    def stop(self, wait: bool = True) -> None:
        """Stop capturing and wake the consumer. With `wait`, returns once the thread has ended, or
        within `stop_timeout_s` (+ a little): the thread closes the source itself, and if it is stuck
        inside a blocking read (e.g. a stalled network stream), it is left to finish on its own (it
        is a daemon and drops its frame). Without, at once: a signal handler may have interrupted
        this thread's own get() holding the lock the capture thread needs to end."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if wait and self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.stop_timeout_s)
            if self._thread.is_alive():
                log.warning("%s: still inside a read after stop(); leaving it to finish in the background",
                            self.source.description)

    def __enter__(self) -> Capture:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def dropped(self) -> int:
        """Frames dropped so far because the consumer was slower than the source."""
        with self._cond:
            return self._dropped

    def stats(self) -> CaptureStats:
        with self._cond:
            return CaptureStats(self._captured, self._delivered, self._dropped, self._failures, self._reopens,
                                self._failures_since_frame)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- capture thread ------------------------------------------------------------------------

    def _run(self) -> None:
        source = self.source
        opened = False
        attempt = 0  # failures since the source last delivered for backoff.stable_s
        opened_at = 0.0  # monotonic time of the last (re)open
        next_due = None  # monotonic time the next paced frame is due
        try:
            while not self._stop.is_set():
                if not opened:
                    try:
                        source.open()
                    except SourceUnavailable as err:
                        attempt = self._failed(err, attempt)
                        continue
                    opened, opened_at = True, time.monotonic()
                    if attempt:
                        with self._cond:
                            self._reopens += 1
                        log.warning("%s: reopened after %d failed attempt(s)", source.description, attempt)
                if source.pace_fps is not None:
                    # Release frames at the source's rate, like a camera would (waiting before the
                    # read, so t_ns is the release time).
                    now = time.monotonic()
                    if next_due is None:
                        next_due = now
                    if self._stop.wait(max(0.0, next_due - now)):
                        break
                try:
                    frame = source.read()
                    if frame is None and source.live:
                        raise SourceUnavailable(f"{source.description}: stream ended; a live source should not end")
                except SourceUnavailable as err:
                    self._close_source()
                    opened = False
                    attempt = self._failed(err, attempt)
                    continue
                if next_due is not None and source.pace_fps is not None:
                    next_due = _next_due(next_due, time.monotonic(), 1.0 / source.pace_fps)
                if attempt and time.monotonic() - opened_at >= self.backoff.stable_s:
                    attempt = 0
                if frame is None:
                    break  # an offline source ended
                self._put(frame)
                if self.max_frames is not None and self._captured >= self.max_frames:
                    break
        except BaseException as err:  # a fatal error is handed to the consumer, never lost
            self._error = err
        finally:
            self._close_source()
            with self._cond:
                self._ended = True
                self._cond.notify_all()

    def _close_source(self) -> None:
        try:
            self.source.close()
        except Exception as err:  # closing a broken device must not hide the failure being handled
            log.warning("%s: error while closing: %s", self.source.description, err)

    def _failed(self, err: SourceUnavailable, attempt: int) -> int:
        """Count a live-source failure, log it, wait the back-off delay; return the new attempt."""
        if not self.source.live:
            raise err
        attempt += 1
        delay = self.backoff.delay(attempt)
        with self._cond:
            self._failures += 1
            self._failures_since_frame += 1
        log.warning("%s; retrying in %.1f s (attempt %d)", err, delay, attempt)
        self._stop.wait(delay)
        return attempt

    def _put(self, frame: Frame) -> None:
        size = _frame_bytes(frame)
        with self._cond:
            self._captured += 1
            self._failures_since_frame = 0
            if self.drop_oldest:
                while self._full_for(size):
                    self._queued_bytes -= _frame_bytes(self._queue.popleft())
                    self._dropped += 1
            else:
                while self._full_for(size) and not self._stop.is_set():
                    self._cond.wait()
            self._queue.append(frame)
            self._queued_bytes += size
            self._cond.notify_all()

    def _full_for(self, size: int) -> bool:
        """Whether a frame of `size` bytes needs room first (the caller holds the lock)."""
        return bool(self._queue) and (len(self._queue) >= self.queue_size or self._queued_bytes + size > self.max_bytes)


def _next_due(due: float, read_at: float, interval: float) -> float:
    """When the paced frame after one `due` at and read by `read_at` is due (monotonic seconds): one
    `interval` on. A frame read less than an interval late (a late wake-up, a slow read) keeps the
    schedule, so the rate stays the source's on average. One read later than that (the source is
    slower than its rate, or this thread stalled) makes the next frame due at once, and the schedule
    restarts from it: a source slower than its rate runs at its own (as a camera does), and after a
    stall the frames it missed are not released back to back to catch up, which the drop-oldest
    queue would count as drops (catching up on at most a second's worth, a 3 s stall at 10 fps sent
    ten frames at once, and a queue of 4 dropped 8 of them; restarting one interval after the late
    read instead halved a slow source's rate)."""
    return due + interval if read_at - due <= interval else read_at


def _frame_bytes(frame: Frame) -> int:
    """The memory a queued frame holds: its image and, for a LumaFrame, its luma plane."""
    luma = getattr(frame, "luma", None)
    return frame.image.nbytes + (0 if luma is None else luma.nbytes)
