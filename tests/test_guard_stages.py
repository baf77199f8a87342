"""The guard's loop on stages of the test's own (`tracker.pipeline.Guard` takes any `Stages`): a
fake source, detector and backend around the real batcher, gallery, votes, tracker, events,
snapshots and latency log. What the loop itself does is checked here without a model or a camera:
every face's embedding reaches the gallery and the tracker with its own detection, one latency
record per frame, a failed backend call costs identities but never frames, and the stages are
closed when the run ends. The real stages run end to end in test_pipeline_e2e.py and
test_scene_golden.py."""

from __future__ import annotations

import contextlib
import json
import time

import numpy as np
import pytest

from tracker.batcher import Batcher
from tracker.config import parse_config
from tracker.errors import BackendFailure
from tracker.events import EventMaker
from tracker.identity import UNKNOWN, Gallery, IdentityVotes
from tracker.latency import LatencyLog
from tracker.motion import MotionGate
from tracker.pipeline import FPS_WINDOW_NS, Guard
from tracker.sinks.console import ConsoleSink
from tracker.snapshots import SnapshotStore
from tracker.sources.base import SourceBase
from tracker.stages import Stages
from tracker.tracking import Tracker
from tracker.types import Box, Detection, Inference

FRAMES = 30
ALICE, BOB = np.eye(4, dtype=np.float32)[0], np.eye(4, dtype=np.float32)[1]


class StillFrames(SourceBase):
    """FRAMES grey frames, as fast as the guard takes them."""

    description = "still frames"

    def read(self):
        if self._seq >= FRAMES:
            return None
        return self._frame(np.full((240, 320, 3), 128, np.uint8))


class TwoFaces:
    """Alice on the left and Bob on the right in every frame, in that order."""

    name, gives_landmarks = "two-faces", False

    def detect(self, frame, regions=None):
        return [Detection(Box(20, 40, 100, 120), 0.9), Detection(Box(200, 40, 280, 120), 0.9)]


class ByPosition:
    """A backend whose embedding says whose crop it is: the crops are all alike, so it answers
    Alice, Bob, Alice, Bob ... in input order, which the detector's order makes right. `fail`:
    raise BackendFailure on every call instead (a worker that keeps dying)."""

    name = "by-position"

    def __init__(self, fail: bool = False):
        self.fail, self.calls, self.closed = fail, 0, False

    def infer(self, x):
        self.calls += 1
        if self.fail:
            raise BackendFailure("worker died")
        embedding = np.stack([ALICE if i % 2 == 0 else BOB for i in range(len(x))])
        return Inference(np.full((len(x), 2), 0.5, np.float32), embedding)

    def close(self):
        self.closed = True


class Collect:
    def __init__(self):
        self.events, self.states, self.closed = [], [], False

    def publish_event(self, event, snapshot_jpeg):
        self.events.append(event)

    def publish_state(self, state):
        self.states.append(state)

    def close(self):
        self.closed = True


def fake_stages(tmp_path, backend, max_batch, sinks_before=()):
    config = parse_config({"state_dir": str(tmp_path), "source": {"frames": FRAMES},
                           "batcher": {"max_batch": max_batch}, "sinks": {"console": False}})
    sink = Collect()
    stages = Stages(
        state_dir=tmp_path, source=StillFrames(), gate=MotionGate(enabled=False), detector=TwoFaces(),
        batcher=Batcher(max_batch, 50.0), backend=backend,
        gallery=Gallery(("alice", "bob"), np.stack([ALICE, BOB]), 0.9),
        votes=IdentityVotes(min_faces=3, margin=0.3), tracker=Tracker(min_hits=3, max_age=5),
        events=EventMaker(), snapshots=SnapshotStore(tmp_path / "snapshots"), sinks=[*sinks_before, sink],
        latency_log=LatencyLog(tmp_path / "latency.jsonl"), embedding_width=4)
    stages.opened.callback(backend.close)
    stages.opened.callback(sink.close)
    stages.opened.callback(stages.latency_log.close)
    return config, stages, sink


def identities(events) -> dict[int, set[str]]:
    """track id -> every identity its `entered` and `identified` events announced."""
    found: dict[int, set[str]] = {}
    for e in events:
        if e.kind in ("entered", "identified"):
            found.setdefault(e.track_id, set()).add(e.identity)
    return found


