"""The guard: every stage of docs/ARCHITECTURE.md, section 3, wired together and run until stopped.

    source -> motion gate -> face detector -> crops -> batcher -> backend -> identity -> tracker
           -> events -> sinks, and one latency record per frame

Threads: capture runs on its own thread (tracker.sources.Capture, a bounded queue that drops the
oldest frame for live sources); everything else runs here, on the caller's thread, in frame order.
The loop waits for a frame at most until the batcher's deadline, so a lone face is inferred
`max_wait_ms` after its capture even when no further frame comes.

A static scene (the motion gate sees nothing move) skips detection and inference: the previous
frame's faces are carried over without new crops, so the tracker keeps still people alive instead
of declaring them gone. Frames whose batch the backend failed on (a crashed worker) are still
tracked, without identities, and counted as dropped in the latency log.

Only `tracker.cli` imports this module; this is the only module that knows every stage.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from tracker import daemon
from tracker.backends import create_backend
from tracker.batcher import Batch, Batcher
from tracker.config import Config, parse_config
from tracker.crops import CROP_SIZE, crop_batch, crop_definition
from tracker.detect import create_detector
from tracker.enroll import enroll, refresh
from tracker.errors import BackendFailure
from tracker.events import EventMaker
from tracker.identity import UNKNOWN, Gallery, IdentityVotes, file_sha256, identity_threshold, weights_card
from tracker.latency import FrameLatency, LatencyLog, RollingStats
from tracker.model.spec import ModelSpec
from tracker.motion import MotionGate
from tracker.preflight import check_runnable, prepare_state_dir
from tracker.sinks.console import ConsoleSink
from tracker.sinks.jsonl import JsonlSink
from tracker.snapshots import SnapshotStore
from tracker.sources import Capture, make_source
from tracker.tracking import Tracker, TrackState
from tracker.tracking.assign import box_rows, iou_matrix
from tracker.types import Detection, Frame

log = logging.getLogger(__name__)

DEMO_FRAMES = 400  # 40 s of the synthetic scene at its default 10 fps: two people cross, one waits


@dataclass(frozen=True)
class _FrameWork:
    """A frame between detection and tracking. Times are monotonic ns / ms."""

    frame: Frame
    detections: tuple[Detection, ...]
    has_crops: bool  # False: detections carried from the previous frame (static scene)
    start_ns: int  # processing started (frame left the capture queue)
    motion_ms: float
    detect_ms: float


def _ms(start_ns: int, end_ns: int) -> float:
    return (end_ns - start_ns) / 1e6


def reid_threshold(config: Config, card: dict | None) -> float | None:
    """The face similarity at which the tracker takes a new track for a lost one back (None: off):
    `tracking.reid_threshold` if set, else the one the weights' card was calibrated with (0.1%
    false accepts between different people: a false merge would swallow a stranger's `entered`).
    Weights without one (untrained, e.g. the seeded random ones of tests) give embeddings on
    which any two faces look alike, so re-identification stays off for them, and the log says so."""
    if not config.tracking.reid:
        return None
    if config.tracking.reid_threshold is not None:
        return float(config.tracking.reid_threshold)
    if card is None or card.get("reid_threshold") is None:
        log.warning("tracking: re-identification by face is off: weights %s have no card with a calibrated "
                    "threshold (untrained?); set tracking.reid_threshold to force it", config.model.weights)
        return None
    return float(card["reid_threshold"])


def effective_config(config: Config, args) -> Config:
    """The config with the command line's overrides (--backend, --precision, --frames, --demo)
    applied and validated like the file. --demo: the synthetic scene paced at its fps, DEMO_FRAMES
    long unless --frames says otherwise, state in `<state_dir>/demo` so that the demo's enrolments
    never mix with real ones. (--source is parsed by `make_source`.)"""
    data = config.model_dump()
    if args.backend:
        data["backend"]["name"] = args.backend
    if args.precision:
        data["backend"]["precision"] = args.precision
    if args.demo:
        data["source"].update(kind="synthetic", uri="", frames=args.frames or DEMO_FRAMES)
        data["state_dir"] = config.resolved_state_dir() / "demo"
    elif args.frames:
        data["source"]["frames"] = args.frames
    return parse_config(data, "command line")


class Guard:
    """One run of the guard. Build it, call `run()` (blocking); `stop()` may come from any thread
    or a signal handler and makes `run()` return within about a second, after flushing."""

    def __init__(self, config: Config, *, source_spec: str | None = None, realtime: bool = True,
                 enroll_scene_people: bool = False):
        self.config = config
        self._enroll_scene_people = enroll_scene_people
        self._source_spec = source_spec
        self._realtime = realtime
        self._stop = threading.Event()
        self._capture: Capture | None = None
        self.frames_processed = 0
        self.inference_lost = 0  # frames whose crops a failed backend call lost
        self.people_present = 0  # announced (confirmed) tracks not yet ended, after the last frame
        self._last_seq: int | None = None  # the last frame tracked: for the `left` events at the end
        self._last_media_s: float | None = None
        self._done_ns: deque[int] = deque(maxlen=100)  # processing end times, for fps

    def stop(self) -> None:
        self._stop.set()
        if self._capture is not None:
            self._capture.stop()

    # -- set-up ----------------------------------------------------------------------------------

    def _open_sinks(self, state_dir: Path) -> list:
        cfg = self.config
        sinks: list = []
        if cfg.sinks.console:
            sinks.append(ConsoleSink())
        sinks.append(JsonlSink(cfg.sinks.jsonl or state_dir / "events.jsonl"))
        if cfg.mqtt.enabled:
            from tracker.sinks.mqtt import MqttSink

            sinks.append(MqttSink(cfg.mqtt, cfg.device, state_dir))
        return sinks

    def _open_backend(self):
        """The configured backend, restarted with back-off whenever it fails (a worker that died)."""
        from tracker.backends.worker import RestartingBackend

        cfg = self.config
        model = ModelSpec(cfg.model.prototxt, cfg.model.weights, cfg.model.probs, cfg.model.embedding)
        return RestartingBackend(lambda: create_backend(
            cfg.backend.name, model, precision=cfg.backend.precision, threads=cfg.backend.threads,
            worker=cfg.backend.worker))

    def _enroll_demo_people(self) -> None:
        """The demo knows the synthetic scene's people: enroll each from face chips the scene does
        not show (tracker.sources.synthetic.enrolment_chips)."""
        from tracker.sources.synthetic import enrolment_chips

        for name, files in enrolment_chips(self.config.source.faces_dir).items():
            enroll(name, files, self.config, aligned=True, backend=self.backend, detector=self.detector,
                   report=log.warning)

    # -- the loop --------------------------------------------------------------------------------

    @property
    def _running(self) -> Capture:
        """The capture thread, which exists only while `run()` runs the loop."""
        assert self._capture is not None, "the capture is used only inside run()"
        return self._capture

    def run(self) -> int:
        cfg = self.config
        state_dir = prepare_state_dir(cfg.resolved_state_dir())
        closers: list = []
        try:
            self.backend = self._open_backend()
            closers.append(self.backend.close)
            self.sinks = self._open_sinks(state_dir)
            closers.extend(s.close for s in self.sinks)
            self.latency_log = LatencyLog(cfg.latency.path or state_dir / "latency.jsonl",
                                          cfg.latency.max_bytes, cfg.latency.backups)
            closers.append(self.latency_log.close)
            self.stats = RollingStats()
            self.gate = MotionGate.from_config(cfg.motion)
            self.detector = create_detector(cfg.detect)
            self.batcher: Batcher[_FrameWork] = Batcher(cfg.batcher.max_batch, cfg.batcher.max_wait_ms)
            if self._enroll_scene_people:
                self._enroll_demo_people()
            refresh(cfg, self.detector, self.backend, report=log.info)  # new weights: recompute the people
            card = weights_card(cfg)
            threshold = identity_threshold(cfg, card)
            crop = crop_definition(self.detector.gives_landmarks)
            trained_on = (card or {}).get("crop")
            if trained_on not in (None, crop):
                log.warning("identity: the weights were trained on %s crops but detector %s gives %s crops: "
                            "identities will be less reliable (use a detector with landmarks)", trained_on,
                            self.detector.name, crop)
            self.gallery = Gallery.load(state_dir, file_sha256(cfg.model.weights), threshold, crop)
            self.tracker = Tracker.from_config(cfg.tracking, reid_threshold=reid_threshold(cfg, card))
            self.votes = IdentityVotes(cfg.identity.min_faces, cfg.identity.margin)
            self.events = EventMaker()
            self.identity_score = IdentityScore()
            self.snapshots = SnapshotStore(state_dir / "snapshots")
            # One offset turns monotonic frame times into wall-clock times for the outside world.
            self._wall_offset_ns = time.time_ns() - time.monotonic_ns()
            source = make_source(cfg.source, spec=self._source_spec, realtime=self._realtime,
                                 luma_width=cfg.detect.detect_width)
            log.info("guard: %s, detector %s at %d px%s, backend %s (%s), %d people enrolled, state in %s",
                     source.description, self.detector.name, cfg.detect.detect_width,
                     " (moving regions)" if cfg.detect.regions else "", cfg.backend.name, cfg.backend.precision,
                     len(self.gallery.names), state_dir)
            self._capture = Capture(source, cfg.source.queue_size, max_frames=cfg.source.frames)
            closers.append(self._capture.stop)
            if self._stop.is_set():  # stopped while starting up
                return 0
            self._capture.start()
            self._loop()
            return 0
        finally:
            for close in reversed(closers):
                close()

    def _loop(self) -> None:
        report_every_ns = int(self.config.latency.report_every_s * 1e9)
        next_report = next_state = time.monotonic_ns()
        previous: tuple[Detection, ...] = ()
        ready = False
        while not self._stop.is_set():
            daemon.watchdog()  # every turn of the loop: a loop stuck anywhere stops the pings
            if not ready and self.frames_processed:
                ready = True  # camera, backend and the first frame are up
                daemon.ready(f"{self._running.source.description}, backend {self.config.backend.name}")
            deadline = self.batcher.deadline_ns()
            wait_s = 0.5 if deadline is None else max(0.0, (deadline - time.monotonic_ns()) / 1e9)
            frame: Frame | None | bool  # False: no frame came within wait_s
            try:
                frame = self._running.get(timeout=wait_s)
            except TimeoutError:
                frame = False
            if frame is None:  # end of stream or stopped
                break
            # A run past its max_wait_ms goes before the next frame is worked on, also when frames
            # keep coming (a busy guard never times out waiting for one, so this is the only check).
            batch = self.batcher.due(time.monotonic_ns())
            if batch is not None:
                self._process(batch)
            if isinstance(frame, Frame):
                work = self._detect(frame, previous, time.monotonic_ns())
                previous = work.detections
                crops = crop_batch(frame.image, work.detections) if work.has_crops else _NO_CROPS
                batch = self.batcher.add(work, crops, frame.t_ns)
                if batch is not None:
                    self._process(batch)
            now = time.monotonic_ns()
            if now >= next_report:
                next_report = now + report_every_ns
                self._report()
            if now >= next_state:  # sinks rate-limit what they send; MQTT also reacts to presence at once
                next_state = now + _STATE_EVERY_NS
                self._publish_state()
        daemon.stopping()
        batch = self.batcher.flush()
        if batch is not None:
            self._process(batch)
        # Nobody in view is followed any more: every announced track gets its `left`.
        now_ns = time.monotonic_ns()
        events = self.events.close_all(self.votes, now_ns, (now_ns + self._wall_offset_ns) / 1e9,
                                       seq=self._last_seq, media_s=self._last_media_s)
        self.identity_score.add(events, [])
        self._publish_events(events)
        self.people_present = 0  # the last state says so too
        self._report()
        self._publish_state()
        if self.identity_score.announced:
            log.info("%s", self.identity_score.summary())

    def _detect(self, frame: Frame, previous: tuple[Detection, ...], start_ns: int) -> _FrameWork:
        motion = self.gate.update(frame)
        after_motion = time.monotonic_ns()
        if motion.moving:
            regions = None
            if self.config.detect.regions:
                # Where something moved, plus where the faces were and the tracks are heading: a
                # person who stands still stops being "motion" but must keep being detected.
                regions = [*motion.regions, *(d.box for d in previous), *self.tracker.predicted_boxes()]
            detections = tuple(self.detector.detect(frame, regions))
            has_crops = True
        else:
            detections, has_crops = previous, False
        return _FrameWork(frame, detections, has_crops, start_ns, _ms(start_ns, after_motion),
                          _ms(after_motion, time.monotonic_ns()))

    def _infer(self, crops: np.ndarray) -> np.ndarray | None:
        """Embeddings (N, D) float32 for crops (N, 1, 88, 88), in chunks of at most max_batch;
        None if the backend failed (the failure is logged; the caller counts the frames)."""
        step = self.config.batcher.max_batch
        try:
            parts = [self.backend.infer(crops[i:i + step]).embedding for i in range(0, len(crops), step)]
        except BackendFailure as err:
            log.error("backend %s failed on a batch of %d faces: %s", self.config.backend.name, len(crops), err)
            return None
        return np.concatenate(parts)

    def _process(self, batch: Batch[_FrameWork]) -> None:
        infer_start = time.monotonic_ns()
        inferred = self._infer(batch.crops) if len(batch.crops) else np.empty((0, 0), np.float32)
        infer_ms = _ms(infer_start, time.monotonic_ns())
        lost = inferred is None
        if inferred is None:
            self.inference_lost += sum(1 for n in batch.counts if n)
            embeddings = np.full((len(batch.crops), 1), np.nan, np.float32)
        else:
            embeddings = inferred
        matches = self.gallery.match(embeddings) if len(embeddings) and not lost else []
        offset = 0
        for work, count, rows in zip(batch.items, batch.counts, batch.split(embeddings)):
            frame_matches, offset = matches[offset:offset + count], offset + count
            self._track_and_publish(work, rows if count and not lost else None, frame_matches,
                                    len(batch.crops) if count else 0, infer_ms if count else 0.0)

    def _publish_events(self, events) -> None:
        """Each event with the snapshot of its track's best face, to every sink."""
        for event in events:
            path, jpeg = self.snapshots.save(event.track_id, event.id)
            event = replace(event, snapshot=path)
            for sink in self.sinks:
                sink.publish_event(event, jpeg)

    def _track_and_publish(self, work: _FrameWork, embeddings: np.ndarray | None, matches, batch_size: int,
                           infer_ms: float) -> None:
        frame = work.frame
        track_start = time.monotonic_ns()
        # A recording's own clock, when it has one: a file processed faster than real time must not
        # squeeze the re-identification window.
        t_s = frame.media_s if frame.media_s is not None else frame.t_ns / 1e9
        views = self.tracker.update(work.detections, embeddings, t_s=t_s)
        self._last_seq, self._last_media_s = frame.seq, frame.media_s
        self.people_present = sum(1 for v in views if v.ever_confirmed and v.state is not TrackState.ENDED)
        for view in views:
            if view.rejoined is not None:
                log.info("track %d: its face is back (new track %d joins it; no new entered)", view.track_id,
                         view.rejoined)
            i = view.detection_index
            if i is None:
                continue
            if matches:
                self.votes.add(view.track_id, matches[i][0])
            if work.has_crops:
                self.snapshots.offer(view.track_id, frame.image, work.detections[i].box)
        wall_time = (frame.t_ns + self._wall_offset_ns) / 1e9
        events = self.events.frame_events(views, self.votes, frame.t_ns, wall_time, seq=frame.seq,
                                          media_s=frame.media_s)
        truth = getattr(self._running.source, "ground_truth", None)  # the synthetic scene knows who is who
        if truth is not None:
            self.identity_score.add(events, truth(frame.seq))
        publish_start = time.monotonic_ns()
        self._publish_events(events)
        for view in views:
            # Every track that ends, announced or not (a tentative one that died also voted and
            # offered faces), takes its votes and best face with it: no state outlives its track.
            if view.state is TrackState.ENDED:
                self.votes.forget(view.track_id)
                self.snapshots.forget(view.track_id)
        end = time.monotonic_ns()
        self.frames_processed += 1
        self._done_ns.append(end)
        record = FrameLatency(
            seq=frame.seq, t_ns=frame.t_ns, backend=self.config.backend.name, batch=batch_size,
            faces=len(work.detections), capture_ms=_ms(frame.t_ns, work.start_ns), motion_ms=work.motion_ms,
            detect_ms=work.detect_ms, infer_ms=infer_ms, track_ms=_ms(track_start, publish_start),
            publish_ms=_ms(publish_start, end), total_ms=_ms(frame.t_ns, end),
            dropped=self._running.dropped + self.inference_lost)
        self.latency_log.write(record)
        self.stats.add(record)

    # -- reporting -------------------------------------------------------------------------------

    def fps(self) -> float:
        if len(self._done_ns) < 2:
            return 0.0
        return (len(self._done_ns) - 1) / ((self._done_ns[-1] - self._done_ns[0]) / 1e9)

    def state(self) -> dict:
        """The guard's state for the MQTT state topic (sinks add their own counters)."""
        return {
            "fps": round(self.fps(), 2),
            "latency_ms": self.stats.percentiles(),
            "tracks": self.people_present,
            "frames": self.frames_processed,
            "frames_dropped": (self._capture.dropped if self._capture else 0) + self.inference_lost,
            "backend": self.config.backend.name,
            "precision": self.config.backend.precision,
        }

    def _report(self) -> None:
        p = self.stats.percentiles()
        if not p:
            return
        daemon.status(f"{self.fps():.1f} fps, {self.people_present} people, backend {self.config.backend.name}")
        stages = " ".join(f"{k[:-3]} {v['p50']:.1f}/{v['p95']:.1f}" for k, v in p.items())
        log.info("%.1f fps, %d frames, %d dropped; ms p50/p95: %s", self.fps(), self.frames_processed,
                 self.state()["frames_dropped"], stages)

    def _publish_state(self) -> None:
        state = self.state()
        for sink in self.sinks:
            sink.publish_state(state)


