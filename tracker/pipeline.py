"""The guard: the loop that drives the stages of docs/ARCHITECTURE.md, section 3 (built by
`tracker.stages.build_stages`), frame by frame, until stopped.

    source -> motion gate -> face detector -> crops -> batcher -> backend -> identity -> tracker
           -> events -> sinks, and one latency record per frame

Threads: capture runs on its own thread (tracker.sources.Capture, a bounded queue that drops the
oldest frame for live sources); everything else runs here, on the caller's thread, in frame order.
The loop waits for a frame at most until the batcher's deadline, so a lone face is inferred
`max_wait_ms` after its capture even when no further frame comes.

A static scene (the motion gate sees nothing move) skips detection and inference: the previous
frame's faces are carried over without new crops, so the tracker keeps still people alive instead
of declaring them gone (but a carried face confirms no new track: see `Tracker.update`). Frames
whose batch the backend failed on (a crashed worker) are still tracked, without identities, and
counted as dropped in the latency log.

A face travels as one record (`Face`: its detection, embedding and gallery match) from the
backend to the tracker. Only `tracker.cli` imports this module.
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
from tracker.backends.mirror import MirrorMean
from tracker.backends.worker import Stop
from tracker.batcher import Batch
from tracker.config import Config
from tracker.crops import crop_batch
from tracker.errors import BackendFailure
from tracker.identity import UNKNOWN
from tracker.interrupts import signals_handled
from tracker.latency import FrameLatency, RollingStats
from tracker.preflight import check_runnable
from tracker.sources import Capture
from tracker.stages import Stages, build_stages
from tracker.tracking import TrackState
from tracker.tracking.assign import box_rows, iou_matrix
from tracker.types import Detection, Frame
from tracker.web.live import TrackMark

log = logging.getLogger(__name__)

# Up to this long, READY waits for the first frame (so `systemctl start` returns with the guard
# seeing); then it is sent anyway: a camera absent at boot is retried as the guard runs, and the
# unit's start timeout must not kill and restart a guard for waiting on it.
READY_WITHOUT_FRAME_S = 30.0


@dataclass(frozen=True)
class _FrameWork:
    """A frame between detection and tracking. Times are monotonic ns / ms."""

    frame: Frame
    detections: tuple[Detection, ...]
    has_crops: bool  # False: detections carried from the previous frame (static scene)
    start_ns: int  # this frame's processing started: after it left the capture queue and a batch due then ran (both its wait, capture_ms)
    motion_ms: float
    detect_ms: float
    detected_ns: int  # its detection ended: from here its batch_wait_ms runs


@dataclass(frozen=True)
class Face:
    """One face of one frame on its way from the backend to the tracker."""

    detection: Detection
    embedding: np.ndarray | None = None  # (D,) float32 fc1; None: its crop was not inferred (see Guard)
    match: tuple[str, float] | None = None  # the gallery's (name or UNKNOWN, cosine) for the embedding


def wall_time_s(t_ns: int) -> float:
    """The wall-clock time (Unix seconds) of monotonic time `t_ns`, by the wall clock as it reads
    now: a Pi has no clock of its own and its clock steps when NTP answers, often after the guard
    started, so an offset taken once would stamp every later event by the clock it booted with."""
    return (time.time_ns() - time.monotonic_ns() + t_ns) / 1e9


def _ms(start_ns: int, end_ns: int) -> float:
    return (end_ns - start_ns) / 1e6


class TrackerClock:
    """The tracker's time in seconds, from readings of the frames' clock, never going backwards
    (`Tracker.update` needs it non-decreasing): a recording's own position restarts where segments
    were joined (`cat a.mpg b.mpg`: 1.96 s, then 0 again), and a track last seen at 100 s stayed
    dormant, its `left` held back and its face open to a stranger's, for the 110 s of video it took
    the restarted clock to pass its window. After a reading that goes back the clock goes on from
    where it was, `step_s` (a frame interval) later, and counts the readings from there."""

    def __init__(self, step_s: float):
        self._step_s = step_s
        self._offset_s = 0.0  # added to every reading: what the steps back took away
        self._last_s: float | None = None

    def seconds(self, reading_s: float) -> float:
        """The time of the frame read at `reading_s`; once per frame, in the frames' order."""
        t_s = reading_s + self._offset_s
        if self._last_s is not None and t_s < self._last_s:
            self._offset_s += self._last_s + self._step_s - t_s
            t_s = self._last_s + self._step_s
        self._last_s = t_s
        return t_s