def test_every_face_keeps_its_own_embedding_across_batches_of_several_frames(tmp_path):
    backend = ByPosition()
    config, stages, sink = fake_stages(tmp_path, backend, max_batch=4)  # two frames per batch
    guard = Guard(config, stages)
    assert guard.run() == 0

    assert guard.frames_processed == FRAMES and guard.inference_lost == 0
    assert backend.calls == FRAMES // 2
    entered = [e for e in sink.events if e.kind == "entered"]
    assert len(entered) == 2
    by_side = {e.track_id: ("alice" if e.box.x < 160 else "bob") for e in entered}
    assert {tid: {who} for tid, who in by_side.items()} == identities(sink.events)
    assert sorted(e.track_id for e in sink.events if e.kind == "left") == sorted(by_side)
    rows = [json.loads(line) for line in (tmp_path / "latency.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["seq"] for r in rows] == list(range(FRAMES))
    assert {r["faces"] for r in rows} == {2} and {r["batch"] for r in rows} == {4}
    assert backend.closed and sink.closed


def test_a_failing_backend_costs_identities_not_frames(tmp_path):
    backend = ByPosition(fail=True)
    config, stages, sink = fake_stages(tmp_path, backend, max_batch=2)
    guard = Guard(config, stages)
    assert guard.run() == 0

    assert guard.frames_processed == FRAMES and guard.inference_lost == FRAMES
    assert len([e for e in sink.events if e.kind == "entered"]) == 2
    assert all(who <= {UNKNOWN} for who in identities(sink.events).values())
    assert len([e for e in sink.events if e.kind == "left"]) == 2
    rows = [json.loads(line) for line in (tmp_path / "latency.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == FRAMES and rows[-1]["dropped"] == FRAMES
    assert backend.closed and sink.closed


def test_stopped_before_it_starts_the_guard_closes_its_stages_and_reads_nothing(tmp_path):
    backend = ByPosition()
    config, stages, sink = fake_stages(tmp_path, backend, max_batch=2)
    guard = Guard(config, stages)
    guard.stop()
    assert guard.run() == 0
    assert guard.frames_processed == 0 and backend.calls == 0
    assert backend.closed and sink.closed


def test_a_sink_that_fails_costs_its_own_output_only(tmp_path, caplog):
    # the console on a full disk (a real one: /dev/full), before the sink the test reads
    full = open("/dev/full", "w", encoding="utf-8")  # noqa: SIM115 - closed below, where its flush fails again
    console = ConsoleSink(full)
    config, stages, sink = fake_stages(tmp_path, ByPosition(), max_batch=2, sinks_before=[console])
    stages.opened.callback(console.close)
    guard = Guard(config, stages)
    try:
        assert guard.run() == 0  # the console's close (its last flush) failing too
    finally:
        with contextlib.suppress(OSError):
            full.close()
    assert guard.frames_processed == FRAMES
    kinds = [e.kind for e in sink.events]
    assert kinds.count("entered") == 2 and kinds.count("left") == 2
    assert len(sink.states) >= 1
    failures = [r.getMessage() for r in caplog.records if "ConsoleSink sink" in r.getMessage()]
    assert len(failures) == 1 and "No space left on device" in failures[0], failures


def test_the_rate_falls_to_zero_once_frames_stop(tmp_path, monkeypatch):
    config, stages, _ = fake_stages(tmp_path, ByPosition(), max_batch=2)
    guard = Guard(config, stages)
    assert guard.run() == 0
    assert guard.fps() > 0
    now = time.monotonic_ns()
    monkeypatch.setattr(time, "monotonic_ns", lambda: now + FPS_WINDOW_NS + 1)  # a camera gone for the window
    assert guard.fps() == 0.0 and guard.state()["fps"] == 0.0


def test_a_slow_source_s_rate_is_read_over_three_of_its_frame_intervals(tmp_path, monkeypatch):
    config, stages, _ = fake_stages(tmp_path, ByPosition(), max_batch=2)
    config = config.model_copy(update={"source": config.source.model_copy(update={"fps": 0.05})})  # a frame in 20 s
    guard = Guard(config, stages)
    now = time.monotonic_ns()
    guard._done_ns.extend([now - 40_000_000_000, now - 20_000_000_000, now])
    assert guard.fps() == pytest.approx(0.05)
    monkeypatch.setattr(time, "monotonic_ns", lambda: now + 61_000_000_000)  # three intervals without a frame
    assert guard.fps() == 0.0


def test_events_are_stamped_by_the_wall_clock_as_it_reads_when_they_happen(tmp_path, monkeypatch):
    """A Pi's clock steps when NTP answers, often after the guard started: an offset taken when
    the guard was built stamped every event an hour off after a step of an hour."""
    config, stages, sink = fake_stages(tmp_path, ByPosition(), max_batch=2)
    guard = Guard(config, stages)
    real, step_ns = time.time_ns, 3600 * 10**9
    monkeypatch.setattr(time, "time_ns", lambda: real() + step_ns)  # NTP stepped the clock forward
    assert guard.run() == 0
    stamps = [event.wall_time for event in sink.events]
    assert stamps and all(abs(stamp - (real() + step_ns) / 1e9) < 60 for stamp in stamps), stamps


def test_people_that_cannot_be_reloaded_leave_the_gallery_as_it_is(tmp_path, caplog):
    """The people folder made unreadable while the guard ran (here: a file in its place): the
    reload after a web page's change stopped the guard."""
    import logging

    config, stages, _ = fake_stages(tmp_path, ByPosition(), max_batch=2)
    (tmp_path / "people").write_text("not a folder")
    with caplog.at_level(logging.ERROR, logger="tracker.stages"):
        stages.reload_people()
    assert stages.gallery.names == ("alice", "bob")
    assert "people: cannot reload them (people folder" in caplog.text and "goes on with the 2 it knows" in caplog.text
    stages.close()


def test_a_person_enrolled_beside_the_running_guard_is_taken_in(tmp_path):
    """The README says to run `tracker enroll` as the service's user against its state: the person's
    file was written, and the guard went on without them until it was restarted."""
    from tracker.crops import crop_definition
    from tracker.identity import save_person

    config, stages, _ = fake_stages(tmp_path, ByPosition(), max_batch=2)
    save_person(tmp_path, "carol", BOB[None], stages.embeddings_key, crop_definition(False))
    assert Guard(config, stages).run() == 0
    assert stages.gallery.names == ("carol",)  # the folder's people now (the test's alice and bob were in memory)


def test_a_person_of_another_embedding_width_does_not_stop_the_running_guard(tmp_path, caplog):
    """A person enrolled with another `model.embedding` blob under the same key: the guard's
    reload raised ValueError (the means' stack), which only TrackerError was caught for."""
    from tracker.crops import crop_definition
    from tracker.identity import save_person

    config, stages, _ = fake_stages(tmp_path, ByPosition(), max_batch=2)
    save_person(tmp_path, "carol", BOB[None], stages.embeddings_key, crop_definition(False))
    save_person(tmp_path, "wide", np.ones((1, 848)), stages.embeddings_key, crop_definition(False))
    stages.reload_people()
    assert stages.gallery.names == ("carol",) and "skipping wide: its mean is float32 of shape (848,)" in caplog.text
    stages.close()


def test_a_person_file_rewritten_in_place_is_taken_in(tmp_path):
    """`cp other.npz people/carol.npz` writes into the file there: the folder's time, the guard's
    only sign of a change, stayed as it was, and so did the guard's carol."""
    from tracker.crops import crop_definition
    from tracker.identity import save_person

    config, stages, _ = fake_stages(tmp_path, ByPosition(), max_batch=2)
    people = tmp_path / "people"
    save_person(tmp_path / "other", "carol", BOB[None], stages.embeddings_key, crop_definition(False),
                np.zeros((1, 1, 88, 88), np.float32))  # (with a kept face: another size)
    save_person(tmp_path, "carol", ALICE[None], stages.embeddings_key, crop_definition(False))
    stages.reload_people()
    folder_time = people.stat().st_mtime_ns
    with open(people / "carol.npz", "r+b") as file:  # as cp: the same file, truncated and written
        file.truncate()
        file.write((tmp_path / "other" / "people" / "carol.npz").read_bytes())
    assert people.stat().st_mtime_ns == folder_time
    stages.reload_people_if_changed()
    assert stages.gallery.names == ("carol",) and (stages.gallery.means == BOB).all()
    stages.close()


def test_a_person_file_caught_half_copied_is_taken_in_once_whole(tmp_path, caplog):
    """The guard's poll between cp's create and its write found the file unreadable, and never
    looked again: the folder's time did not move when the copy ended."""
    from tracker.crops import crop_definition
    from tracker.identity import save_person

    config, stages, _ = fake_stages(tmp_path, ByPosition(), max_batch=2)
    whole = save_person(tmp_path / "other", "carol", BOB[None], stages.embeddings_key,
                        crop_definition(False)).read_bytes()
    (tmp_path / "people").mkdir()
    with open(tmp_path / "people" / "carol.npz", "wb") as file:
        file.write(whole[: len(whole) // 2])
        file.flush()
        stages.reload_people_if_changed()  # the poll, mid-copy
        assert stages.gallery.names == () and "skipping" in caplog.text and "carol.npz: unreadable" in caplog.text
        file.write(whole[len(whole) // 2:])
    stages.reload_people_if_changed()
    assert stages.gallery.names == ("carol",)
    stages.close()
