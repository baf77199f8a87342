"""The guard with sources that fail: a camera that is absent, comes, is unplugged and comes back;
a real OpenCV live source whose video file is missing at start and whose stream keeps ending;
and, through the CLI, a corrupt video file and folders with non-images (exit 2 and one line when
nothing usable is left, a warning per skipped file otherwise).

The in-process tests run the real Guard (real detector, backend, tracker, sinks, latency log) and
swap only the source it builds (`tracker.stages.make_source`); the capture thread, its back-off
and the reopen logic are the real ones.
"""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from test_pipeline_e2e import isolated_env, tracker_command, write_config

import tracker.pipeline as pipeline
import tracker.stages as stages
from tracker.config import parse_config
from tracker.errors import InputError
from tracker.sources import SourceUnavailable
from tracker.sources.base import SourceBase
from tracker.sources.opencv_source import OpenCVSource
from tracker.sources.synthetic import SyntheticScene

SIZE = (320, 240)


@pytest.fixture(scope="module")
def scene_frames() -> list[np.ndarray]:
    """40 frames of the synthetic scene at 320x240 with two faces walking (scene frames 20..59)."""
    scene = SyntheticScene(*SIZE, seed=0)
    return [scene.render(n)[0] for n in range(20, 60)]


def guard_config(tmp_path: Path, frames: int, **sections):
    return parse_config({
        "state_dir": str(tmp_path / "state"),
        "source": {"frames": frames, "width": SIZE[0], "height": SIZE[1]},
        "detect": {"detect_width": SIZE[0]},
        "sinks": {"console": False},
        **sections,
    })


def run_guard_with(source, config, monkeypatch, watchdog_s: float = 120.0) -> pipeline.Guard:
    """Run the guard on `source` until the source's frame budget ends; a watchdog stops a guard
    that would otherwise hang the test (and the test then fails on the missing frames)."""
    monkeypatch.setattr(stages, "make_source", lambda *args, **kwargs: source)
    guard = pipeline.Guard(config, stages.build_stages(config))
    watchdog = threading.Timer(watchdog_s, guard.stop)
    watchdog.start()
    try:
        assert guard.run() == 0
    finally:
        watchdog.cancel()
    return guard


def latency_rows(config) -> list[dict]:
    path = config.resolved_state_dir() / "latency.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


class FlakyCamera(SourceBase):
    """A live camera: absent for the first `absent` opens, then delivers frames (paced at 25 fps
    by the capture thread), is unplugged once after `unplug_after` frames (one read fails and the
    next open too), then works again."""

    live = True
    pace_fps = 25.0

    def __init__(self, frames: list[np.ndarray], absent: int = 2, unplug_after: int = 12):
        super().__init__()
        self.description = "camera test-flaky"
        self._frames = frames
        self._absent = absent
        self._unplug_after = unplug_after
        self.opens = self.failed_opens = self.failed_reads = 0
        self._unplugged = False
        self._is_open = False

    def open(self) -> None:
        self.opens += 1
        if self._absent > 0 or self._unplugged:
            self._absent -= 1
            self._unplugged = False  # plugged back in: the next open works
            self.failed_opens += 1
            raise SourceUnavailable(f"{self.description}: /dev/video9 does not exist (camera absent or unplugged?)")
        self._is_open = True

    def read(self):
        assert self._is_open, "read on a closed camera"
        if self._seq == self._unplug_after and not self.failed_reads:
            self.failed_reads += 1
            self._unplugged = True
            raise SourceUnavailable(f"{self.description}: no frame (unplugged, or the stream dropped?)")
        return self._frame(self._frames[self._seq % len(self._frames)])

    def close(self) -> None:
        self._is_open = False


