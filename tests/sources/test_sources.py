"""Sources and the capture thread: queue policy and drop counting, reopen with back-off, clean end,
stop(), and the bad inputs (absent camera, missing/corrupt video, non-images in a folder)."""

from __future__ import annotations

import logging
import re
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
from test_pipeline_e2e import isolated_env, tracker_command

from tracker.config import SourceConfig
from tracker.errors import InputError
from tracker.images import MAX_FILE_BYTES
from tracker.sources import Backoff, Capture, SourceUnavailable, base, make_source, opencv_source
from tracker.sources.base import SourceBase
from tracker.sources.folder import FolderSource
from tracker.sources.opencv_source import OpenCVSource
from tracker.sources.picamera import PiCameraSource
from tracker.sources.synthetic import SyntheticSource

FAST = Backoff(initial_s=0.001, max_s=0.004, stable_s=0.0)  # stable at its first frame: a failure later is attempt 1


def wait_until(condition, what: str, limit_s: float = 20.0) -> None:
    """Wait for a condition the test cannot be notified of (not a timing assertion: the limit only
    turns a hang into a failure)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.005)


def write_video(path: Path, frames: int = 8, size=(64, 48), step: int = 30) -> None:
    """A real MJPEG AVI whose frame i is uniformly grey level step*i."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, size)
    assert writer.isOpened()
    for i in range(frames):
        writer.write(np.full((size[1], size[0], 3), step * i, np.uint8))
    writer.release()


# -- the capture queue ------------------------------------------------------------------------------

def test_slow_consumer_gets_the_newest_frames_and_the_drops_are_counted():
    source = SyntheticSource(160, 120, frames=40, realtime=False)
    capture = Capture(source, queue_size=3, drop_oldest=True).start()
    wait_until(lambda: not capture.running, "the source to finish")  # the consumer has not read yet
    frames = list(capture)
    assert [f.seq for f in frames] == [37, 38, 39]  # the oldest were dropped, order kept
    assert capture.dropped == 37
    stats = capture.stats()
    assert (stats.captured, stats.delivered, stats.dropped) == (40, 3, 37)


def test_interleaved_slow_consumer_keeps_order_and_accounts_for_every_frame():
    source = SyntheticSource(160, 120, frames=60, realtime=False)
    seen = []
    with Capture(source, queue_size=2, drop_oldest=True) as capture:
        for frame in capture:
            seen.append(frame.seq)
            time.sleep(0.002)  # a slow consumer; how many frames it misses does not matter
    assert seen == sorted(set(seen))
    assert seen[-1] == 59  # the newest frame is never dropped
    assert len(seen) + capture.dropped == 60


def test_offline_source_waits_for_the_consumer_and_drops_nothing():
    source = SyntheticSource(160, 120, frames=30, realtime=False)
    capture = Capture(source, queue_size=2).start()
    assert not capture.drop_oldest
    wait_until(lambda: capture.stats().captured == 3, "the producer to fill the queue")
    assert capture.running  # blocked on the full queue, not finished
    assert [f.seq for f in capture] == list(range(30))
    assert capture.dropped == 0


def test_the_queue_is_bounded_in_bytes_too():
    """Frames of 160x120 BGR (57,600 bytes): room for 2.5 of them holds two, however many frames
    the queue could hold, dropping the oldest (live) or waiting (offline); a frame larger than the
    whole bound still goes through alone."""
    frame_bytes = 160 * 120 * 3
    live = Capture(SyntheticSource(160, 120, frames=20, realtime=False), queue_size=10,
                   max_bytes=int(2.5 * frame_bytes), drop_oldest=True).start()
    wait_until(lambda: not live.running, "the source to finish")
    assert [f.seq for f in live] == [18, 19] and live.dropped == 18
    offline = Capture(SyntheticSource(160, 120, frames=6, realtime=False), queue_size=10,
                      max_bytes=int(2.5 * frame_bytes)).start()
    wait_until(lambda: offline.stats().captured == 3, "the producer to fill the queue")
    assert offline.running  # two queued and the third waiting for room
    assert [f.seq for f in offline] == list(range(6)) and offline.dropped == 0
    alone = Capture(SyntheticSource(160, 120, frames=3, realtime=False), queue_size=4, max_bytes=1000)
    with alone:
        assert [f.seq for f in alone] == [0, 1, 2]


def test_max_frames_ends_the_run():
    source = SyntheticSource(160, 120, realtime=False)  # endless
    with Capture(source, queue_size=4, max_frames=12) as capture:
        assert [f.seq for f in capture] == list(range(12))


def test_paced_source_is_live_like():
    capture = Capture(SyntheticSource(160, 120, fps=200.0, frames=5, realtime=True), 2)
    assert capture.drop_oldest
    with capture:
        assert [f.seq for f in capture][-1] == 4