_NO_CROPS = np.empty((0, 1, CROP_SIZE, CROP_SIZE), np.float32)
_STATE_EVERY_NS = 1_000_000_000  # how often sinks get the state (the MQTT sink sends it at its own interval)


class IdentityScore:
    """The identities a run announced, against ground truth (the synthetic scene's faces). A track's
    truth is the true face of largest IoU (at least MIN_IOU) with its box when it `entered`; its
    verdict, when it leaves (or at the summary), compares the last identity announced for it:
    right, wrong, or unknown. Bounded: live tracks, counts and the first EXAMPLES verdicts."""

    MIN_IOU = 0.3
    EXAMPLES = 20

    def __init__(self) -> None:
        self.counts = {"right": 0, "wrong": 0, "unknown": 0}
        self.examples: list[str] = []
        self._tracks: dict[int, tuple[str, str]] = {}  # track id -> (truth, identity last announced)

    @property
    def announced(self) -> int:
        return sum(self.counts.values()) + len(self._tracks)

    def add(self, events, faces) -> None:
        """events: one frame's events; faces: that frame's ground truth (GroundTruth list)."""
        for event in events:
            if event.kind == "entered" and faces:
                overlap = iou_matrix(box_rows([event.box]), box_rows([f.box for f in faces]))[0]
                if overlap.max() >= self.MIN_IOU:
                    self._tracks[event.track_id] = (faces[int(overlap.argmax())].identity, event.identity)
            elif event.track_id in self._tracks:
                truth, _ = self._tracks[event.track_id]
                self._tracks[event.track_id] = (truth, event.identity)
                if event.kind == "left":
                    self._judge(event.track_id)

    def _judge(self, track_id: int) -> None:
        truth, said = self._tracks.pop(track_id)
        verdict = "unknown" if said == UNKNOWN else "right" if said == truth else "wrong"
        self.counts[verdict] += 1
        if len(self.examples) < self.EXAMPLES:
            self.examples.append(f"track {track_id} {truth}" + ("" if verdict == "right" else f" as {said}"))

    def summary(self) -> str:
        """One line: the counts and the first verdicts (tracks still open are judged now)."""
        for track_id in list(self._tracks):
            self._judge(track_id)
        c = self.counts
        return (f"identities against the scene's truth: {c['right']} right, {c['wrong']} wrong, {c['unknown']} "
                f"unknown (tracks: {'; '.join(self.examples)})")


def run_guard(config: Config, args) -> int:
    """`tracker` without --benchmark/--list-backends: run the guard until the source ends or a
    SIGTERM/SIGINT arrives; returns the exit code."""
    config = effective_config(config, args)
    check_runnable(config)
    guard = Guard(config, source_spec=args.source, realtime=config.source.realtime,
                  enroll_scene_people=args.demo)
    stop = lambda signum, _frame: guard.stop()  # noqa: E731
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return guard.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