def test_guard_rides_out_an_absent_and_unplugged_camera(tmp_path, monkeypatch, caplog, scene_frames):
    caplog.set_level(logging.INFO)
    camera = FlakyCamera(scene_frames, absent=2, unplug_after=12)
    config = guard_config(tmp_path, frames=30)
    guard = run_guard_with(camera, config, monkeypatch)
    # Two failed opens at start, one failed read and one failed open mid-run, then it worked.
    assert (camera.failed_opens, camera.failed_reads) == (3, 1)
    assert camera.opens == 5
    retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert len(retries) == 4 and all("camera test-flaky" in m for m in retries)
    assert sum("reopened after" in r.getMessage() for r in caplog.records) == 2
    # Frames flowed before the unplug and resumed after it; the source kept counting, so the
    # log's seq runs on across the gap.
    rows = latency_rows(config)
    seqs = [r["seq"] for r in rows]
    assert seqs == sorted(set(seqs)) and len(rows) == guard.frames_processed
    assert any(s < 12 for s in seqs) and any(s >= 12 for s in seqs)
    assert max(seqs) == 29  # the capture queue is drained at the end: the last frame is processed
    assert all(a["dropped"] <= b["dropped"] for a, b in zip(rows, rows[1:]))
    assert any(r["faces"] for r in rows if r["seq"] >= 12)  # detection kept working after the reopen


class CameraWithOutage(SourceBase):
    """A live camera that delivers `before` frames, is unplugged (a read fails, then every open for
    `outage_s`), then works again; paced at 25 fps."""

    live = True
    pace_fps = 25.0

    def __init__(self, frames: list[np.ndarray], before: int, outage_s: float):
        super().__init__()
        self.description = "camera test-outage"
        self._frames, self._before, self._outage_s = frames, before, outage_s
        self._back_at: float | None = None  # monotonic seconds: when the camera works again

    def open(self) -> None:
        if self._back_at is not None and time.monotonic() < self._back_at:
            raise SourceUnavailable(f"{self.description}: /dev/video9 does not exist (unplugged?)")

    def read(self):
        if self._seq == self._before and self._back_at is None:
            self._back_at = time.monotonic() + self._outage_s
            raise SourceUnavailable(f"{self.description}: no frame (unplugged?)")
        return self._frame(self._frames[self._seq % len(self._frames)])


def test_the_people_in_view_leave_when_the_camera_is_gone_past_the_reidentification_window(
        tmp_path, monkeypatch, caplog, scene_frames):
    """They stayed "present" for the whole outage (Home Assistant's presence on, the state's
    tracks 1), and a face found after it rejoined its old track whatever the gap."""
    caplog.set_level(logging.INFO)
    config = guard_config(tmp_path, frames=40, tracking={"reid_window_s": 1.0})
    run_guard_with(CameraWithOutage(scene_frames, before=20, outage_s=2.0), config, monkeypatch)
    events = [json.loads(line) for line in (config.resolved_state_dir() / "events.jsonl").read_text().splitlines()]
    before = {e["track_id"] for e in events if e["kind"] == "entered" and e["seq"] < 20}
    assert before, events  # people were announced before the outage
    # each of them left before any event of a frame after it, and those are new tracks
    first_after = next(i for i, e in enumerate(events) if e["seq"] >= 20)
    assert {e["track_id"] for e in events[:first_after] if e["kind"] == "left"} == before
    assert not before & {e["track_id"] for e in events[first_after:]}
    assert sum("no frame for" in r.getMessage() for r in caplog.records) == 1


class CameraThatHangs(SourceBase):
    """A live camera whose read after `before` frames fails once, and whose reopen then hangs
    for `hang_s` (a network camera rebooting), after which it works again; paced at 25 fps."""

    live = True
    pace_fps = 25.0

    def __init__(self, frames: list[np.ndarray], before: int, hang_s: float):
        super().__init__()
        self.description = "camera test-hang"
        self._frames, self._before, self._hang_s = frames, before, hang_s
        self.failed = threading.Event()

    def open(self) -> None:
        if self.failed.is_set() and self._hang_s:
            hang_s, self._hang_s = self._hang_s, 0.0
            time.sleep(hang_s)

    def read(self):
        if self._seq == self._before and not self.failed.is_set():
            self.failed.set()
            raise SourceUnavailable(f"{self.description}: no frame (unplugged?)")
        return self._frame(self._frames[self._seq % len(self._frames)])