class _FakeClock:
    """The capture thread's clock (tracker.sources.base.time) in a test: it moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def monotonic_ns(self) -> int:
        return round(self.now * 1e9)


class _ClockedStop(threading.Event):
    """A capture's stop event whose waits pass at once on the fake clock."""

    def __init__(self, clock: _FakeClock) -> None:
        super().__init__()
        self.clock = clock

    def wait(self, timeout: float | None = None) -> bool:
        self.clock.now += timeout or 0.0
        return self.is_set()


class _StallingScene(SourceBase):
    """A paced source at 10 fps whose reads take `read_s` each and the read of frame 5 `stall_s`
    more; 20 frames."""

    description = "stalling test scene"
    pace_fps = 10.0

    def __init__(self, clock: _FakeClock, read_s: float = 0.0, stall_s: float = 3.0) -> None:
        super().__init__()
        self.clock, self.read_s, self.stall_s = clock, read_s, stall_s

    def read(self):
        self.clock.now += self.read_s + (self.stall_s if self._seq == 5 else 0.0)
        return None if self._seq == 20 else self._frame(np.zeros((8, 8, 3), np.uint8))


def paced_gaps_ms(monkeypatch, scene: _StallingScene) -> list[int]:
    """The gaps between the frames a Capture of `scene` releases, ms on its fake clock."""
    monkeypatch.setattr(base, "time", SimpleNamespace(monotonic=scene.clock.monotonic, monotonic_ns=scene.clock.monotonic_ns))
    capture = Capture(scene, queue_size=64)
    capture._stop = _ClockedStop(scene.clock)
    with capture:
        frames = list(capture)
    assert [f.seq for f in frames] == list(range(20))
    return [round((b.t_ns - a.t_ns) / 1e6) for a, b in zip(frames, frames[1:], strict=False)]


def test_a_paced_source_goes_on_at_its_rate_after_a_stall_rather_than_bursting(monkeypatch):
    """The frames a stall missed were released back to back (up to a second's worth), and the
    drop-oldest queue dropped them: a camera sends its next frame, not the ones it missed."""
    assert paced_gaps_ms(monkeypatch, _StallingScene(_FakeClock())) == [100] * 4 + [3100, 0] + [100] * 13


def test_a_paced_source_slower_than_its_rate_runs_at_its_own(monkeypatch):
    """Reads of 150 ms at 10 fps: a restart one interval after each late read made it 250 ms a frame."""
    scene = _StallingScene(_FakeClock(), read_s=0.15, stall_s=0.0)
    assert paced_gaps_ms(monkeypatch, scene) == [150] * 19


def test_get_times_out_with_a_clear_error():
    blocker = threading.Event()
    source = _BlockingSource(blocker)
    capture = Capture(source, 2).start()
    try:
        with pytest.raises(TimeoutError, match="blocking test source"):
            capture.get(timeout=0.05)
    finally:
        blocker.set()
        capture.stop()


# -- failures and reopening -------------------------------------------------------------------------

class _FlakySource(SourceBase):
    """A live source that fails to open `open_failures` times, then delivers frames, and fails one
    read after `read_failure_at` frames."""

    live = True
    description = "flaky test camera"

    def __init__(self, open_failures: int, read_failure_at: int | None = None):
        super().__init__()
        self.open_failures = open_failures
        self.read_failure_at = read_failure_at
        self.opens = 0

    def open(self):
        self.opens += 1
        if self.open_failures:
            self.open_failures -= 1
            raise SourceUnavailable(f"{self.description}: not there yet")

    def read(self):
        if self.read_failure_at is not None and self._seq == self.read_failure_at:
            self.read_failure_at = None
            raise SourceUnavailable(f"{self.description}: unplugged")
        return self._frame(np.full((8, 8, 3), self._seq % 256, np.uint8))


class _BlockingSource(SourceBase):
    live = True
    description = "blocking test source"

    def __init__(self, release: threading.Event):
        super().__init__()
        self.release = release

    def read(self):
        self.release.wait()
        return None  # a live source with nothing: treated as a failure


