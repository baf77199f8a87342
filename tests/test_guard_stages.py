"""The guard's loop on stages of the test's own (`tracker.pipeline.Guard` takes any `Stages`): a
fake source, detector and backend around the real batcher, gallery, votes, tracker, events,
snapshots and latency log. What the loop itself does is checked here without a model or a camera:
every face's embedding reaches the gallery and the tracker with its own detection, one latency
record per frame, a failed backend call costs identities but never frames, per-track state is
released as tracks end and merged as they rejoin, and the stages are closed when the run ends.
The real stages run end to end in test_pipeline_e2e.py and test_scene_golden.py."""

from __future__ import annotations

import contextlib
import json
import logging
import time

import cv2
import numpy as np
import pytest

from tracker.backends.mirror import MirrorMean
from tracker.backends.worker import RestartingBackend, WorkerFailure
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
        self.events, self.snapshots, self.states, self.closed = [], [], [], False

    def publish_event(self, event, snapshot_jpeg):
        self.events.append(event)
        self.snapshots.append(snapshot_jpeg)

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


def test_a_failed_call_costs_only_the_frames_whose_crops_it_held(tmp_path, caplog):
    """A batch past max_batch goes to the backend in chunks; one that failed on its last chunk
    threw away the embeddings of the chunks before it, and counted their frames as lost."""

    class FailsOnEverySecondCall(ByPosition):
        def infer(self, x):
            if self.calls % 2 == 1:
                self.calls += 1
                raise BackendFailure("worker died")
            return super().infer(x)

    backend = FailsOnEverySecondCall()
    # two faces a frame: each batch is two frames' 4 crops, the first frame's 2 in the first chunk of 3
    config, stages, sink = fake_stages(tmp_path, backend, max_batch=3)
    guard = Guard(config, stages)
    caplog.set_level(logging.ERROR, logger="tracker.pipeline")
    assert guard.run() == 0
    said = {r.getMessage() for r in caplog.records if r.name == "tracker.pipeline"}
    assert said == {f"backend {config.backend.name} failed on 1 of a batch's 4 faces: worker died"}, said

    assert backend.calls == FRAMES  # two chunks a batch
    assert guard.frames_processed == FRAMES and guard.inference_lost == FRAMES // 2
    assert sorted(e.identity for e in sink.events if e.kind == "left") == ["alice", "bob"]  # from the first frames


def test_a_backend_waiting_for_its_restart_is_said_once_and_its_return_too(tmp_path, caplog):
    """A worker that died was logged again at every batch until its restart (a line per frame,
    up to 30 s of back-off: hundreds), and nothing said when it worked again."""
    class DiesOnItsThirdCall(ByPosition):
        def infer(self, x):
            if self.calls == 2:
                raise WorkerFailure("worker (pid 1): killed by signal 9", cause="killed by signal 9", lost_inputs=len(x))
            return super().infer(x)

    ticks = iter(range(10**6))  # the clock: a second at each reading, so the restart comes 5 batches on
    made = iter([DiesOnItsThirdCall(), ByPosition()])
    restarting = RestartingBackend(lambda: next(made), backoff_initial_s=5.0, clock=lambda: next(ticks))
    config, stages, sink = fake_stages(tmp_path, restarting, max_batch=2)
    guard = Guard(config, stages)
    caplog.set_level(logging.INFO, logger="tracker.pipeline")
    assert guard.run() == 0

    assert restarting.restarts == 1 and guard.inference_lost >= 3  # the failed batch, and those while it waited
    said = [r for r in caplog.records if r.name == "tracker.pipeline" and r.getMessage().startswith("backend ")]
    assert [r.levelname for r in said] == ["ERROR", "INFO"], [r.getMessage() for r in said]
    assert "killed by signal 9" in said[0].getMessage() and "works again" in said[1].getMessage()