def test_an_outage_that_began_while_frames_were_queued_is_noticed(tmp_path, monkeypatch, scene_frames):
    """The failures were counted from when the loop took its last frame: a camera that failed
    while that frame still waited in the queue (the guard busy) and then hung in one reopen
    seemed not to have failed at all, and its people stayed "present" for the whole outage.
    (The loop taking the last frame only after the failure plays the busy guard.)"""
    camera = CameraThatHangs(scene_frames, before=20, hang_s=3.0)
    monkeypatch.setattr(stages, "make_source", lambda *args, **kwargs: camera)
    config = guard_config(tmp_path, frames=40, tracking={"reid_window_s": 1.0})
    guard = pipeline.Guard(config, stages.build_stages(config))
    get = guard._capture.get

    def get_after_the_failure(timeout=None):
        frame = get(timeout)
        if frame is not None and frame.seq == 19:
            assert camera.failed.wait(30)
        return frame

    monkeypatch.setattr(guard._capture, "get", get_after_the_failure)
    watchdog = threading.Timer(120, guard.stop)
    watchdog.start()
    try:
        assert guard.run() == 0
    finally:
        watchdog.cancel()
    events = [json.loads(line) for line in (config.resolved_state_dir() / "events.jsonl").read_text().splitlines()]
    before = {e["track_id"] for e in events if e["kind"] == "entered" and e["seq"] < 20}
    assert before, events
    first_after = next(i for i, e in enumerate(events) if e["seq"] >= 20)
    assert {e["track_id"] for e in events[:first_after] if e["kind"] == "left"} == before


def test_a_stop_from_a_signal_handler_does_not_wait_for_the_capture_thread(tmp_path, monkeypatch, caplog, scene_frames):
    """A handler that interrupts the loop's get() runs with the capture's lock held: stop() joined
    the capture thread, which needs that lock to end, so each such stop hung for the join's timeout
    and logged a read stuck that was not. (The main thread holding the lock plays the handler.)"""
    monkeypatch.setattr(stages, "make_source", lambda *args, **kwargs: FlakyCamera(scene_frames, absent=0,
                                                                                  unplug_after=10_000))
    config = guard_config(tmp_path, frames=10_000)
    guard = pipeline.Guard(config, stages.build_stages(config))
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.append(guard.run()))
    with caplog.at_level(logging.WARNING, logger="tracker.sources"):
        runner.start()
        while guard.frames_processed < 3 and runner.is_alive():
            time.sleep(0.05)
        with guard._capture._cond:
            guard.stop()
        runner.join(60)
    assert codes == [0] and guard.frames_processed >= 3
    assert "still inside a read" not in caplog.text


def write_video(path: Path, frames: list[np.ndarray]) -> None:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, SIZE)
    assert writer.isOpened()
    for frame in frames:
        writer.write(frame)
    writer.release()


class _Signal(logging.Handler):
    """Sets an event when a log message contains `text`."""

    def __init__(self, text: str):
        super().__init__()
        self.text, self.seen = text, threading.Event()

    def emit(self, record):
        if self.text in record.getMessage():
            self.seen.set()