def test_backoff_doubles_up_to_a_bound():
    assert [Backoff(0.5, 10.0).delay(k) for k in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_live_source_is_reopened_with_backoff_and_recovers(caplog):
    source = _FlakySource(open_failures=3, read_failure_at=5)
    with caplog.at_level(logging.WARNING, logger="tracker.sources"):
        with Capture(source, queue_size=16, max_frames=10, drop_oldest=False, backoff=FAST) as capture:
            seqs = [f.seq for f in capture]
    assert seqs == list(range(10))  # the source keeps counting across reopens: no gap
    stats = capture.stats()
    assert stats.failures == 4 and stats.reopens == 2 and source.opens == 5
    retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert len(retries) == 4
    assert "not there yet; retrying in 0.0 s (attempt 1)" in retries[0]
    assert "(attempt 3)" in retries[2] and "unplugged" in retries[3] and "(attempt 1)" in retries[3]
    assert sum("reopened after" in r.getMessage() for r in caplog.records) == 2


class _DropsAfterEachFrame(SourceBase):
    """A live stream that serves one frame per connection, then drops (a camera's flaky Wi-Fi)."""

    live = True
    description = "dropping test stream"

    def open(self):
        self._served = False

    def read(self):
        if self._served:
            raise SourceUnavailable(f"{self.description}: dropped")
        self._served = True
        return self._frame(np.zeros((8, 8, 3), np.uint8))


def test_a_source_that_drops_after_each_frame_backs_off_further_each_time(caplog):
    """Its count of failures starts afresh only after it has delivered for stable_s: before, the
    first frame after each reopen reset it, and such a stream was reopened every initial_s forever."""
    backoff = Backoff(initial_s=0.001, max_s=0.016, stable_s=60.0)
    with caplog.at_level(logging.WARNING, logger="tracker.sources"):
        with Capture(_DropsAfterEachFrame(), queue_size=16, max_frames=6, drop_oldest=False, backoff=backoff) as capture:
            assert len(list(capture)) == 6
    attempts = [int(r.getMessage().rsplit("attempt ", 1)[1].rstrip(")")) for r in caplog.records
                if "retrying in" in r.getMessage()]
    assert attempts == [1, 2, 3, 4, 5]
    assert [backoff.delay(a) for a in attempts] == [0.001, 0.002, 0.004, 0.008, 0.016]


def test_absent_camera_is_retried_without_crashing(caplog):
    source = OpenCVSource("/dev/video97")
    assert source.live
    with caplog.at_level(logging.WARNING, logger="tracker.sources"):
        capture = Capture(source, 2, backoff=FAST).start()
        wait_until(lambda: capture.stats().failures >= 3, "three failed opens")
        capture.stop()
    assert not capture.running
    assert capture.get() is None
    assert "camera '/dev/video97': /dev/video97 does not exist (camera absent or unplugged?); retrying in" in caplog.text


def test_real_video_source_unplugged_mid_run_recovers(tmp_path, caplog):
    """A live OpenCV source on a real video file: at the end it is reopened (like a camera that
    stops delivering); while the file is gone every reopen fails; once it is back it recovers."""
    video = tmp_path / "camera.avi"
    write_video(video)
    source = OpenCVSource(str(video), live=True)
    with caplog.at_level(logging.WARNING, logger="tracker.sources"):
        capture = Capture(source, queue_size=64, drop_oldest=False, backoff=FAST).start()
        try:
            first = [capture.get(timeout=20) for _ in range(12)]  # more than one pass of 8 frames
            assert [f.seq for f in first] == list(range(12))
            assert [round(f.image.mean() / 30) for f in first[:9]] == [0, 1, 2, 3, 4, 5, 6, 7, 0]
            video.rename(tmp_path / "away.avi")  # "unplug"
            wait_until(lambda: capture.stats().failures >= 4, "failed reopens while the file is gone")
            reopens = capture.stats().reopens
            (tmp_path / "away.avi").rename(video)  # "plug back in"
            wait_until(lambda: capture.stats().reopens > reopens, "a reopen after plugging back")
            later = capture.get(timeout=20)
            assert later.seq > first[-1].seq and later.image.shape == (48, 64, 3)
        finally:
            capture.stop()
    assert "no such file" in caplog.text and "reopened after" in caplog.text


def test_stop_returns_even_when_the_source_is_stuck(caplog):
    release = threading.Event()
    capture = Capture(_BlockingSource(release), 2, stop_timeout_s=0.2).start()
    with caplog.at_level(logging.WARNING, logger="tracker.sources"):
        capture.stop()
    assert capture.running  # still inside read(), left to finish on its own
    assert capture.get() is None
    assert "still inside a read after stop()" in caplog.text
    release.set()
    wait_until(lambda: not capture.running, "the stuck thread to exit once its read returns")


def test_stop_interrupts_pacing_and_backoff_waits():
    slow = Capture(SyntheticSource(64, 64, fps=0.1, realtime=True), 2).start()  # 10 s a frame
    assert slow.get(timeout=20).seq == 0
    slow.stop()
    assert not slow.running
    retrying = Capture(_FlakySource(open_failures=1000), 2, backoff=Backoff(30.0, 30.0)).start()
    wait_until(lambda: retrying.stats().failures == 1, "the first failure")
    assert retrying.stats().failures_since_frame == 1
    retrying.stop()
    assert not retrying.running


# -- video files ------------------------------------------------------------------------------------

def test_video_file_plays_to_the_end_then_ends_cleanly(tmp_path):
    video = tmp_path / "clip.avi"
    write_video(video, frames=8)
    source = OpenCVSource(str(video))
    assert not source.live
    with Capture(source, 4) as capture:
        frames = list(capture)
    assert [f.seq for f in frames] == list(range(8))
    assert [round(f.image.mean() / 30) for f in frames] == list(range(8))
    assert all(f.image.dtype == np.uint8 and f.image.shape == (48, 64, 3) for f in frames)


def test_corrupt_video_is_a_clear_input_error(tmp_path):
    garbage = tmp_path / "corrupt.mp4"
    garbage.write_bytes(bytes(range(256)) * 64)
    capture = Capture(OpenCVSource(str(garbage)), 2).start()
    with pytest.raises(InputError, match=r"video file '.*corrupt\.mp4': OpenCV cannot open it; expected a video file"):
        capture.get(timeout=20)
    capture.stop()
    # A real video cut short before its first frame is complete.
    whole = tmp_path / "whole.avi"
    write_video(whole)
    cut = tmp_path / "cut.avi"
    cut.write_bytes(whole.read_bytes()[:300])
    with pytest.raises(InputError, match=r"cut\.avi"):
        OpenCVSource(str(cut)).open()


def test_a_corrupt_video_is_one_line_on_stderr_not_ffmpegs_too(tmp_path):
    """FFmpeg printed its own "[mov,mp4,... @ 0x...] moov atom not found" before the project's line."""
    no_moov = tmp_path / "no_moov.mp4"  # an MP4 header, then data with no index
    no_moov.write_bytes(b"\0\0\0\x18ftypmp42\0\0\0\0mp42isom" + b"\0\0\x10\x08mdat" + bytes(4096))
    config = tmp_path / "tracker.yaml"
    config.write_text(f"state_dir: {str(tmp_path / 'state')!r}\nweb: {{enabled: false}}\n")
    env = isolated_env(tmp_path)
    env.pop("OPENCV_FFMPEG_LOGLEVEL", None)
    proc = subprocess.run([*tracker_command(), "--log-level", "error", "--config", str(config), "--source", str(no_moov)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.startswith("tracker: error: video file ") and proc.stderr.count("\n") == 1, proc.stderr


def damage_frames(video: Path, frames: tuple[int, ...]) -> None:
    """Zero the JPEG data of the given frames (from 0) of an MJPEG AVI: FFmpeg cannot decode them, and
    decodes the others, as a recording with damaged stretches."""
    data = bytearray(video.read_bytes())
    chunks = [m.start() for m in re.finditer(b"00dc", data) if data[m.start() + 8:m.start() + 10] == b"\xff\xd8"]
    for i in frames:
        size = int.from_bytes(data[chunks[i] + 4:chunks[i] + 8], "little")
        data[chunks[i] + 8:chunks[i] + 8 + size] = bytes(size)
    video.write_bytes(data)


def read_video(path: Path) -> list:
    """The frames an OpenCVSource reads from `path`, as the grey level of each / 20 (write_video's
    frame i has level 20 * i)."""
    with Capture(OpenCVSource(str(path)), 4) as capture:
        return [round(float(f.image.mean()) / 20) for f in capture]


def test_a_video_files_damaged_frames_are_skipped_not_taken_as_its_end(tmp_path, caplog):
    """The first failed read ended the file (frame 0's refused it whole); FFmpeg decodes on past it."""
    video = tmp_path / "clip.avi"
    write_video(video, frames=12, step=20)
    damage_frames(video, (0, 4, 5, 10))
    with caplog.at_level(logging.WARNING, logger="tracker.sources"):
        assert read_video(video) == [1, 2, 3, 6, 7, 8, 9, 11]
    assert [r.getMessage() for r in caplog.records] == [
        f"video file {str(video)!r}: frame 0 does not decode (damaged?); skipped",
        f"video file {str(video)!r}: frames 4-5 do not decode (damaged?); skipped",
        f"video file {str(video)!r}: frame 10 does not decode (damaged?); skipped"]


def test_a_badly_damaged_video_names_its_first_damaged_runs_and_counts_them_all(tmp_path, caplog):
    video = tmp_path / "clip.avi"
    write_video(video, frames=20, step=10)
    damage_frames(video, (1, 3, 5, 7, 9, 11, 13))
    with caplog.at_level(logging.WARNING, logger="tracker.sources"):
        assert len(read_video(video)) == 13
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 6 and lines[4].endswith("frame 9 does not decode (damaged?); skipped; further ones are "
                                                 "counted when the file is closed")
    assert lines[5] == f"video file {str(video)!r}: 7 undecodable frame(s) skipped in all, in 7 runs (the first 5 named above)"


def test_a_video_file_cut_short_says_where_it_ended(tmp_path, caplog):
    whole = tmp_path / "whole.avi"
    write_video(whole, frames=12, step=20)
    data = whole.read_bytes()
    cut = tmp_path / "cut.avi"
    cut.write_bytes(data[:[m.start() for m in re.finditer(b"00dc", data)][7] + 20])  # inside frame 6's data
    with caplog.at_level(logging.WARNING, logger="tracker.sources"):
        assert read_video(cut) == [0, 1, 2, 3, 4, 5]
    assert caplog.messages == [f"video file {str(cut)!r}: ended at frame 6 of the 12 its header declares (cut short, "
                               "or the rest does not decode)"]


def test_a_long_undecodable_run_is_taken_as_the_files_end(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(opencv_source, "MAX_UNDECODABLE_RUN", 3)
    video = tmp_path / "clip.avi"
    write_video(video, frames=10, step=20)
    damage_frames(video, (2, 3, 4))
    with caplog.at_level(logging.WARNING, logger="tracker.sources"):
        assert read_video(video) == [0, 1]
    assert caplog.messages == [f"video file {str(video)!r}: ended at frame 2 of the 10 its header declares (cut "
                               "short, or the rest does not decode)"]


def test_a_video_whose_header_understates_its_frames_is_read_to_its_last(tmp_path, caplog):
    """The declared count ends only a run of frames that do not decode: the frames past a count
    too low (a header's estimate) were dropped once it bounded every read."""
    video = tmp_path / "clip.avi"
    write_video(video, frames=12, step=20)
    declare_frames(video, 6)
    with caplog.at_level(logging.WARNING, logger="tracker.sources"):
        assert read_video(video) == list(range(12))
    assert caplog.messages == []
    damage_frames(video, (8,))  # past the count, a frame that does not decode is skipped as before it
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tracker.sources"):
        assert read_video(video) == [0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11]
    assert caplog.messages == [f"video file {str(video)!r}: frame 8 does not decode (damaged?); skipped"]


def declare_frames(video: Path, frames: int) -> None:
    """Make an MJPEG AVI's header declare `frames` frames (the stream's dwLength, the file's dwTotalFrames)."""
    data = bytearray(video.read_bytes())
    for chunk, offset in ((b"strh", 32), (b"avih", 16)):
        at = data.find(chunk) + 8 + offset
        data[at:at + 4] = frames.to_bytes(4, "little")
    video.write_bytes(data)
    assert cv2.VideoCapture(str(video)).get(cv2.CAP_PROP_FRAME_COUNT) == frames


@pytest.mark.parametrize(("suffix", "fourcc"), [("mp4", "mp4v"), ("mkv", "XVID"), ("mkv", "MJPG")])
def test_a_video_opencv_writes_ends_at_its_last_frame_without_a_warning(tmp_path, caplog, suffix, fourcc):
    """FFmpeg estimates a Matroska file's frame count from its duration: it must not read as cut short."""
    video = tmp_path / f"clip.{suffix}"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*fourcc), 29.97, (64, 48))
    for i in range(13):
        writer.write(np.full((48, 64, 3), 20 * i, np.uint8))
    writer.release()
    with caplog.at_level(logging.WARNING, logger="tracker.sources"):
        assert read_video(video) == list(range(13))
    assert caplog.messages == []


def test_a_missing_path_is_said_to_be_missing_a_folder_among_what_is_expected(tmp_path):
    """A folder meant read "video file '/nonexistent/dir/': no such file; expected a video file, a camera ..."."""
    for meant in (str(tmp_path / "nope.mp4"), f"{tmp_path}/nope/"):
        with pytest.raises(InputError, match=f"^source {re.escape(repr(meant))}: no such file or folder; expected a "
                                             "video file, an image folder, a camera"):
            make_source(SourceConfig(), spec=meant).open()


# -- image folders ----------------------------------------------------------------------------------

def test_folder_skips_non_images_with_a_clear_line(tmp_path, caplog):
    for name, level in (("img2.png", 50), ("img10.png", 100), ("img1.jpg", 150)):
        cv2.imwrite(str(tmp_path / name), np.full((40, 30), level, np.uint8))  # grey files
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "broken.jpg").write_bytes(b"this is not a JPEG")
    ihdr = b"IHDR" + struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)  # 10^10 pixels, says its header
    (tmp_path / "huge.png").write_bytes(b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + ihdr + struct.pack(">I", zlib.crc32(ihdr)))
    with open(tmp_path / "vast.jpg", "wb") as vast:  # 96,000,001 bytes, sparse: stat says so, reading would hold them
        vast.truncate(MAX_FILE_BYTES + 1)
    with caplog.at_level(logging.WARNING, logger="tracker.sources"):
        with Capture(FolderSource(tmp_path), 8) as capture:
            frames = list(capture)
    assert [round(float(f.image.mean())) for f in frames] == [150, 50, 100]  # natural order: 1, 2, 10
    assert all(f.image.shape == (40, 30, 3) for f in frames)  # grey converted to BGR
    assert "skipping 'notes.txt': not an image file (suffix '.txt'" in caplog.text
    assert "skipping 'broken.jpg': not a decodable image" in caplog.text
    assert "skipping 'huge.png': not a decodable image (damaged, not an image, over 24 megapixels, or a JPEG of over 100 scans)" in caplog.text
    assert "skipping 'vast.jpg': larger than any image it decodes (96 MB); expected a photo" in caplog.text