def test_a_failure_under_the_mirror_counts_faces_and_says_why_the_inputs_are_twice_as_many(tmp_path, caplog):
    """The line read "a batch of 2 faces: ... 4 inputs lost", the backend counting each face's
    mirror image (tracker.backends.mirror) as an input of its own."""
    class DiesOnItsFirstCall(ByPosition):
        def infer(self, x):
            raise WorkerFailure("worker (pid 1): killed by signal 9", cause="killed by signal 9", lost_inputs=len(x))

    restarting = RestartingBackend(DiesOnItsFirstCall, backoff_initial_s=5.0, clock=lambda: 0.0)  # never restarted
    config, stages, sink = fake_stages(tmp_path, MirrorMean(restarting), max_batch=2)
    guard = Guard(config, stages)
    caplog.set_level(logging.ERROR, logger="tracker.pipeline")
    assert guard.run() == 0
    [said] = [r.getMessage() for r in caplog.records if r.name == "tracker.pipeline"]
    assert said.startswith(f"backend {config.backend.name} failed on 2 of a batch's 2 faces (each run with its mirror "
                           f"image): backend {restarting.name!r}: 4 inputs lost ("), said


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


# -- per-track state: released when a track ends, merged when one rejoins --------------------------

SHADES = {"alice": 40, "bob": 220, "carol": 90}  # each person's face is painted flat in their grey
CAROL = np.eye(4, dtype=np.float32)[2]  # enrolled nowhere: matches nobody
BIG, NORMAL = (20, 40, 150, 180), (20, 40, 100, 120)  # Alice's box close to the camera, and as usual


def walkers(seq: int) -> list[tuple[str, tuple[int, int, int, int]]]:
    """Who is in view at frame `seq` (10 fps), each with their box (x, y, w, h), in detection order.
    Alice: frames 0-9, hidden 10-13 (past max_age 2: her track goes dormant), back 14-29, close to the
    camera at first (14-15: the new track's faces, larger than any of her old track's). Bob: 0-4,
    then gone (his track ends at frame 13, when the 0.8 s re-identification window has passed).
    Carol: frame 20 only (a tentative track that ends the next frame)."""
    people = []
    if seq < 10 or seq >= 14:
        people.append(("alice", BIG if seq in (14, 15) else NORMAL))
    if seq < 5:
        people.append(("bob", (200, 40, 100, 120)))
    if seq == 20:
        people.append(("carol", (200, 40, 100, 120)))
    return people


class Walkers(SourceBase):
    description = "walkers"

    def read(self):
        if self._seq >= FRAMES:
            return None
        image = np.full((240, 320, 3), 128, np.uint8)
        for name, (x, y, w, h) in walkers(self._seq):
            image[y:y + h, x:x + w] = SHADES[name]
        return self._frame(image)


class ScriptedFaces:
    name, gives_landmarks = "scripted", False

    def detect(self, frame, regions=None):
        return [Detection(Box(*box), 0.9) for _, box in walkers(frame.seq)]


class ByShade:
    """A backend whose embedding says whose face a crop shows, by its centre's grey level."""

    name = "by-shade"

    def infer(self, x):
        people = [ALICE, BOB, CAROL]
        centre = x[:, 0, 34:54, 34:54].mean(axis=(1, 2)) * 255
        nearest = np.abs(centre[:, None] - np.array(list(SHADES.values()))[None]).argmin(axis=1)
        return Inference(np.full((len(x), 2), 0.5, np.float32), np.stack([people[i] for i in nearest]))

    def close(self):
        pass


class StateProbe:
    """Stands in for the latency log, which the guard writes last for each frame: records then which
    track ids each stage holds state for (white-box: their dicts by track id) and which are live."""

    def __init__(self, stages):
        self.stages, self.frames = stages, []

    def write(self, record):
        self.frames.append((record.seq, {t.track_id for t in self.stages.tracker._tracks}, held_state(self.stages),
                            {tid: sum(v.values()) for tid, v in self.stages.votes._votes.items()}))

    def close(self):
        pass