def test_guard_survives_a_live_video_source_that_goes_missing_and_ends(tmp_path, monkeypatch, caplog, scene_frames):
    """A real OpenCVSource in live mode on a video file: the file is missing when the guard starts
    (retries), appears (opens), and every time the 10-frame file ends the 'stream' fails and is
    reopened; 25 frames need two reopens."""
    caplog.set_level(logging.INFO)
    video = tmp_path / "camera.avi"
    (tmp_path / "away").mkdir()
    hidden = tmp_path / "away" / "camera.avi"
    write_video(hidden, scene_frames[:10])
    source = OpenCVSource(str(video), live=True)
    config = guard_config(tmp_path, frames=25)
    missing = _Signal("no such file")
    logging.getLogger("tracker.sources").addHandler(missing)

    def plug_in():  # once the guard has reported the missing file, the file appears
        if missing.seen.wait(60):
            hidden.rename(video)

    helper = threading.Thread(target=plug_in, daemon=True)
    helper.start()
    try:
        run_guard_with(source, config, monkeypatch)
    finally:
        logging.getLogger("tracker.sources").removeHandler(missing)
        helper.join(5)
    messages = [r.getMessage() for r in caplog.records]
    assert any("no such file" in m and "retrying in" in m for m in messages)
    assert any("no frame" in m and "retrying in" in m for m in messages)  # the file ended: reopened
    assert sum("reopened after" in m for m in messages) >= 3
    # The live source is read as fast as it decodes, so the capture queue drops most frames (which
    # ones depends on timing); the last one is always processed, and it comes after two reopens.
    seqs = [r["seq"] for r in latency_rows(config)]
    assert seqs == sorted(set(seqs)) and max(seqs) == 24


class FailingFiles(SourceBase):
    """A recording that delivers its frames, then fails for good (a file that cannot be read on)."""

    def __init__(self, frames: list[np.ndarray]):
        super().__init__()
        self.description = "video file test-failing"
        self._frames = frames

    def open(self) -> None:
        pass

    def read(self):
        if self._seq == len(self._frames):
            raise InputError(f"{self.description}: unreadable from frame {self._seq}; expected a whole video")
        return self._frame(self._frames[self._seq])

    def close(self) -> None:
        pass


def test_a_source_that_fails_for_good_still_gets_every_left_announced(tmp_path, monkeypatch, scene_frames):
    """Home Assistant would otherwise keep the people in view "present" after the guard stopped."""
    monkeypatch.setattr(stages, "make_source", lambda *args, **kwargs: FailingFiles(scene_frames))
    config = guard_config(tmp_path, frames=100)
    guard = pipeline.Guard(config, stages.build_stages(config))
    with pytest.raises(InputError, match="unreadable from frame 40"):
        guard.run()
    events = [json.loads(line) for line in (config.resolved_state_dir() / "events.jsonl").read_text().splitlines()]
    entered = {e["track_id"] for e in events if e["kind"] == "entered"}
    assert entered and {e["track_id"] for e in events if e["kind"] == "left"} == entered
    assert len(latency_rows(config)) == 40  # every frame delivered was tracked


# -- bad input through the CLI ------------------------------------------------------------------


def run_cli(tmp_path: Path, *args: str, **sections) -> subprocess.CompletedProcess:
    """The guard run on `args` with the console sink off and these config `sections`."""
    config = write_config(tmp_path, sinks={"console": False}, **sections)
    return subprocess.run([*tracker_command(), "--config", str(config), *args], capture_output=True, text=True,
                          env=isolated_env(tmp_path), cwd=tmp_path, timeout=300)