def test_folder_without_images_is_an_input_error(tmp_path):
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(InputError, match=r"image folder '.*': no image files in it; expected files ending in \.jpg"):
        FolderSource(tmp_path).open()
    (tmp_path / "fake.png").write_text("not a png")
    source = FolderSource(tmp_path)
    source.open()
    with pytest.raises(InputError, match=r"none of its 1 image file\(s\) could be decoded"):
        source.read()
    with pytest.raises(InputError, match=r"not a directory; expected a folder of images \(a video file is source.kind opencv\)$"):
        FolderSource(tmp_path / "a.txt").open()
    with pytest.raises(InputError, match="not a directory; expected a folder of images$"):  # no file: no hint
        FolderSource(tmp_path / "gone").open()


# -- the factory and the Pi camera ------------------------------------------------------------------

def test_make_source_picks_the_source_from_config_or_spec(tmp_path):
    config = SourceConfig(width=320, height=240, fps=5.0, frames=7, seed=4)
    synthetic = make_source(config, realtime=False)
    assert isinstance(synthetic, SyntheticSource) and synthetic.pace_fps is None and synthetic.frames == 7
    assert make_source(config).pace_fps == 5.0
    camera = make_source(config, spec="/dev/video3")
    assert isinstance(camera, OpenCVSource) and camera.kind == "camera" and camera.live
    assert make_source(config, spec="2").kind == "camera"
    by_id = make_source(config, spec="/dev/v4l/by-id/usb-Logitech_C270-video-index0")  # udev's stable name: a camera,
    assert by_id.kind == "camera" and by_id.live  # retried while unplugged, not a video file refused for good
    stream = make_source(config, spec="rtsp://192.0.2.1/live")
    assert make_source(config, spec="HTTPS://192.0.2.1/mjpg").kind == "stream"
    with pytest.raises(InputError, match="source 'rstp://192.0.2.1/live': unknown stream scheme 'rstp'; expected one "
                                         "of rtsp, rtsps"):
        make_source(config, spec="rstp://192.0.2.1/live")
    assert stream.kind == "stream" and stream.live
    assert isinstance(make_source(config, spec=str(tmp_path)), FolderSource)
    video = make_source(config, spec=str(tmp_path / "x.mp4"))
    assert video.kind == "file" and not video.live
    pi = make_source(config, spec="picamera2:1", luma_width=160)
    assert isinstance(pi, PiCameraSource) and pi.camera == 1 and pi.luma_size == (160, 120)
    with pytest.raises(InputError, match="source.uri"):
        make_source(SourceConfig(kind="opencv"))
    for number in ("front", "-1"):  # -1 was Python's last camera
        with pytest.raises(InputError, match=f"picamera2 camera number '{number}' is not a whole number >= 0"):
            make_source(config, spec=f"picamera2:{number}")