def held_state(stages) -> dict[str, set[int]]:
    events = stages.events
    return {"votes": set(stages.votes._votes), "snapshots": set(stages.snapshots._best),
            "events": set(events._last_seen) | set(events._announced)}


def test_a_track_s_state_goes_with_it_and_a_rejoined_track_takes_the_new_one_s(tmp_path):
    """Votes, best face and last box are held per live track only: a track that ends (announced
    or a tentative one that died) takes them with it, on its last frame, and at the end of the run
    nothing is held. A track that rejoins by face takes the new track's votes and best face."""
    config, stages, sink = fake_stages(tmp_path, ByShade(), max_batch=1)
    stages.source, stages.detector = Walkers(), ScriptedFaces()
    stages.tracker = Tracker(min_hits=3, max_age=2, reid_threshold=0.9, reid_window_s=0.8)
    stages.latency_log = probe = StateProbe(stages)
    assert Guard(config, stages).run() == 0

    kinds = [(e.kind, e.seq) for e in sink.events]
    assert kinds == [("entered", 2), ("entered", 2), ("left", 13), ("left", FRAMES - 1)], kinds
    alice, bob = (e.track_id for e in sink.events[:2])
    assert sink.events[2].track_id == bob and sink.events[3].track_id == alice  # one visit for Alice
    assert [seq for seq, *_ in probe.frames] == list(range(FRAMES))
    for seq, live, held, _ in probe.frames:
        assert all(ids <= live for ids in held.values()), (seq, live, held)
    assert probe.frames[12][1] >= {alice, bob}  # Bob's and Alice's tracks still held, dormant
    assert probe.frames[20][1] > probe.frames[21][1]  # Carol's track came and went
    # Alice's every face voted for her one track, those of the new track merged into it
    assert probe.frames[-1][3] == {alice: 26}
    # and her best face is the close one, seen while she was the new track (shrunk to the store's
    # 160 px; her old track's best was 144 px)
    left_face = cv2.imdecode(np.frombuffer(sink.snapshots[3], np.uint8), cv2.IMREAD_COLOR)
    assert left_face.shape[:2] == (160, 160)
    assert held_state(stages) == {"votes": set(), "snapshots": set(), "events": set()}  # after the run


class JoinedRecording(SourceBase):
    """A recording of two joined segments: its own clock runs 100.0, 100.1, ... 100.7 s (frames 0-7),
    then restarts at 0 (frame 8 on). Alice is in frames 0-4 only."""

    description = "joined recording"

    def read(self):
        if self._seq >= FRAMES:
            return None
        image = np.full((240, 320, 3), 128, np.uint8)
        people = [("alice", NORMAL)] if self._seq < 5 else []
        for name, (x, y, w, h) in people:
            image[y:y + h, x:x + w] = SHADES[name]
        media_s = 100.0 + 0.1 * self._seq if self._seq < 8 else 0.1 * (self._seq - 8)
        return self._frame(image, media_s=media_s)


class AliceFirstFrames:
    name, gives_landmarks = "alice-first", False

    def detect(self, frame, regions=None):
        return [Detection(Box(*NORMAL), 0.9)] if frame.seq < 5 else []


def test_a_recording_whose_clock_restarts_does_not_hold_a_track_back(tmp_path):
    """The tracker's clock was the recording's own, which went from 100.7 s back to 0: Alice, last
    seen at 100.4 s, stayed dormant until the run ended (the restarted clock never passed her
    0.8 s window), her `left` held back that long. Her `left` comes when 0.8 s of frames passed."""
    config, stages, sink = fake_stages(tmp_path, ByShade(), max_batch=1)
    stages.source, stages.detector = JoinedRecording(), AliceFirstFrames()
    stages.tracker = Tracker(min_hits=3, max_age=2, reid_threshold=0.9, reid_window_s=0.8)
    assert Guard(config, stages).run() == 0
    assert [(e.kind, e.seq, e.identity) for e in sink.events] == [("entered", 2, "alice"), ("left", 13, "alice")]