def room_and_face(testdata: Path) -> tuple[np.ndarray, np.ndarray]:
    """An empty room (640 x 480 BGR, blurred noise: still to the motion gate) and a face to put in
    it (220 x 200 BGR, the astronaut's)."""
    rng = np.random.default_rng(0)
    room = cv2.GaussianBlur(cv2.add(np.full((480, 640, 3), 120, np.uint8),
                                    rng.integers(0, 20, (480, 640, 3), dtype=np.uint8)), (5, 5), 0)
    return room, cv2.imread(str(testdata / "faces" / "skimage" / "astronaut.png"))[20:240, 120:320]


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("tracker: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def test_corrupt_video_file_exits_2(tmp_path):
    bad = tmp_path / "corrupt.mp4"
    bad.write_bytes(b"\x00\x00\x00\x18ftypmp42" + np.random.default_rng(0).bytes(20000))
    assert_one_line_error(run_cli(tmp_path, "--source", str(bad)), "video file", "corrupt.mp4", "expected")


def test_truncated_video_file_exits_2(tmp_path, scene_frames):
    good = tmp_path / "good.avi"
    write_video(good, scene_frames[:5])
    cut = tmp_path / "cut.avi"
    cut.write_bytes(good.read_bytes()[:300])  # the header survives, no frame does
    assert_one_line_error(run_cli(tmp_path, "--source", str(cut)), "cut.avi", "expected")


def test_folder_without_any_readable_image_exits_2(tmp_path):
    folder = tmp_path / "frames"
    folder.mkdir()
    (folder / "notes.txt").write_text("not an image")
    (folder / "fake.jpg").write_text("not a JPEG either")
    proc = run_cli(tmp_path, "--source", str(folder))
    assert_one_line_error(proc, "frames", "expected")
    assert "fake.jpg" in proc.stderr and "notes.txt" in proc.stderr  # each skipped file was named


def test_folder_with_some_non_images_skips_them_and_runs(tmp_path, scene_frames):
    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(4):
        cv2.imwrite(str(folder / f"img{i}.png"), scene_frames[i])
    (folder / "README.txt").write_text("frames from the hall camera")
    (folder / "img9.jpg").write_bytes(b"\xff\xd8 truncated")
    proc = run_cli(tmp_path, "--source", str(folder))
    assert proc.returncode == 0, proc.stderr[-2000:]
    warnings = [line for line in proc.stderr.splitlines() if "skipping" in line]
    assert any("README.txt" in w for w in warnings) and any("img9.jpg" in w for w in warnings)
    rows = [json.loads(line) for line in (tmp_path / "state" / "latency.jsonl").read_text().splitlines()]
    assert [r["seq"] for r in rows] == [0, 1, 2, 3]


def test_a_face_seen_once_before_the_scene_goes_still_is_no_person(tmp_path, testdata):
    """An empty room, a face on one frame only (a false detection, say), then the room still again:
    the motion gate carried that one detection over every still frame, the tracker counted each as
    a hit, and the guard announced someone who stayed until something moved. (The tracker now
    confirms no track on carried faces, tests/tracking; and the frame after the face, which differs
    from it, is searched again, so nothing is carried at all.)"""
    room, face = room_and_face(testdata)
    with_face = room.copy()
    with_face[130:350, 220:420] = face
    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(15):
        cv2.imwrite(str(folder / f"f{i:02d}.png"), with_face if i == 5 else room)
    proc = run_cli(tmp_path, "--source", str(folder))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "state" / "latency.jsonl").read_text().splitlines()]
    assert [r["faces"] for r in rows][5] == 1 and rows[5]["batch"] == 1  # the face was found and inferred
    assert [r["faces"] for r in rows][6:] == [0] * 9  # searched again on the frame after it, not carried
    events = tmp_path / "state" / "events.jsonl"
    assert not events.exists() or events.read_text() == ""


def test_a_folder_is_tracked_on_its_frame_clock_not_on_how_fast_it_was_processed(tmp_path, testdata):
    """A face, 12 photos of the empty room, the face again, played at 1 fps: 12 s apart, past the
    10 s re-identification window, so the face comes back as a second person. The tracker's clock
    was the processing time, in which the 12 photos took a fraction of a second: the face rejoined
    its first track, and how many people a folder held depended on the machine's speed."""
    room, face = room_and_face(testdata)
    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(24):
        image = room.copy()
        if not 6 <= i < 18:  # the face moves a little, so the motion gate lets it be detected
            image[130:350, 200 + 6 * (i % 6):400 + 6 * (i % 6)] = face
        cv2.imwrite(str(folder / f"f{i:02d}.png"), image)
    proc = run_cli(tmp_path, "--source", str(folder), source={"fps": 1.0})
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = [json.loads(line) for line in (tmp_path / "state" / "events.jsonl").read_text().splitlines()]
    assert [(e["kind"], e["track_id"]) for e in events if e["kind"] != "identified"] == [
        ("entered", 1), ("left", 1), ("entered", 2), ("left", 2)], proc.stderr[-2000:]
    assert {e["media_time_s"] for e in events} == {None}  # photos are no recording: no place in one to name