def test_a_config_uri_that_does_not_fit_its_kind_is_refused_saying_what_the_kind_takes(tmp_path):
    """Both were "expected 'synthetic', 'picamera2[:N]', ..." (--source's choices) or "video file ...:
    not a regular file" for a folder of images under kind opencv."""
    with pytest.raises(InputError, match="^config: key 'source.uri': empty for source kind 'folder'; expected a folder "
                                         "of images$"):
        make_source(SourceConfig(kind="folder"))
    with pytest.raises(InputError, match=f"^config: key 'source.kind': 'opencv' with source.uri {re.escape(repr(str(tmp_path)))}, "
                                         "a folder; expected source.kind folder for a folder of images"):
        make_source(SourceConfig(kind="opencv", uri=str(tmp_path)))


def test_a_camera_number_is_a_camera_beside_a_folder_of_that_name(tmp_path, monkeypatch):
    """uri "0" under kind opencv was refused as a folder when the working folder held one named 0."""
    (tmp_path / "0").mkdir()
    monkeypatch.chdir(tmp_path)
    source = make_source(SourceConfig(kind="opencv", uri="0"))
    assert source.kind == "camera" and source.live


def test_picamera_without_picamera2_says_how_to_install_it(monkeypatch):
    """It said "scripts/setup does both on a Pi", but scripts/setup installs no python3-picamera2."""
    monkeypatch.setitem(sys.modules, "picamera2", None)  # as on any machine without apt's package
    with pytest.raises(InputError, match=r"\(sudo apt install python3-picamera2\) in a venv made with --system-site-packages "
                                         r"\(scripts/setup --pi makes one; scripts/install-pi does both\)"):
        PiCameraSource(0).open()