class Guard:
    """One run of the guard over its `stages` (`tracker.stages.build_stages`; the guard closes them
    when its run ends). Call `run()` (blocking); `stop()` may come from any thread or a signal
    handler and makes `run()` return within about a second, after flushing."""

    def __init__(self, config: Config, stages: Stages):
        self.config = config
        self.stages = stages
        self._stop = threading.Event()
        self._capture = Capture(stages.source, config.source.queue_size, max_frames=config.source.frames)
        self.stats = RollingStats()
        self.identity_score = IdentityScore()
        self.frames_processed = 0
        self.inference_lost = 0  # frames whose crops a failed backend call lost
        self._batches_failed = 0  # batches the backend failed on since it last answered (see _infer)
        self.people_present = 0  # announced (confirmed) tracks not yet ended, after the last frame
        self._last_seq: int | None = None  # the last frame tracked: for the `left` events at the end
        self._last_media_s: float | None = None
        self._clock = TrackerClock(1.0 / config.source.fps)
        self._last_frame_ns = time.monotonic_ns()  # when the capture last gave a frame (see _source_gone)
        self._done_ns: deque[int] = deque(maxlen=100)  # processing end times, for fps
        self._failing_sinks: dict = {}  # (sink, method) -> calls failed in a row (see _to_every_sink)

    def stop(self) -> None:
        self._stop.set()
        self._capture.stop(wait=False)  # run() waits for it as it ends
        if self.stages.restarting is not None:  # a call waiting on a hung worker ends now, not at its deadline
            self.stages.restarting.interrupt()

    # -- the loop --------------------------------------------------------------------------------

    def run(self) -> int:
        """Process frames until the source ends or `stop()`; then flush, announce every `left`,
        and close the stages. Returns the exit code (0). An error that ends the run (a source that
        fails for good) still gets the flush and the `left` events first, then propagates."""
        cfg, stages = self.config, self.stages
        try:
            log.info("guard: %s, detector %s at %d px%s, backend %s (%s), people enrolled: %d, state in %s",
                     stages.source.description, stages.detector.name, cfg.detect.detect_width,
                     " (moving regions)" if cfg.detect.regions else "", cfg.backend.name, cfg.backend.precision,
                     len(stages.gallery.names), stages.state_dir)
            if self._stop.is_set():  # stopped while starting up
                return 0
            self._capture.start()
            try:
                self._loop()
            except BaseException:
                try:
                    self._finish()
                except Exception:  # the first error is the one to report
                    log.exception("guard: could not announce the end of the run after an error")
                raise
            self._finish()
            if (not self._stop.is_set() and self.frames_processed < cfg.tracking.min_hits
                    and self._capture.stats().captured != cfg.source.frames):  # (not a run the user cut short)
                # a single photo given as the source: nothing can be announced, and nothing said why
                log.warning("guard: the source ended after %d frame(s), fewer than the %d a face needs before it "
                            "is announced (tracking.min_hits); to see who is in photos: tracker identify PHOTOS",
                            self.frames_processed, cfg.tracking.min_hits)
            return 0
        finally:
            self._capture.stop()
            stages.close()

    def _loop(self) -> None:
        batcher = self.stages.batcher
        report_every_ns = int(self.config.latency.report_every_s * 1e9)
        next_report = next_state = time.monotonic_ns()
        ready_by_ns = next_report + int(READY_WITHOUT_FRAME_S * 1e9)
        previous: tuple[Detection, ...] = ()
        ready = False
        while not self._stop.is_set():
            daemon.watchdog()  # every turn of the loop: a loop stuck anywhere stops the pings
            if not ready and (self.frames_processed or time.monotonic_ns() >= ready_by_ns):
                # camera, backend and the first frame are up, or the guard waits on its camera; sent
                # again next turn if the notify socket's queue was full (systemd would time the start out)
                what = "" if self.frames_processed else "waiting for the first frame (retrying), "
                ready = daemon.ready(f"{what}{self.stages.source.description}, backend {self.config.backend.name}") \
                    or not daemon.under_systemd()
            deadline = batcher.deadline_ns()
            wait_s = 0.5 if deadline is None else max(0.0, (deadline - time.monotonic_ns()) / 1e9)
            frame: Frame | None | bool  # False: no frame came within wait_s
            try:
                frame = self._capture.get(timeout=wait_s)
            except TimeoutError:
                frame = False
            if frame is None:  # end of stream or stopped
                break
            # A run past its max_wait_ms goes before the next frame is worked on, also when frames
            # keep coming (a busy guard never times out waiting for one, so this is the only check).
            batch = batcher.due(time.monotonic_ns())
            if batch is not None:
                self._process(batch)
            if isinstance(frame, Frame):
                self._last_frame_ns = time.monotonic_ns()
                work = self._detect(frame, previous, time.monotonic_ns())
                previous = work.detections
                batch = batcher.add(work, crop_batch(frame.image, work.detections if work.has_crops else ()),
                                    frame.t_ns, frame.image.nbytes)
                if batch is not None:
                    self._process(batch)
            elif self._source_gone():
                log.warning("%s: no frame for %.0f s and failing: the people in view are not followed any more "
                            "(each gets its left; a face seen once it is back starts a new track)",
                            self.stages.source.description, (time.monotonic_ns() - self._last_frame_ns) / 1e9)
                self._end_every_track()
                previous = ()
            now = time.monotonic_ns()
            if now >= next_report:
                next_report = now + report_every_ns
                self._report()
            if now >= next_state:  # sinks rate-limit what they send; MQTT also reacts to presence at once
                next_state = now + _STATE_EVERY_NS
                self._publish_state()
                self.stages.reload_people_if_changed()  # a `tracker enroll` beside the guard
            web = self.stages.web
            if web is not None and web.jobs.run_next(self.stages.detector, self.stages.backend):
                self.stages.reload_people()  # the page enrolled or forgot someone: from the next frame on

    def _source_gone(self) -> bool:
        """The source failed since its last frame (a camera unplugged, a stream down) and nothing
        came for the re-identification window: past it no track could come back anyway, so the
        people in view must not stay "present" for the whole outage. A source that is only slow
        never fails, and keeps its tracks. The failures are those after the source's last frame,
        whenever the loop took that frame: a camera that failed while frames were still queued has
        failed since them."""
        return (self.stages.tracker.live_count > 0 and self._capture.stats().failures_since_frame > 0
                and time.monotonic_ns() - self._last_frame_ns >= self.config.tracking.reid_window_s * 1e9)

    def _end_every_track(self) -> None:
        """Nobody in view is followed any more (the run ends, or the source is gone): the
        batcher's last frames are tracked, every announced track gets its `left`, and every track
        ends with its votes and best face."""
        stages = self.stages
        batch = stages.batcher.flush()
        if batch is not None:
            self._process(batch)
        now_ns = time.monotonic_ns()
        events = stages.events.close_all(stages.votes, now_ns, wall_time_s(now_ns),
                                         seq=self._last_seq, media_s=self._last_media_s)
        self.identity_score.add(events, [])
        self._publish_events(events)
        for track_id in stages.tracker.end_all():
            stages.votes.forget(track_id)
            stages.snapshots.forget(track_id)
        self.people_present = 0  # the next state says so too

    def _finish(self) -> None:
        """The end of a run: every track ended (each announced one's `left`), the last report and
        state."""
        daemon.stopping()
        self._end_every_track()
        self._report()
        self._publish_state()
        if self.identity_score.announced:
            log.info("%s", self.identity_score.summary())

    def _detect(self, frame: Frame, previous: tuple[Detection, ...], start_ns: int) -> _FrameWork:
        motion = self.stages.gate.update(frame)
        after_motion = time.monotonic_ns()
        if motion.moving:
            regions = None
            if self.config.detect.regions:
                # Where something moved, plus where the faces were and the tracks are heading: a
                # person who stands still stops being "motion" but must keep being detected.
                regions = [*motion.regions, *(d.box for d in previous), *self.stages.tracker.predicted_boxes()]
            detections = tuple(self.stages.detector.detect(frame, regions))
            has_crops = True
        else:
            detections, has_crops = previous, False
        detected_ns = time.monotonic_ns()
        return _FrameWork(frame, detections, has_crops, start_ns, _ms(start_ns, after_motion),
                          _ms(after_motion, detected_ns), detected_ns)

    def _infer(self, crops: np.ndarray) -> np.ndarray:
        """Embeddings (M, D) float32 of the first M of crops (N, C, H, W), inferred in chunks of at
        most max_batch: M = N, or fewer if the backend failed on a chunk (the ones before it are
        kept; the caller counts the frames of the others). Each failure is logged, but not the
        batches lost while the backend waits for its restart (`InputsLost.waiting`: a line a frame
        for up to its 30 s back-off); the first batch it answers after failures says so."""
        step = self.config.batcher.max_batch
        parts: list[np.ndarray] = []
        try:
            for i in range(0, len(crops), step):
                parts.append(self.stages.backend.infer(crops[i:i + step]).embedding)
        except BackendFailure as err:
            self._batches_failed += 1
            if not getattr(err, "waiting", False):  # the backend's own count is of its inputs: the mirror doubles them
                mirror = " (each run with its mirror image)" if isinstance(self.stages.backend, MirrorMean) else ""
                log.error("backend %s failed on %d of a batch's %d faces%s: %s", self.config.backend.name,
                          len(crops) - sum(len(part) for part in parts), len(crops), mirror, err)
            return np.concatenate(parts) if parts else np.empty((0, self.stages.embedding_width), np.float32)
        if self._batches_failed:
            log.info("backend %s works again: the faces of %d batch(es) were lost meanwhile", self.config.backend.name,
                     self._batches_failed)
            self._batches_failed = 0
        return np.concatenate(parts)

    def _process(self, batch: Batch[_FrameWork]) -> None:
        """Infer a batch's crops, then track each of its frames, in order, with its faces. A frame
        with a crop the backend failed on is tracked without embeddings and counted as lost."""
        infer_start = time.monotonic_ns()
        embeddings = self._infer(batch.crops) if len(batch.crops) else None
        infer_ms = _ms(infer_start, time.monotonic_ns())
        per_frame = batch.split(embeddings) if embeddings is not None else [None] * len(batch.items)
        for work, count, rows in zip(batch.items, batch.counts, per_frame):
            if count and rows is None:
                self.inference_lost += 1
            if count and rows is not None:
                matches = self.stages.gallery.match(rows)
                faces = tuple(Face(d, e, m) for d, e, m in zip(work.detections, rows, matches))
            else:
                faces = tuple(Face(d) for d in work.detections)
            self._track_and_publish(work, faces, len(batch.crops) if count else 0, infer_start,
                                    infer_ms if count else 0.0)

    def _publish_events(self, events) -> None:
        """Each event with the snapshot of its track's best face, to every sink."""
        for event in events:
            path, jpeg = self.stages.snapshots.save(event.track_id, event.id)
            event = replace(event, snapshot=path)
            self._to_every_sink("publish_event", event, jpeg)

    def _to_every_sink(self, method: str, *args) -> None:
        """Call `method` of every sink: one that fails (stdout a closed pipe or a full disk) is
        logged at its first failure and when it works again, and the others still get the call, as
        the guard goes on; each sink keeps what it can (the MQTT outbox, the events log's count)."""
        for sink in self.stages.sinks:
            try:
                getattr(sink, method)(*args)
            except Exception as e:  # noqa: BLE001 - one output must not stop the guard or the others
                if (sink, method) not in self._failing_sinks:
                    log.error("%s sink: %s failed: %s (the other sinks go on; logged once until it works again)",
                              type(sink).__name__, method, e)
                self._failing_sinks[sink, method] = self._failing_sinks.get((sink, method), 0) + 1
            else:
                failed = self._failing_sinks.pop((sink, method), 0)
                if failed:
                    log.info("%s sink: %s works again after %d failed call(s)", type(sink).__name__, method, failed)

    def _tracker_time_s(self, frame: Frame) -> float:
        """The tracker's clock at `frame`, seconds: a recording's own position (media_s); for an
        offline source without one (a photo folder), its frame number at source.fps; else (a camera,
        a stream) its capture time. The re-identification window and a delayed `left` are spans of
        this clock, so an offline run must not read them off how fast this machine processed it:
        the same frames give the same tracks on any machine (6 s of still photos took 0.6 s here).
        Never backwards (`TrackerClock`)."""
        if frame.media_s is not None:
            reading_s = frame.media_s
        elif not self.stages.source.live:
            reading_s = frame.seq / self.config.source.fps
        else:
            reading_s = frame.t_ns / 1e9
        return self._clock.seconds(reading_s)

    def _track_and_publish(self, work: _FrameWork, faces: tuple[Face, ...], batch_size: int, infer_start_ns: int,
                           infer_ms: float) -> None:
        """Track one frame's `faces` (in `work.detections` order), publish its events and write
        its latency record; infer_start_ns: when its batch's backend call started (monotonic ns),
        infer_ms: what the call took (0.0 for a frame without crops in it)."""
        stages, frame = self.stages, work.frame
        track_start = time.monotonic_ns()
        t_s = self._tracker_time_s(frame)
        inferred = [f.embedding for f in faces if f.embedding is not None]
        embeddings = np.stack(inferred) if faces and len(inferred) == len(faces) else None
        views = stages.tracker.update(work.detections, embeddings, t_s=t_s, carried=not work.has_crops)
        self._last_seq, self._last_media_s = frame.seq, frame.media_s
        self.people_present = sum(1 for v in views if v.ever_confirmed and v.state is not TrackState.ENDED)
        for view in views:
            if view.rejoined is not None:
                log.info("track %d: its face is back (new track %d joins it; no new entered)", view.track_id,
                         view.rejoined)
                # the new track's faces before it was recognised are this person's too
                stages.votes.merge(view.track_id, view.rejoined)
                stages.snapshots.merge(view.track_id, view.rejoined)
            i = view.detection_index
            if i is None:
                continue
            match = faces[i].match
            if match is not None:
                stages.votes.add(view.track_id, match[0])
            if work.has_crops:
                stages.snapshots.offer(view.track_id, frame.image, faces[i].detection.box)
        if stages.web is not None and stages.web.live.wants_frame(frame.t_ns):
            stages.web.live.offer(frame.image, self._marks(views), frame.t_ns)
        events = stages.events.frame_events(views, stages.votes, frame.t_ns, wall_time_s(frame.t_ns), seq=frame.seq,
                                            media_s=frame.media_s)
        truth = getattr(stages.source, "ground_truth", None)  # the synthetic scene knows who is who
        if truth is not None:
            self.identity_score.add(events, truth(frame.seq))
        publish_start = time.monotonic_ns()
        self._publish_events(events)
        for view in views:
            # Every track that ends, announced or not (a tentative one that died also voted and
            # offered faces), takes its votes and best face with it: no state outlives its track.
            if view.state is TrackState.ENDED:
                stages.votes.forget(view.track_id)
                stages.snapshots.forget(view.track_id)
        end = time.monotonic_ns()
        self.frames_processed += 1
        self._done_ns.append(end)
        record = FrameLatency(
            seq=frame.seq, t_ns=frame.t_ns, backend=self.config.backend.name, batch=batch_size,
            faces=len(work.detections), capture_ms=_ms(frame.t_ns, work.start_ns), motion_ms=work.motion_ms,
            detect_ms=work.detect_ms, batch_wait_ms=_ms(work.detected_ns, infer_start_ns), infer_ms=infer_ms,
            track_ms=_ms(track_start, publish_start), publish_ms=_ms(publish_start, end), total_ms=_ms(frame.t_ns, end),
            dropped=self._capture.dropped + self.inference_lost)
        stages.latency_log.write(record)
        self.stats.add(record)

    def _marks(self, views) -> tuple[TrackMark, ...]:
        """The tracks the live view draws: those in view (tentative or confirmed), with the identity
        voted so far."""
        return tuple(TrackMark(v.track_id, v.box, *self.stages.votes.voted(v.track_id), v.state is TrackState.CONFIRMED)
                     for v in views if v.state in (TrackState.TENTATIVE, TrackState.CONFIRMED))

    # -- reporting -------------------------------------------------------------------------------

    def fps(self) -> float:
        """Frames per second over the last 100 frames processed within the window of now (FPS_WINDOW_NS,
        or three frame intervals of a slower source): 0 once frames stop (a camera unplugged must
        not show its last rate in the STATUS and the state)."""
        since = time.monotonic_ns() - max(FPS_WINDOW_NS, int(3e9 / self.config.source.fps))
        recent = [t for t in self._done_ns if t >= since]
        if len(recent) < 2:
            return 0.0
        return (len(recent) - 1) / ((recent[-1] - recent[0]) / 1e9)

    def state(self) -> dict:
        """The guard's state for the MQTT state topic (sinks add their own counters)."""
        return {
            "fps": round(self.fps(), 2),
            "latency_ms": self.stats.percentiles(),
            "tracks": self.people_present,
            "frames": self.frames_processed,
            "frames_dropped": self._capture.dropped + self.inference_lost,
            "backend_restarts": self.stages.restarting.restarts if self.stages.restarting is not None else 0,
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
        self._to_every_sink("publish_state", self.state())


FPS_WINDOW_NS = 10_000_000_000  # the rate is of the frames processed in the last 10 s at least
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


def run_guard(config: Config, *, config_path: Path | None = None, source_spec: str | None = None,
              enroll_scene_people: bool = False) -> int:
    """Run the guard on `config` (the command line's overrides already applied, see `tracker.cli`;
    `config_path`: the file it was read from, which no file the guard writes may be) until the
    source ends or a SIGTERM, SIGINT or SIGHUP arrives; returns the exit code. A signal while the
    stages are being built stops the run as soon as they are (a backend converting its model can
    take a while), or at once while they wait for a backend worker's start-up (seconds on a Pi 3,
    past the unit's stop timeout)."""
    check_runnable(config, config_path)
    stopping = Stop()  # raised by the handler; also ends a wait for a backend worker's start-up
    guard: Guard | None = None

    def stop(_signum, _frame) -> None:
        stopping.requested = True
        if guard is not None:
            guard.stop()

    # SIGHUP is a closed terminal: the same clean stop (flush, `left` events), unless ignored (nohup)
    with signals_handled((signal.SIGTERM, signal.SIGINT, signal.SIGHUP), stop):
        try:
            stages = build_stages(config, source_spec=source_spec, realtime=config.source.realtime,
                                  enroll_scene_people=enroll_scene_people, stop=stopping)
        except BackendFailure as err:
            if not stopping.requested:
                raise
            log.info("guard: stopped while starting (%s)", err)
            return 0
        guard = Guard(config, stages)
        if stopping.requested:
            guard.stop()
        return guard.run()