@pytest.mark.parametrize("glitch", [0, 128])
def test_a_person_standing_still_through_a_black_or_grey_frame_stays(tmp_path, testdata, glitch):
    """A face walks in and stands still until the background has taken it in (frames 10-59); then one
    black or grey frame (a camera's glitch). The glitch is motion and has no face; the background
    took in 5% of it, so the still frames after it were still against the background, their faces
    were the glitch's (none), and the guard said the person left while they stood there."""
    room, face = room_and_face(testdata)
    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(80):
        image = room.copy()
        if i >= 2:  # walks in over frames 2-9, then stands
            x = 140 + 10 * min(i - 2, 7)
            image[130:350, x:x + 200] = face
        if i == 60:
            image = np.full_like(room, glitch)
        cv2.imwrite(str(folder / f"f{i:02d}.png"), image)
    proc = run_cli(tmp_path, "--source", str(folder), tracking={"max_age": 3, "reid_window_s": 0.5})
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "state" / "latency.jsonl").read_text().splitlines()]
    assert rows[60]["faces"] == 0 and all(r["faces"] == 1 for r in rows[61:]), [r["faces"] for r in rows]
    events = [json.loads(line) for line in (tmp_path / "state" / "events.jsonl").read_text().splitlines()]
    kinds = [(e["kind"], e["track_id"], e["seq"]) for e in events if e["kind"] != "identified"]
    assert kinds[:1] == [("entered", 1, kinds[0][2])] and kinds[1:] == [("left", 1, 79)], kinds  # left at the end


class CaptureAhead(pipeline.Capture):
    """A capture whose start() returns once its thread has captured all it will: the guard takes its
    first frame after every drop."""

    def start(self):
        super().start()
        self._thread.join()
        return self


class ThreeFrameCamera(SourceBase):
    live = True
    description = "camera test-three"

    def __init__(self, frames: list[np.ndarray]):
        super().__init__()
        self._frames = frames

    def read(self):
        return self._frame(self._frames[self._seq])


def test_a_live_run_cut_short_by_frames_is_not_taken_for_a_short_source(tmp_path, monkeypatch, caplog, scene_frames):
    """--frames counts the frames captured, the dropped ones too: 3 asked, 2 dropped, 1 processed was
    taken for a source that ended too soon, and the run got the single-photo hint."""
    monkeypatch.setattr(pipeline, "Capture", CaptureAhead)
    config = guard_config(tmp_path, 3, source={"frames": 3, "width": SIZE[0], "height": SIZE[1], "queue_size": 1})
    with caplog.at_level(logging.INFO):
        guard = run_guard_with(ThreeFrameCamera(scene_frames), config, monkeypatch)
    assert (guard.frames_processed, guard._capture.dropped) == (1, 2)
    assert "tracking.min_hits" not in caplog.text


def test_a_source_that_ends_before_anyone_can_be_announced_says_so(tmp_path, testdata):
    """A single photo as the source ran one frame and ended with no event and no word why."""
    photo = next((testdata / "faces" / "dlib" / "johns").glob("*/*.jpg"))
    proc = run_cli(tmp_path, "--source", str(photo))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ("the source ended after 1 frame(s), fewer than the 3 a face needs before it is announced "
            "(tracking.min_hits); to see who is in photos: tracker identify PHOTOS") in proc.stderr
    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(3):
        (folder / f"f{i}.jpg").write_bytes(photo.read_bytes())
    proc = run_cli(tmp_path, "--source", str(folder))
    assert proc.returncode == 0 and "tracking.min_hits" not in proc.stderr, proc.stderr[-2000:]
    proc = run_cli(tmp_path, "--source", str(folder), "--frames", "2")  # the user's own short run: no hint
    assert proc.returncode == 0 and "tracking.min_hits" not in proc.stderr, proc.stderr[-2000:]