class _FakePicamera2:
    """Unit-test stand-in for picamera2.Picamera2 (no Pi camera here): records the configuration and
    returns a BGR main array and a YUV420 lores array with stride padding, as picamera2 does."""

    cameras = 1
    fail_reads = 0
    fail_configuration = False
    drop_lores = False
    configs: list = []
    waits: list = []
    closed = 0

    @staticmethod
    def global_camera_info():
        return [{"Num": i} for i in range(_FakePicamera2.cameras)]

    def __init__(self, num):
        self.num = num

    def create_video_configuration(self, **kwargs):
        return kwargs

    def configure(self, config):
        _FakePicamera2.configs.append(config)
        self.config = config

    def start(self):
        pass

    def camera_configuration(self):
        if _FakePicamera2.fail_configuration:
            raise RuntimeError("camera went away")
        if _FakePicamera2.drop_lores:  # a configuration without the stream asked for
            return {key: value for key, value in self.config.items() if key != "lores"}
        return self.config

    def capture_arrays(self, names, wait=None):
        assert wait is not None  # a stalled camera must time out
        _FakePicamera2.waits.append(wait)
        if _FakePicamera2.fail_reads:
            _FakePicamera2.fail_reads -= 1
            raise TimeoutError("no frame")
        w, h = self.config["main"]["size"]
        arrays = [np.full((h, w, 3), (10, 20, 30), np.uint8)]
        if "lores" in names:
            lw, lh = self.config["lores"]["size"]
            yuv = np.zeros((lh * 3 // 2, lw + 32), np.uint8)  # 32 bytes of stride padding
            yuv[:lh, :lw] = 77
            arrays.append(yuv)
        return arrays, {}

    def stop(self):
        pass

    def close(self):
        _FakePicamera2.closed += 1


def test_picamera_source_against_a_fake_picamera2(monkeypatch):
    """Unit test of picamera.py's use of the picamera2 API (the real camera cannot run here)."""
    import types

    monkeypatch.setitem(sys.modules, "picamera2", types.SimpleNamespace(Picamera2=_FakePicamera2))
    _FakePicamera2.configs = []
    source = PiCameraSource(0, width=640, height=480, fps=10.0, luma_width=320)
    source.open()
    config = _FakePicamera2.configs[-1]
    assert config["main"] == {"size": (640, 480), "format": "RGB888"}
    assert config["lores"] == {"size": (320, 240), "format": "YUV420"}
    assert config["controls"] == {"FrameDurationLimits": (100000, 100000)}
    frame = source.read()
    assert frame.image.shape == (480, 640, 3) and tuple(frame.image[0, 0]) == (10, 20, 30)
    assert frame.luma.shape == (240, 320) and (frame.luma == 77).all()  # Y plane without padding
    source.close()
    # A read timeout and a missing camera are retried, then the source recovers.
    _FakePicamera2.fail_reads = 2
    with Capture(source, 4, max_frames=3, drop_oldest=False, backoff=FAST) as capture:
        assert [f.seq for f in capture] == [1, 2, 3]
    assert capture.stats().failures == 2 and capture.stats().reopens == 2
    assert capture.stats().failures_since_frame == 0  # frames came after them
    _FakePicamera2.cameras = 0
    try:
        with pytest.raises(SourceUnavailable, match="no such camera"):
            PiCameraSource(0).open()
    finally:
        _FakePicamera2.cameras = 1
    slow = PiCameraSource(0, fps=0.1)  # a frame every 10 s: a 2 s wait failed every read
    slow.open()
    slow.read()
    assert _FakePicamera2.waits[-1] == 20.0 and _FakePicamera2.waits[0] == 2.0
    slow.close()
    _FakePicamera2.fail_configuration, closed = True, _FakePicamera2.closed
    try:  # a camera that fails after it started is closed, and the failure is one the capture retries
        with pytest.raises(SourceUnavailable, match="cannot start at .*camera went away"):
            PiCameraSource(0).open()
        assert _FakePicamera2.closed == closed + 1
    finally:
        _FakePicamera2.fail_configuration = False
    _FakePicamera2.drop_lores, closed = True, _FakePicamera2.closed
    try:  # a KeyError outside the try was fatal to the guard, not a failure to retry
        with pytest.raises(SourceUnavailable, match=r"cannot start at .*\(KeyError: 'lores'\)"):
            PiCameraSource(0, luma_width=320).open()
        assert _FakePicamera2.closed == closed + 1
    finally:
        _FakePicamera2.drop_lores = False


def test_a_streams_password_is_never_in_its_description_or_errors():
    """The description is in every log line and in systemd's STATUS, which any local user reads."""
    from mosquitto import free_port

    url = f"http://cam:s3cret@127.0.0.1:{free_port()}/video"  # nothing listens there: refused at once
    source = OpenCVSource(url)
    assert source.description == f"stream 'http://cam:***@127.0.0.1:{url.rsplit(':', 1)[1]}'"
    with pytest.raises(SourceUnavailable) as refused:
        source.open()
    assert "s3cret" not in str(refused.value) and "cam:***@" in str(refused.value)
    with pytest.raises(InputError) as unknown:
        OpenCVSource("rstp://cam:s3cret@192.0.2.1/live")
    assert "s3cret" not in str(unknown.value) and "'rstp://cam:***@192.0.2.1/live'" in str(unknown.value)
    assert OpenCVSource("rtsp://192.0.2.1/live").description == "stream 'rtsp://192.0.2.1/live'"  # no password: as given


@pytest.mark.parametrize("uri, shown", [
    # many cameras take their password in the query
    ("rtsp://192.0.2.1:554/live?user=admin&password=s3cret&channel=1", "rtsp://192.0.2.1:554/live?user=admin&password=***&channel=1"),
    ("http://192.0.2.1/video.cgi?PWD=s3cret;token=s3cret#top", "http://192.0.2.1/video.cgi?PWD=***;token=***#top"),
    # a URL urllib cannot split was shown whole
    ("rtsp://admin:s3cret@[fe80::1/stream", "rtsp://admin:***@[fe80::1/stream"),
    # a password holding /, ? or @, as typed
    ("rtsp://admin:s3/cr@et@192.0.2.1/live", "rtsp://admin:***@192.0.2.1/live"),
    ("rtsp://admin:s3?cr#et@192.0.2.1/live", "rtsp://admin:***@192.0.2.1/live"),
])
def test_a_streams_secrets_are_hidden_wherever_the_url_holds_them(uri, shown):
    assert OpenCVSource(uri).description == f"stream {shown!r}"


def test_a_video_file_is_refused_whole_before_it_can_harm(tmp_path):
    """Three things a file --source did to the guard: a name that is not UTF-8 crashed it (OpenCV's
    SIGSEGV), an image declaring 8000 x 8000 pixels was decoded past the bound every other reader
    keeps (700 MB), and a FIFO was called a file that does not exist."""
    import os

    odd = os.fsdecode(bytes(tmp_path) + b"/clip\xff.avi")
    with pytest.raises(InputError, match=r"the name is not valid UTF-8, which OpenCV cannot open"):
        OpenCVSource(odd)
    huge = tmp_path / "huge.png"
    cv2.imwrite(str(huge), np.zeros((8000, 8000), np.uint8))  # 70 kB
    with pytest.raises(InputError, match=r"frames of 8000x8000 are over 24 megapixels"):
        OpenCVSource(str(huge)).open()
    fifo = tmp_path / "clip.avi"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match=r"'.*clip.avi': not a regular file; expected a video file"):
        OpenCVSource(str(fifo)).open()


def test_a_name_with_a_digit_int_cannot_read_leaves_the_folder_readable(tmp_path):
    """"²" is a digit to str.isdigit but not to int(): one such name refused the whole folder."""
    cv2.imwrite(str(tmp_path / "frame1.png"), np.zeros((8, 8, 3), np.uint8))
    (tmp_path / "scan1²").write_bytes(b"x")
    source = FolderSource(tmp_path)
    source.open()
    assert source.read().image.shape == (8, 8, 3)


def test_a_folder_of_other_files_is_counted_not_listed(tmp_path, caplog):
    """A wrong folder (a library directory) logged a line for each of its thousand files."""
    cv2.imwrite(str(tmp_path / "frame.png"), np.zeros((8, 8, 3), np.uint8))
    for i in range(25):
        (tmp_path / f"lib{i:02d}.so").write_bytes(b"x")
    with caplog.at_level(logging.WARNING, logger="tracker.sources"):
        FolderSource(tmp_path).open()
    assert caplog.text.count("not an image file") == 10
    assert "skipping 15 more files that are not image files" in caplog.text
